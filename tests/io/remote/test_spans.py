"""Exact spans (RangedFile.fetch_spans): only the bytes asked for that no span fetched before
covers are fetched, and the cache's span entries serve later readers and other processes."""

from __future__ import annotations

import pytest

from tests.forked import run_forked
from torchstore.io.remote.chunk_cache import ChunkCache
from torchstore.io.remote.ranged import open_url

SIZE = 3_000_000


def _ranges(server) -> list[tuple[int, int]]:
    out = []
    for r in server.gets("obj.bin"):
        if r["range"] and r["range"] != "bytes=0-0":
            a, z = r["range"][len("bytes=") :].split("-")
            out.append((int(a), int(z) + 1))
    return out


def test_spans_are_fetched_exactly_and_only_their_gaps_after(served):
    server, url, data = served
    with open_url(url, cache=False) as f:
        asked = [(10, 5_000), (1_100_000, 1_300_123), (2_999_000, SIZE)]
        assert f.fetch_spans(asked) == [data[a:z] for a, z in asked]
        assert sorted(_ranges(server)) == asked  # no byte past what was asked
        assert f.bytes_fetched == sum(z - a for a, z in asked)
        # a range over a held span and beyond it: only the gap goes out
        assert f.fetch_spans([(1_200_000, 1_400_000)]) == [data[1_200_000:1_400_000]]
        assert _ranges(server)[-1] == (1_300_123, 1_400_000)
        # h5py's reads inside held spans are served without a request
        n = len(server.gets("obj.bin"))
        assert (
            f.pread(20, 40) == data[20:40]
            and f.pread(1_150_000, 1_250_000) == data[1_150_000:1_250_000]
        )
        assert len(server.gets("obj.bin")) == n


def test_span_entries_serve_a_second_opening_and_a_forked_process(served, tmp_path):
    server, url, data = served
    cache = ChunkCache(tmp_path / "cache", budget="64MiB")
    with open_url(url, cache=cache) as f:
        f.prefetch_spans([(0, 70_000), (500_000, 900_000)]).result()
    n = len(server.gets("obj.bin"))
    with open_url(url, cache=cache) as f:  # a new file object: the entries, listed
        assert f.fetch_spans([(100, 60_000), (600_000, 900_000)]) == [
            data[100:60_000],
            data[600_000:900_000],
        ]
        assert len(server.gets("obj.bin")) == n + 1  # the open's one-byte probe only

    def child() -> None:
        with open_url(url, cache=cache) as g:
            assert g.fetch_spans([(0, 70_000)]) == [data[:70_000]]
            assert g.bytes_fetched == 0  # the open's probe is not a range fetched

    assert run_forked(child) == ("ok", "")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_or_evicted_span_entry_is_fetched_again(served, tmp_path, damage):
    server, url, data = served
    cache = ChunkCache(tmp_path / "cache", budget="64MiB")
    with open_url(url, cache=cache) as f:
        f.fetch_spans([(1000, 90_000)])
        entry = next(p for p in f._spans.entries.folder.glob("*.blk"))
    raw = entry.read_bytes()
    if damage == "flip":
        entry.write_bytes(raw[:10] + bytes([raw[10] ^ 1]) + raw[11:])
    elif damage == "truncate":
        entry.write_bytes(raw[:-5])
    else:
        entry.unlink()
    with open_url(url, cache=cache) as f:
        assert f.fetch_spans([(1000, 90_000)]) == [data[1000:90_000]]
        assert f.bytes_fetched == 89_000
