"""RangedFile against a loopback server: verified byte ranges, retries, pins and secrets."""

from __future__ import annotations

import os
import threading

import pytest

from tests.forked import run_forked
from torchstore.errors import RemoteChangedError, RemoteNotFoundError, TransferError
from torchstore.io.remote import http
from torchstore.io.remote.ranged import RangedFile, coalesce, is_url, locate, open_url

SIZE = 200_000
PAGE, BLOCK = 4096, 32768


def _open(url: str, **kwargs) -> RangedFile:
    kwargs.setdefault("cache", False)
    return open_url(url, page_bytes=PAGE, block_bytes=BLOCK, timeout=2.0, **kwargs)


def _range_gets(server) -> list[str]:
    return [r["range"] for r in server.gets("obj.bin") if r["range"] != "bytes=0-0"]


def test_reads_seeks_and_ranges_match_the_object(served):
    server, url, data = served
    with _open(url) as f:
        assert f.size == SIZE and f.readable() and f.seekable()
        assert f.read(10) == data[:10] and f.tell() == 10
        f.seek(-100, os.SEEK_END)
        assert f.read() == data[-100:]
        f.seek(150_000)
        buf = bytearray(60_000)
        assert f.readinto(buf) == SIZE - 150_000 and bytes(buf[: SIZE - 150_000]) == data[150_000:]
        for a, z in [(0, 1), (4095, 4097), (1000, 120_000), (SIZE - 1, SIZE)]:
            assert f.pread(a, z) == data[a:z]
    # every request asked one closed range, and no byte beyond the object
    assert all(r.startswith("bytes=") and not r.endswith("-") for r in _range_gets(server))


def test_fetch_ranges_coalesces_adjacent_blocks_into_one_request(served):
    server, url, data = served
    with _open(url) as f:
        got = f.fetch_ranges([(70_000, 90_000), (0, 100), (100, 40_000), (190_000, SIZE)])
    assert got == [data[70_000:90_000], data[:100], data[100:40_000], data[190_000:]]
    # blocks 0-2 (0..98303) in one request, block 5 and 6 (163840..) in another
    assert sorted(_range_gets(server)) == ["bytes=0-98303", "bytes=163840-199999"]


def test_coalesce_merges_within_the_gap_and_caps_a_request():
    ranges = [(100, 200), (0, 50), (60, 90), (5000, 6000)]
    assert coalesce(ranges, max_gap=10) == [(0, 200), (5000, 6000)]
    assert coalesce([(0, 50), (61, 90)], max_gap=10) == [(0, 50), (61, 90)]
    assert coalesce([(0, 10), (10, 20), (20, 30)], max_gap=0, max_request=20) == [(0, 20), (20, 30)]
    assert coalesce([(5, 5)]) == []


def test_a_connection_dropped_mid_body_is_retried(served):
    server, url, data = served
    with _open(url) as f:
        server.cut_after["obj.bin"] = 1000
        assert f.pread(0, 100_000) == data[:100_000]
    assert len(_range_gets(server)) == 2


def test_503_then_ok_and_429_waits_its_retry_after(served, monkeypatch):
    server, url, data = served
    waits = []
    sleep, this = http.time.sleep, threading.current_thread()

    def counted(s: float) -> None:  # this thread's waits (the reads retry in it); others sleep
        if threading.current_thread() is this:
            waits.append(s)
        else:
            sleep(s)

    monkeypatch.setattr(http.time, "sleep", counted)
    with _open(url) as f:
        server.status_for["obj.bin"] = [503]
        assert f.pread(0, 10) == data[:10]
        server.retry_after = "3"
        server.status_for["obj.bin"] = [429]
        assert f.pread(100_000, 100_010) == data[100_000:100_010]
    assert waits[0] < 1 and waits[1] == 3.0  # backoff, then the server's Retry-After


def test_a_200_where_206_was_asked_is_one_clear_error_after_retries(served):
    server, url, _ = served
    f = _open(url, retries=2)
    server.ignore_range = True
    with pytest.raises(TransferError, match=r"obj\.bin bytes 0-4095: answered 200 .* 206") as e:
        f.pread(0, 10)
    assert "gave up after 3 attempts" in str(e.value)
    assert len(_range_gets(server)) == 3


def test_a_server_without_range_support_is_refused_at_open(served):
    server, url, _ = served
    server.ignore_range = True
    with pytest.raises(TransferError, match="answered 200 to a Range request"):
        _open(url)


@pytest.mark.parametrize("delta", [-7, 5])
def test_short_or_long_bodies_are_retried(served, delta):
    server, url, data = served
    with _open(url) as f:
        server.body_delta["obj.bin"] = delta
        assert f.pread(0, 10) == data[:10]
    assert len(_range_gets(server)) == 2


def test_a_persistently_short_body_names_the_url_range_and_problem(served):
    server, url, _ = served
    f = _open(url, retries=1)
    server.body_delta = _Always(-7)
    with pytest.raises(TransferError, match=r"obj\.bin bytes 8192-12287: declared a body of 4089"):
        f.pread(8192, 8200)


