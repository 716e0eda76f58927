"""Exact spans (RangedFile.fetch_spans): only the bytes asked for that no span fetched before
covers are fetched, and the cache's span entries serve later readers and other processes."""

from __future__ import annotations

import time

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


def test_gaps_a_few_bytes_apart_go_out_as_one_request_and_one_entry(served, tmp_path):
    # a window's block: its columns' chunks, dozens of bytes apart (checksum tables between)
    server, url, data = served
    cache = ChunkCache(tmp_path / "cache", budget="64MiB")
    with open_url(url, cache=cache) as f:
        asked = [(0, 100_000), (100_036, 200_000), (200_500, 300_000), (900_000, 950_000)]
        assert f.fetch_spans(asked) == [data[a:z] for a, z in asked]
        assert sorted(_ranges(server)) == [(0, 300_000), (900_000, 950_000)]
        assert len(list(f._spans.entries.folder.glob("*.blk"))) == 2


def test_a_read_inside_a_larger_span_that_overlaps_smaller_ones_fetches_nothing(served):
    server, url, data = served
    with open_url(url, cache=False) as f:
        f.fetch_spans([(100_000, 110_000), (150_000, 160_000)])
        f.fetch_spans([(50_000, 100_000), (110_000, 150_000), (160_000, 400_000)])
        n = len(server.gets("obj.bin"))
        # spans now overlap, and no single one starts where these reads do
        asked = [(105_000, 300_000), (155_000, 170_000), (60_000, 399_999)]
        assert f.fetch_spans(asked) == [data[a:z] for a, z in asked]
        assert f.pread(120_000, 380_000) == data[120_000:380_000]
        assert len(server.gets("obj.bin")) == n


def test_a_read_of_bytes_a_prefetch_has_in_flight_waits_for_it_instead_of_fetching(
    served, tmp_path
):
    server, url, data = served
    cache = ChunkCache(tmp_path / "cache", budget="64MiB")
    with open_url(url, cache=cache) as f:
        server.delay_s = 0.3
        ahead = f.prefetch_spans([(0, 1_000_000)])
        time.sleep(0.05)  # the prefetch's request is out, its answer not back
        assert f.fetch_spans([(200_000, 300_000), (500_000, 1_200_000)]) == [
            data[200_000:300_000],
            data[500_000:1_200_000],
        ]
        ahead.result()
        # the read fetched only what the prefetch did not cover
        assert sorted(_ranges(server)) == [(0, 1_000_000), (1_000_000, 1_200_000)]


def test_a_window_file_reads_long_ranges_exactly_with_no_read_ahead(served):
    server, url, data = served
    with open_url(url, cache=False) as f:
        f.exact_reads = True  # what a window reading it sets
        assert f.pread(1_000_123, 2_600_000) == data[1_000_123:2_600_000]
        assert _ranges(server) == [(1_000_123, 2_600_000)]
        assert f.pread(1_500_000, 1_600_000) == data[1_500_000:1_600_000]
        assert len(_ranges(server)) == 1
