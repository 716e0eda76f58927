"""The range cache: checksummed entries renamed into place, LRU under a budget, shared by
processes without a range fetched twice, and a torn or flipped entry refetched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchstore.errors import ArgumentError
from torchstore.io.remote.chunk_cache import ChunkCache, parse_size
from torchstore.io.remote.ranged import open_url

SIZE = 300_000
PAGE, BLOCK = 4096, 32768


def _open(url: str, cache: ChunkCache):
    return open_url(url, cache=cache, page_bytes=PAGE, block_bytes=BLOCK)


def _data_gets(server) -> list[str]:
    return [r["range"] for r in server.gets("obj.bin") if r["range"] != "bytes=0-0"]


def test_sizes_parse_and_bad_ones_are_refused():
    assert parse_size("50GiB") == 50 * 2**30 and parse_size("500MB") == 500 * 10**6
    assert parse_size(4096) == 4096 and parse_size("1_000") == 1000
    for bad in ("lots", 0, -5, True, "0B", 1.5):
        with pytest.raises(ArgumentError, match=r"cache budget .* must be a byte count >= 1"):
            ChunkCache(budget=bad)


def test_the_default_budget_is_a_tenth_of_the_disk(tmp_path):
    import shutil

    cache = ChunkCache(tmp_path / "c")
    free = shutil.disk_usage(tmp_path).free
    assert 0.09 * free <= cache.budget <= 0.11 * free
    assert cache.folder == tmp_path / "c"
    assert ChunkCache().folder == Path(os.environ["TORCHSTORE_CACHE"]) / "ranges"


def test_a_second_open_reads_the_cache_without_fetching(served, tmp_path):
    server, url, data = served
    cache = ChunkCache(tmp_path / "c", budget="1MiB")
    with _open(url, cache) as f:
        assert f.pread(1000, 250_000) == data[1000:250_000]
        assert f.pread(5, 9) == data[5:9]
    first = len(_data_gets(server))
    assert first >= 1
    with _open(url, ChunkCache(tmp_path / "c", budget="1MiB")) as f:
        assert f.pread(1000, 250_000) == data[1000:250_000]
        assert f.pread(5, 9) == data[5:9]
        assert f.bytes_fetched == 0 and sum(e.hits for e in f.cached) > 0
    assert len(_data_gets(server)) == first  # only the open's one-byte probe was sent again


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_entry_is_dropped_and_fetched_again(served, tmp_path, damage):
    server, url, data = served
    cache = ChunkCache(tmp_path / "c", budget="1MiB")
    with _open(url, cache) as f:
        assert f.pread(0, 100_000) == data[:100_000]
    entry = next(p for p in (tmp_path / "c").glob("*/1.blk") if p.stat().st_size > BLOCK)
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[123] ^= 0xFF
    else:
        raw = raw[: len(raw) // 2]  # a writer killed mid-write, had it not used a temp name
    entry.write_bytes(bytes(raw))
    before = len(_data_gets(server))
    with _open(url, ChunkCache(tmp_path / "c", budget="1MiB")) as f:
        assert f.pread(0, 100_000) == data[:100_000]
        assert sum(e.dropped for e in f.cached) == 1
    assert _data_gets(server)[before:] == [f"bytes={BLOCK}-{2 * BLOCK - 1}"]


def test_a_killed_writers_temp_file_is_never_read(served, tmp_path):
    server, url, data = served
    cache = ChunkCache(tmp_path / "c", budget="1MiB")
    f = _open(url, cache)
    blocks = f.cached[1]
    (blocks.folder / f".0.{os.getpid()}.1.tmp").write_bytes(b"\0" * 1000)  # left by a kill
    assert f.pread(0, 50_000) == data[:50_000]
    assert blocks.fetched == 2 and blocks.get(0) == data[:BLOCK]


def test_least_recently_used_entries_are_evicted_under_the_budget(served, tmp_path):
    server, url, data = served
    budget = 5 * (BLOCK + 16)
    cache = ChunkCache(tmp_path / "c", budget=budget)
    with _open(url, cache) as f:
        for i in range(9):  # blocks 0..8, one at a time; block 0 read again each time
            f.fetch_ranges([(i * BLOCK, (i + 1) * BLOCK)])
            f._block.memory.clear()
            assert f.fetch_ranges([(0, 10)]) == [data[:10]]
        assert cache.usage() <= budget
        names = {p.name for p in f.cached[1].folder.glob("*.blk")}
    assert "0.blk" in names  # the most recently used one stayed
    assert "1.blk" not in names and "2.blk" not in names


_WORKER = """
import sys
from torchstore.io.remote.chunk_cache import ChunkCache
from torchstore.io.remote.ranged import open_url
url, folder, go = sys.argv[1], sys.argv[2], sys.argv[3]
import os, time
while not os.path.exists(go):
    time.sleep(0.001)
f = open_url(url, cache=ChunkCache(folder, budget="10MiB"), block_bytes=32768)
f.fetch_ranges([(0, 300_000)])
print(f.bytes_fetched)
"""


def test_two_processes_sharing_a_cache_fetch_each_range_once(served, tmp_path):
    server, url, _ = served
    server.delay_s = 0.05  # long requests, so the two processes overlap
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(tmp_path / "c"), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    fetched = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    gets = _data_gets(server)
    assert len(gets) == len(set(gets))  # no range asked twice
    assert sum(fetched) == SIZE  # every byte fetched once, by one process or the other