class _Always(dict):
    """A fault that stays: ``pop`` answers every path with the same value."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def __contains__(self, key) -> bool:
        return True

    def pop(self, key, *default):
        return self.value


def test_a_stalled_server_is_bounded_by_the_timeout(served):
    server, url, _ = served
    f = open_url(url, cache=False, page_bytes=PAGE, timeout=0.3, retries=0)
    server.drip_s["obj.bin"] = 0.2  # one byte each 0.2 s: inside the timeout, far too slow
    with pytest.raises(TransferError, match=r"bytes 0-4095: .*(before the time limit|stalled)"):
        f.pread(0, 10)


def test_an_object_changed_after_open_is_refused(served):
    server, url, data = served
    f = _open(url)
    assert f.pread(0, 10) == data[:10]
    (server.root / "obj.bin").write_bytes(os.urandom(SIZE))
    with pytest.raises(RemoteChangedError, match=r"obj\.bin changed since it was opened"):
        f.pread(100_000, 100_010)
    (server.root / "obj.bin").write_bytes(data[:-1000])  # shorter: the range is refused
    with pytest.raises(RemoteChangedError, match="changed since it was opened"):
        f.pread(SIZE - 10, SIZE)


def test_the_token_goes_to_the_origin_and_never_into_messages(served, monkeypatch):
    server, url, _ = served
    secret = "s3cr3t-token-value"
    monkeypatch.setenv("TORCHSTORE_HTTP_TOKEN", secret)
    f = _open(url, retries=1)
    assert server.requests[-1]["authorization"] == f"Bearer {secret}"
    server.status_for["obj.bin"] = [500, 500]
    with pytest.raises(TransferError) as e:
        f.pread(0, 10)
    server.status_for["obj.bin"] = [401]
    with pytest.raises(TransferError) as e2:
        f.pread(50_000, 50_010)
    user_url = url.replace("http://", f"http://user:{secret}@")
    with pytest.raises(RemoteNotFoundError) as e3:
        locate(user_url.replace("obj.bin", "missing.bin") + "?sig=" + secret, retries=0)
    for text in (str(e.value), str(e2.value), str(e3.value), repr(f), f.name):
        assert secret not in text


def test_is_url_and_bad_hub_urls():
    assert is_url("https://h/x.h5") and is_url("hf://datasets/a/b/x.h5")
    assert not is_url("/tmp/x.h5") and not is_url(b"http://x")
    with pytest.raises(ValueError, match="must be hf://datasets/NAMESPACE/NAME"):
        locate("hf://datasets/only-one")


def test_sequential_long_reads_fetch_ahead_in_few_requests(file_server):
    data = os.urandom(64 * BLOCK)
    (file_server.root / "obj.bin").write_bytes(data)
    url = f"{file_server.url}/obj.bin"
    with _open(url) as f:
        # two interleaved streams (two columns of a slab), each read one block at a time
        for i in range(32):
            for base in (0, 32):
                a = (base + i) * BLOCK
                assert f.pread(a, a + BLOCK) == data[a : a + BLOCK]
        # every block once, and at most one window fetched past where the first stream ends
        assert len(data) <= f.bytes_fetched <= len(data) + 8 * BLOCK
    assert len(_range_gets(file_server)) <= 16  # 64 blocks, in windows of up to 8


def test_requests_reuse_one_connection_until_one_fails(served):
    server, url, data = served
    with _open(url) as f:
        for a in range(0, 10 * PAGE, PAGE):
            assert f.pread(a, a + 10) == data[a : a + 10]
        server.cut_after["obj.bin"] = 100  # this connection drops; the retry opens another
        assert f.pread(20 * PAGE, 20 * PAGE + 10) == data[20 * PAGE : 20 * PAGE + 10]
        assert f.pread(30 * PAGE, 30 * PAGE + 10) == data[30 * PAGE : 30 * PAGE + 10]
    clients = [r["client"] for r in server.gets("obj.bin")]
    assert len(clients) == 14  # the probe, 10 pages, the dropped one and its retry, one more
    assert len(set(clients[:12])) == 1 and len(set(clients)) == 2


def _child_reads(f: RangedFile, data: bytes) -> None:
    assert f.pread(3 * BLOCK, 3 * BLOCK + 10) == data[3 * BLOCK : 3 * BLOCK + 10]
    got = f.fetch_ranges([(0, 10), (5 * BLOCK, 5 * BLOCK + 10)])  # through the thread pool
    assert got == [data[:10], data[5 * BLOCK : 5 * BLOCK + 10]]


def test_a_forked_child_reads_on_connections_and_threads_of_its_own(served):
    server, url, data = served
    with _open(url) as f:
        f.fetch_ranges([(0, 10), (5 * BLOCK, 5 * BLOCK + 10)])  # the parent's pool and sockets
        f._page.memory.clear(), f._block.memory.clear()
        assert run_forked(_child_reads, f, data, timeout=60) == ("ok", "")
        assert f.pread(0, 10) == data[:10]  # the parent's own connection still works
    clients = {r["client"] for r in server.gets("obj.bin")}
    assert len(clients) >= 3


def test_prefetch_fetches_in_the_background_what_a_later_read_finds(served, tmp_path):
    from torchstore.io.remote.chunk_cache import ChunkCache

    server, url, data = served
    with open_url(url, cache=ChunkCache(tmp_path / "c"), page_bytes=PAGE, block_bytes=BLOCK) as f:
        ranges = [(10, 20_000), (40_000, 70_000), (150_000, 151_000)]
        f.prefetch(ranges).result(timeout=30)
        before = len(_range_gets(server))
        assert before == 2  # blocks 0-2 in one request, block 4 in another
        assert f.fetch_ranges(ranges) == [data[a:z] for a, z in ranges]
        assert len(_range_gets(server)) == before
        server.status_for["obj.bin"] = [404] * 10
        f.prefetch([(180_000, 190_000)]).result(timeout=30)  # a failure is not raised here...
        with pytest.raises(RemoteNotFoundError):
            f.pread(180_000, 190_000)  # ...but by the read that needs the bytes
        with pytest.raises(ValueError, match="outside"):
            f.prefetch([(0, SIZE + 1)])
