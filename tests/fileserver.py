"""A loopback HTTP file server for tests: Range, PUT, ETag/If-Match, fault injection, counters.

``Range: bytes=N-`` and ``Range: bytes=A-B`` (one range) are answered ``206`` with their
``Content-Range``.

Serves (and stores ``PUT`` bodies into) a root folder, bound to 127.0.0.1 on a free port.

Faults, all keyed by the URL path below the root (``"ds/data/a.bin"``):

- ``cut_after[path] = n``: the next GET of ``path`` sends headers for the whole body, then
  only ``n`` body bytes, then drops the connection (once per assignment);
- ``flip_byte[path] = i``: byte ``i`` of every body served for ``path`` is inverted;
- ``serve_instead[path] = bytes``: serve these bytes instead of the file;
- ``delay_s``: sleep this long before answering any request (a slow server, or a
  round-trip latency added to every request);
- ``rate_bytes_per_s``: send bodies no faster than this (a bandwidth cap; 0: no cap);
- ``body_delta[path] = d``: the next range answer of ``path`` sends ``d`` bytes more (or,
  negative, fewer) than asked, with a ``Content-Length`` that matches (once per assignment);
- ``retry_after``: a ``Retry-After`` value sent with every ``status_for`` answer;
- ``ignore_range``: answer every GET with the whole file (``200``), as servers without
  Range support do;
- ``status_for[path] = [code, ...]``: answer the next requests of ``path`` with these
  statuses, one per request;
- ``redirect[path] = url``: answer GET of ``path`` with ``302 Location: url`` (``""``: no
  Location header).
- ``drip_s[path] = s``: send the body of ``path`` one byte every ``s`` seconds (a server
  that stays just inside a client's read timeout); stops when the client hangs up.

``DELETE`` is refused (``405``, ``Allow: GET, HEAD, PUT``) unless ``allow_delete`` is set;
then it removes the file (``204``; ``404`` if there is none); ``status_for`` applies to it.

Counters: ``body_bytes[path]`` (body bytes actually sent), ``requests`` (one dict per
request: method, path, range, authorization, client address: one per connection), ``puts``
(paths written), ``deletes`` (paths removed).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.loopback import LoopbackServer


class FileServer(LoopbackServer):
    def __init__(self, root: Path, *, prefix: str = "/data"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix.rstrip("/")
        self.cut_after: dict[str, int] = {}
        self.flip_byte: dict[str, int] = {}
        self.serve_instead: dict[str, bytes] = {}
        self.delay_s = 0.0
        self.rate_bytes_per_s = 0
        self.body_delta: dict[str, int] = {}
        self.retry_after: str | None = None
        self.ignore_range = False
        self.status_for: dict[str, list[int]] = {}
        self.redirect: dict[str, str] = {}
        self.drip_s: dict[str, float] = {}
        self.body_bytes: dict[str, int] = defaultdict(int)
        self.requests: list[dict] = []
        self.puts: list[str] = []
        self.allow_delete = False
        self.deletes: list[str] = []
        self.lock = threading.Lock()
        self._kept: tuple[tuple | None, bytes] = (None, b"")  # the last file read
        self._serve(_make_handler(self))

    @property
    def url(self) -> str:
        return f"{self.origin}{self.prefix}"

    def gets(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and r["path"] == path]


@functools.lru_cache(maxsize=8)
@functools.lru_cache(maxsize=4)
def _etag_of(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


def _etag(data: bytes) -> str:
    """The ETag of ``data``: hashed once for the large bodies the file cache keeps (a
    100 MB store hashed at every range request cost 0.2 s of a core a request)."""
    if len(data) < 1 << 20:
        return '"' + hashlib.sha256(data).hexdigest() + '"'
    return _etag_of(data)


class _Handler(BaseHTTPRequestHandler):
    """Answers for one :class:`FileServer` (set as ``files`` on the subclass it makes)."""

    protocol_version = "HTTP/1.1"
    files: FileServer

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _rel(self) -> str | None:
        path = urlsplit(self.path).path
        prefix = self.files.prefix
        if not path.startswith(prefix + "/"):
            return None
        return "/".join(unquote(s) for s in path[len(prefix) + 1 :].split("/"))

    def _file(self, rel: str | None) -> Path | None:
        if rel is None:
            return None
        root = self.files.root
        target = (root / rel).resolve()
        if not str(target).startswith(str(root.resolve()) + os.sep):
            return None
        return target

    def _plain(self, status: int, text: str = "", headers: dict | None = None) -> None:
        body = text.encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _record(self, rel) -> None:
        files = self.files
        with files.lock:
            files.requests.append(
                {
                    "method": self.command,
                    "path": rel,
                    "range": self.headers.get("Range"),
                    "authorization": self.headers.get("Authorization"),
                    "client": self.client_address,
                }
            )
        if files.delay_s:
            time.sleep(files.delay_s)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        rel = self._rel()
        self._record(rel)
        if self._injected_answer(rel):
            return
        data = self._content(rel)
        if data is None:
            return self._plain(404, "not found")
        rng = self._range(len(data))
        if rng is not None and rng[0] >= len(data):
            return self._plain(416, "", {"Content-Range": f"bytes */{len(data)}"})
        body = data if rng is None else data[rng[0] : rng[1] + 1]
        if rng is not None and rel in self.files.body_delta:
            delta = self.files.body_delta.pop(rel)
            body = body[: len(body) + delta] if delta < 0 else body + b"\0" * delta
        self._send_headers(data, rng, len(body))
        if self.command == "GET":
            self._send_body(rel, body)

    def _injected_answer(self, rel: str | None) -> bool:
        """Answer with an injected status or redirect; False when there is none."""
        files = self.files
        if files.status_for.get(rel):
            extra = {"Retry-After": files.retry_after} if files.retry_after else {}
            self._plain(files.status_for[rel].pop(0), "injected", extra)
            return True
        if rel in files.redirect:
            location = files.redirect[rel]
            self._plain(302, "", {"Location": location} if location else {})
            return True
        return False

    def _content(self, rel: str | None) -> bytes | None:
        """The bytes served for ``rel`` (substituted or flipped as told), None if missing."""
        files = self.files
        file = self._file(rel)
        if rel in files.serve_instead:
            data = files.serve_instead[rel]
        elif file is not None and file.is_file():
            data = self._read(file)
        else:
            return None
        if rel in files.flip_byte and files.flip_byte[rel] < len(data):
            i = files.flip_byte[rel]
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
        return data

    def _read(self, file: Path) -> bytes:
        """The file's bytes, kept while its size and mtime stay (large stores are read and
        hashed once, not at every range request)."""
        st = file.stat()
        key = (str(file), st.st_size, st.st_mtime_ns)
        with self.files.lock:
            if self.files._kept[0] != key:
                self.files._kept = (key, file.read_bytes())
            return self.files._kept[1]

    def _range(self, size: int) -> tuple[int, int] | None:
        """``(first, last)`` byte of a ``Range: bytes=N-`` or ``bytes=A-B`` header (``last``
        clipped to the file); None without one (or when ranges are ignored)."""
        rng = self.headers.get("Range")
        if not rng or not rng.startswith("bytes=") or self.files.ignore_range:
            return None
        first, _, last = rng[6:].partition("-")
        return int(first), min(int(last), size - 1) if last else size - 1

    def _send_headers(self, data: bytes, rng: tuple[int, int] | None, length: int) -> None:
        """200 with the whole body, or 206 with the range ``rng``."""
        self.send_response(200 if rng is None else 206)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", _etag(data))
        if rng is not None:
            self.send_header("Content-Range", f"bytes {rng[0]}-{rng[1]}/{len(data)}")
        self.end_headers()

    def _send_body(self, rel: str | None, body: bytes) -> None:
        files = self.files
        cut = files.cut_after.pop(rel, None)
        if cut is not None and cut < len(body):
            self._send_cut(rel, body, cut)
        elif rel in files.drip_s:
            self._drip(rel, body, files.drip_s[rel])
        else:
            with files.lock:
                files.body_bytes[rel] += len(body)
            if files.rate_bytes_per_s:
                self._send_capped(body, files.rate_bytes_per_s)
            else:
                self.wfile.write(body)

    def _send_capped(self, body: bytes, rate: int) -> None:
        step = max(1, rate // 100)  # 10 ms of bytes at a time
        for at in range(0, len(body), step):
            self.wfile.write(body[at : at + step])
            time.sleep(min(step, len(body) - at) / rate)

    def _send_cut(self, rel: str | None, body: bytes, cut: int) -> None:
        with self.files.lock:  # counted before sending: the client may finish first
            self.files.body_bytes[rel] += cut
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)

    def _drip(self, rel: str | None, body: bytes, pause_s: float) -> None:
        for i in range(len(body)):
            time.sleep(pause_s)
            try:
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
            except OSError:  # the client gave up
                return
            with self.files.lock:
                self.files.body_bytes[rel] += 1

    def do_PUT(self) -> None:
        rel = self._rel()
        self._record(rel)
        length = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(length)
        file = self._file(rel)
        if file is None:
            return self._plain(403, "outside the root")
        with self.files.lock:
            current = file.read_bytes() if file.is_file() else None
            refusal = self._precondition_refusal(current)
            if refusal:
                return self._plain(412, refusal)
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_name(f".{file.name}.upload-{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, file)
            self.files.puts.append(rel)
        self._plain(201 if current is None else 200, "")

    def do_DELETE(self) -> None:
        rel = self._rel()
        self._record(rel)
        if self._injected_answer(rel):
            return
        if not self.files.allow_delete:
            return self._plain(405, "DELETE not allowed", {"Allow": "GET, HEAD, PUT"})
        file = self._file(rel)
        if file is None:
            return self._plain(403, "outside the root")
        with self.files.lock:
            if not file.is_file():
                return self._plain(404, "not found")
            file.unlink()
            self.files.deletes.append(rel)
        self._plain(204)

    def _precondition_refusal(self, current: bytes | None) -> str:
        """Why an If-Match / If-None-Match header refuses this PUT ("" when it does not)."""
        if_match = self.headers.get("If-Match")
        if if_match is not None and (current is None or _etag(current) != if_match):
            return "precondition failed"
        if self.headers.get("If-None-Match") == "*" and current is not None:
            return "exists"
        return ""


def _make_handler(server: FileServer) -> type[_Handler]:
    return type("Handler", (_Handler,), {"files": server})


@contextlib.contextmanager
def file_server_process(root: Path, *, delay_s: float = 0.0, rate_bytes_per_s: int = 0):
    """A :class:`FileServer` of ``root`` in a child process; yields its URL prefix.

    For benchmarks: a server in the timed process would take that process's interpreter
    lock for every body it sends, which a real remote server never does.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fileserver", str(root), str(delay_s), str(rate_bytes_per_s)],
        cwd=Path(__file__).resolve().parent.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the file server process did not start (it printed {line!r})")
        yield line
    finally:
        proc.stdin.close()  # the child serves until its stdin closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve_until_stdin_closes(root: str, delay_s: str, rate: str) -> None:
    with FileServer(Path(root)) as server:
        server.delay_s = float(delay_s)
        server.rate_bytes_per_s = int(rate)
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _serve_until_stdin_closes(*sys.argv[1:4])
