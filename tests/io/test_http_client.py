"""The resumable HTTP transport against a loopback server with fault injection."""

from __future__ import annotations

import logging
import os

import pytest

from torchstore.errors import IntegrityError
from torchstore.io.remote.http import HttpClient, RemoteChangedError
from torchstore.io.remote.transfer import RemoteNotFoundError, TransferError

SIZE = 300_000


@pytest.fixture
def blob(file_server):
    data = os.urandom(SIZE)
    (file_server.root / "ds").mkdir()
    (file_server.root / "ds" / "blob.bin").write_bytes(data)
    return data


def test_download_whole_file(file_server, blob, tmp_path):
    got = []
    HttpClient(file_server.url).download(
        "ds/blob.bin", tmp_path / "p", size=SIZE, progress=got.append
    )
    assert (tmp_path / "p").read_bytes() == blob
    assert sum(got) == SIZE


def test_dropped_connection_resumes_with_range(file_server, blob, tmp_path):
    file_server.cut_after["ds/blob.bin"] = 100_000
    HttpClient(file_server.url, retries=2).download("ds/blob.bin", tmp_path / "p", size=SIZE)
    assert (tmp_path / "p").read_bytes() == blob
    ranges = [r["range"] for r in file_server.gets("ds/blob.bin")]
    assert ranges == [None, "bytes=100000-"]
    assert file_server.body_bytes["ds/blob.bin"] == SIZE  # not one byte sent twice


def test_partial_file_resumes_in_a_later_call(file_server, blob, tmp_path):
    file_server.cut_after["ds/blob.bin"] = 120_000
    client = HttpClient(file_server.url, retries=0)
    with pytest.raises(
        TransferError,
        match=r"connection closed with 180000 bytes to go \(gave up after 1 attempts\)",
    ):
        client.download("ds/blob.bin", tmp_path / "p", size=SIZE)
    assert (tmp_path / "p").stat().st_size == 120_000
    client.download("ds/blob.bin", tmp_path / "p", size=SIZE)
    assert (tmp_path / "p").read_bytes() == blob
    assert file_server.gets("ds/blob.bin")[-1]["range"] == "bytes=120000-"
    assert file_server.body_bytes["ds/blob.bin"] == SIZE


def test_larger_than_declared_is_refused(file_server, blob, tmp_path):
    with pytest.raises(
        IntegrityError,
        match=(
            r"/data/ds/blob.bin: the server has 300000 bytes, "
            r"larger than the 1000 bytes declared"
        ),
    ):
        HttpClient(file_server.url).download("ds/blob.bin", tmp_path / "p", size=1000)
    assert not (tmp_path / "p").exists()


def test_missing_file_is_not_found(file_server, tmp_path):
    with pytest.raises(RemoteNotFoundError, match="HTTP 404"):
        HttpClient(file_server.url).download("ds/none.bin", tmp_path / "p", size=3)
    assert HttpClient(file_server.url).read_bytes("index.json", limit=100) is None


def test_slow_server_times_out_clearly(file_server, blob, tmp_path):
    file_server.delay_s = 1.0
    client = HttpClient(file_server.url, timeout=0.2, retries=1)
    with pytest.raises(
        TransferError, match=r"timed out after 0.2 s with no answer \(gave up after 2 attempts\)"
    ):
        client.download("ds/blob.bin", tmp_path / "p", size=SIZE)


def test_read_bytes_limit(file_server, blob):
    with pytest.raises(TransferError, match="more than 10 bytes; refusing to read it"):
        HttpClient(file_server.url).read_bytes("ds/blob.bin", limit=10)


def test_conditional_write(file_server):
    client = HttpClient(file_server.url)
    client.write_bytes("index.json", b"{}", if_absent=True)
    data, etag = client.read_bytes("index.json", limit=100)
    with pytest.raises(RemoteChangedError, match="HTTP 412 .* changed since it was read"):
        client.write_bytes("index.json", b"[]", if_absent=True)
    client.write_bytes("index.json", b"[1]", if_match=etag)
    with pytest.raises(RemoteChangedError, match="changed since it was read"):
        client.write_bytes("index.json", b"[2]", if_match=etag)
    assert (file_server.root / "index.json").read_bytes() == b"[1]"


def test_upload_puts_the_file(file_server, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(70_000))
    sent = []
    HttpClient(file_server.url).upload(src, "ds/up/src.bin", progress=sent.append)
    assert (file_server.root / "ds" / "up" / "src.bin").read_bytes() == src.read_bytes()
    assert sum(sent) == 70_000


