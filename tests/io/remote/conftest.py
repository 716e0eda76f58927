"""Fixtures for range reads: the loopback file server and Hub of the remote tests, with their
isolated environment (Hub variables set before huggingface_hub is imported)."""

from __future__ import annotations

import os

import pytest

from tests.remote.conftest import _isolated_env, file_server, hub, hub_server  # noqa: F401


@pytest.fixture
def served(request, file_server):  # noqa: F811
    """``(server, url, data)``: random bytes (the test module's ``SIZE`` of them) served as
    ``obj.bin``."""
    data = os.urandom(request.module.SIZE)
    (file_server.root / "obj.bin").write_bytes(data)
    return file_server, f"{file_server.url}/obj.bin", data


# ----------------------------------------------------------------- S3 (moto)
class FaultProxy:
    """A loopback HTTP proxy in front of an S3 server that answers GETs with faults first:
    ``statuses`` (one a GET, a bare status), then ``cut_after`` bytes of the next ranged body
    (the connection dropped), ``bad_range`` (a wrong ``Content-Range`` once); ``gets`` lists
    the ``Range`` of each GET it saw."""

    def __init__(self, upstream: str):
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self.statuses: list[int] = []
        self.cut_after: int | None = None
        self.bad_range = False
        self.gets: list[str | None] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                proxy.gets.append(rng)
                if proxy.statuses:
                    self.send_response(proxy.statuses.pop(0))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=10)
                conn.request("GET", self.path, headers=dict(self.headers))
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() in ("transfer-encoding", "connection", "server", "date"):
                        continue
                    if name.lower() == "content-range" and rng and proxy.bad_range:
                        proxy.bad_range = False
                        value = value.replace("bytes ", "bytes 1", 1)
                    self.send_header(name, value)
                self.end_headers()
                if rng and proxy.cut_after is not None:
                    body, proxy.cut_after = body[: proxy.cut_after], None
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_MOTO = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print("%s:%s" % server.get_host_and_port(), flush=True)
sys.stdin.read()  # until the tests close it
server.stop()
"""


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory):
    """moto's S3 server on loopback, in a process of its own (in this one, its threads would
    share h5py's lock with the reads they answer), for the test module: the default endpoint
    (``AWS_ENDPOINT_URL``), test credentials, no ``~/.aws`` and no instance metadata. Yields
    ``(endpoint, boto3 client)``; ``POST endpoint/moto-api/reset-auth`` turns key checks on."""
    import subprocess
    import sys

    import boto3

    proc = subprocess.Popen(
        [sys.executable, "-c", _MOTO],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()  # the address, once it listens
        if not line:
            raise RuntimeError("moto's server did not start (is moto[server] installed?)")
        endpoint = f"http://{line}"
        nowhere = tmp_path_factory.mktemp("aws") / "none"
        with pytest.MonkeyPatch.context() as mp:
            for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
                mp.delenv(var, raising=False)
            mp.setenv("AWS_ACCESS_KEY_ID", "testing")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
            mp.setenv("AWS_REGION", "us-east-1")
            mp.setenv("AWS_CONFIG_FILE", str(nowhere))
            mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
            mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
            mp.setenv("AWS_ENDPOINT_URL", endpoint)
            yield endpoint, boto3.client("s3", endpoint_url=endpoint)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_faults(moto_s3, monkeypatch):
    """A :class:`FaultProxy` in front of ``moto_s3``, the default endpoint for one test."""
    proxy = FaultProxy(moto_s3[0])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    yield proxy
    proxy.close()