def test_token_is_sent_but_never_shown(file_server, blob, tmp_path, monkeypatch, caplog):
    secret = "tok-SECRET-1234567890"
    monkeypatch.setenv("TORCHSTORE_HTTP_TOKEN", secret)
    caplog.set_level(logging.DEBUG)
    client = HttpClient(file_server.url, retries=1)
    client.download("ds/blob.bin", tmp_path / "p", size=SIZE)
    assert file_server.requests[-1]["authorization"] == f"Bearer {secret}"
    with pytest.raises(RemoteNotFoundError) as err:
        client.download("ds/nothing", tmp_path / "q", size=1)
    file_server.delay_s = 0.5
    with pytest.raises(TransferError) as slow:
        HttpClient(file_server.url, timeout=0.1, retries=1).read_bytes("ds/blob.bin", limit=SIZE)
    for text in (str(err.value), repr(err.value), str(slow.value), repr(client), caplog.text):
        assert secret not in text
    assert "token=set" in repr(client)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base": "ftp://x/y"}, "must be http:// or https:// with a host"),
        ({"base": "http://h/x", "timeout": 0}, r"timeout \(0\) must be a number > 0 \(seconds\)"),
        ({"base": "http://h/x", "retries": -1}, r"retries \(-1\) must be an int >= 0"),
    ],
)
def test_client_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HttpClient(**kwargs)


def test_server_without_range_support_restarts_the_file(file_server, blob, tmp_path):
    file_server.cut_after["ds/blob.bin"] = 100_000
    file_server.ignore_range = True
    HttpClient(file_server.url, retries=1).download("ds/blob.bin", tmp_path / "p", size=SIZE)
    assert (tmp_path / "p").read_bytes() == blob
    assert file_server.body_bytes["ds/blob.bin"] == 100_000 + SIZE


def test_redirect_is_followed_without_the_token_to_another_origin(
    file_server, blob, tmp_path, monkeypatch
):
    from tests.fileserver import FileServer

    monkeypatch.setenv("TORCHSTORE_HTTP_TOKEN", "tok")
    with FileServer(tmp_path / "cdn", prefix="/cdn") as cdn:
        (cdn.root / "blob.bin").write_bytes(blob)
        file_server.redirect["ds/moved.bin"] = f"{cdn.url}/blob.bin"
        file_server.redirect["ds/same.bin"] = "/data/ds/blob.bin"
        client = HttpClient(file_server.url)
        client.download("ds/moved.bin", tmp_path / "p", size=SIZE)
        client.download("ds/same.bin", tmp_path / "q", size=SIZE)
    assert (tmp_path / "p").read_bytes() == blob == (tmp_path / "q").read_bytes()
    assert cdn.requests[-1]["authorization"] is None  # the token never leaves its origin
    assert file_server.gets("ds/blob.bin")[-1]["authorization"] == "Bearer tok"


def test_redirect_errors(file_server, tmp_path):
    file_server.redirect["ds/nowhere"] = ""
    file_server.redirect["ds/loop"] = "/data/ds/loop"
    with pytest.raises(TransferError, match="redirect without a Location"):
        HttpClient(file_server.url).download("ds/nowhere", tmp_path / "p", size=1)
    with pytest.raises(TransferError, match="more than 5 redirects"):
        HttpClient(file_server.url).download("ds/loop", tmp_path / "p", size=1)


def test_status_errors(file_server, blob, tmp_path):
    file_server.status_for["ds/blob.bin"] = [503, 500]
    HttpClient(file_server.url, retries=2).download(
        "ds/blob.bin", tmp_path / "p", size=SIZE
    )  # 5xx retried
    assert (tmp_path / "p").read_bytes() == blob
    file_server.status_for["ds/blob.bin"] = [403]
    with pytest.raises(
        TransferError, match="HTTP 403 .*; set TORCHSTORE_HTTP_TOKEN to a token with access"
    ):
        HttpClient(file_server.url).download("ds/blob.bin", tmp_path / "q", size=SIZE)
    file_server.status_for["ds/blob.bin"] = [418]
    with pytest.raises(TransferError, match="HTTP 418"):
        HttpClient(file_server.url).read_bytes("ds/blob.bin", limit=SIZE)
    file_server.status_for["ds/blob.bin"] = [503, 503]
    with pytest.raises(TransferError, match=r"HTTP 503 .*\(gave up after 2 attempts\)"):
        HttpClient(file_server.url, retries=1).download("ds/blob.bin", tmp_path / "r", size=SIZE)


def test_a_zero_byte_file_downloads_to_an_empty_file(file_server, tmp_path):
    (file_server.root / "ds").mkdir()
    (file_server.root / "ds" / "empty").write_bytes(b"")
    HttpClient(file_server.url).download("ds/empty", tmp_path / "p", size=0)
    assert (tmp_path / "p").read_bytes() == b""


def test_the_deadline_stops_a_dripping_body_and_keeps_what_arrived(file_server, blob, tmp_path):
    import time

    from torchstore.io.remote.transfer import DeadlineError

    file_server.drip_s["ds/blob.bin"] = 0.02  # each byte well inside the 5 s read timeout
    client = HttpClient(file_server.url, timeout=5.0, retries=3)
    client.deadline = time.monotonic() + 0.5
    with pytest.raises(DeadlineError, match="past the overall deadline"):
        client.download("ds/blob.bin", tmp_path / "p", size=SIZE)
    got = (tmp_path / "p").read_bytes()
    assert 0 < len(got) < SIZE and got == blob[: len(got)]
    assert len(file_server.gets("ds/blob.bin")) == 1  # a deadline is not retried
