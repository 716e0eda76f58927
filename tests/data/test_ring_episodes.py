"""The ring's incremental episode index against a brute-force recomputation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.data.replay import ring_episodes
from torchstore.data.replay.ring_episodes import RingEpisodes, age_rows, segments_from_ends


def brute_segments(
    ends: list[bool], rows: int, cursor: int, capacity: int
) -> list[tuple[int, int]]:
    """``(start, length)`` per episode piece, oldest first, from physical end flags."""
    out: list[list[int]] = []
    piece = None
    for row in age_rows(rows, cursor, capacity).tolist():
        if piece is None:
            piece = [row, 0]
            out.append(piece)
        piece[1] += 1
        if ends[row]:
            piece = None
    return [tuple(p) for p in out]


class Simulated:
    """A per-row model of the ring: physical end flags and episode ids, one row at a time."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.ends = [False] * capacity
        self.ids = [-1] * capacity
        self.rows = self.cursor = self.next_id = 0
        self.open = False

    def write(self, flags: list[bool]) -> None:
        for flag in flags:
            if not self.open:
                self.current, self.next_id = self.next_id, self.next_id + 1
            self.ends[self.cursor] = flag
            self.ids[self.cursor] = self.current
            self.cursor = (self.cursor + 1) % self.capacity
            self.rows = min(self.rows + 1, self.capacity)
            self.open = not flag

    def segments(self) -> list[tuple[int, int, int]]:
        return [
            (start, length, self.ids[start])
            for start, length in brute_segments(self.ends, self.rows, self.cursor, self.capacity)
        ]


def as_list(index: RingEpisodes) -> list[tuple[int, int, int]]:
    return list(zip(*(t.tolist() for t in index.segments()), strict=True))


def check_invariants(index: RingEpisodes, sim: Simulated) -> None:
    start, length, ids = index.segments()
    assert int(length.sum()) == index.rows
    covered = (
        torch.cat(
            [
                (s + torch.arange(n)) % index.capacity
                for s, n in zip(start.tolist(), length.tolist(), strict=True)
            ]
        )
        if len(start)
        else torch.zeros(0, dtype=torch.int64)
    )
    assert torch.equal(covered, age_rows(index.rows, index.cursor, index.capacity))
    for s, n in zip(start.tolist(), length.tolist(), strict=True):
        rows = [(s + i) % index.capacity for i in range(n)]
        assert not any(sim.ends[r] for r in rows[:-1]), "a segment crosses an episode end"
        assert len({sim.ids[r] for r in rows}) == 1
    assert bool((ids[1:] > ids[:-1]).all())


def test_segments_from_ends():
    offsets, lengths = segments_from_ends(torch.tensor([False, True, False, False, True, False]))
    assert offsets.tolist() == [0, 2, 5] and lengths.tolist() == [2, 3, 1]
    offsets, lengths = segments_from_ends(torch.tensor([True, True]))
    assert offsets.tolist() == [0, 1] and lengths.tolist() == [1, 1]
    offsets, lengths = segments_from_ends(torch.zeros(0, dtype=torch.bool))
    assert offsets.numel() == 0 and lengths.numel() == 0


def test_open_episode_continues_across_writes():
    index = RingEpisodes(10)
    index.append(torch.tensor([False, False]))
    index.append(torch.tensor([False, True, False]))
    assert as_list(index) == [(0, 4, 0), (4, 1, 1)]
    assert index.is_open and index.next_episode_id == 2


def test_wrap_trims_the_oldest_episode_and_drops_overwritten_ones():
    index = RingEpisodes(4)
    index.append(torch.tensor([False, True, False]))  # ep0 = rows 0-1, ep1 = row 2 (open)
    index.append(torch.tensor([False, False]))  # ep1 grows to rows 2,3,0; row 0 overwritten
    assert as_list(index) == [(1, 1, 0), (2, 3, 1)]
    index.append(torch.tensor([True]))  # overwrites row 1: ep0 leaves the index
    assert as_list(index) == [(2, 4, 1)]
    assert index.cursor == 2 and index.rows == 4 and not index.is_open


def test_chunk_longer_than_the_ring_keeps_its_tail_and_counts_every_episode():
    index = RingEpisodes(3)
    index.append(torch.tensor([True, True, False, True, False]))
    # rows written 0..4 land on 0,1,2,0,1; the ring keeps the last 3: flags F(2) T(0) F(1)
    assert as_list(index) == [(2, 2, 2), (1, 1, 3)]
    assert index.next_episode_id == 4 and index.cursor == 2


def test_single_row_appends_match_chunked_appends():
    flags = torch.rand(50, generator=torch.Generator().manual_seed(0)) < 0.2
    one, many = RingEpisodes(7), RingEpisodes(7)
    for flag in flags:
        one.append(flag.reshape(1))
    many.append(flags)
    assert as_list(one) == as_list(many)


def test_rebuild_gives_fresh_increasing_ids():
    index = RingEpisodes(6)
    index.append(torch.tensor([False, True, False, False, True]))
    index.rebuild(torch.tensor([True, False, False, True, False]), rows=5, cursor=5)
    assert as_list(index) == [(0, 1, 2), (1, 3, 3), (4, 1, 4)]
    assert index.is_open and index.next_episode_id == 5


def test_state_dict_round_trip():
    index = RingEpisodes(5)
    index.append(torch.tensor([False, True, False, False, True, False, False]))
    restored = RingEpisodes(5)
    restored.load_state_dict(index.state_dict())
    assert as_list(restored) == as_list(index)
    assert (restored.rows, restored.cursor, restored.is_open, restored.next_episode_id) == (
        index.rows,
        index.cursor,
        index.is_open,
        index.next_episode_id,
    )
    index.append(torch.tensor([True]))
    restored.append(torch.tensor([True]))
    assert as_list(restored) == as_list(index)


def test_reset_keeps_counting_ids():
    index = RingEpisodes(4)
    index.append(torch.tensor([True, True]))
    index.reset()
    assert index.rows == 0 and index.segments()[0].numel() == 0
    index.append(torch.tensor([True]))
    assert as_list(index) == [(0, 1, 2)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(lengths=[2, 2], ids=[0, 1], rows=3, cursor=3, is_open=False, next_episode_id=2),
            "sum to rows",
        ),
        (
            dict(lengths=[2, 1], ids=[1, 0], rows=3, cursor=3, is_open=False, next_episode_id=2),
            "increase",
        ),
        (
            dict(lengths=[3], ids=[4], rows=3, cursor=3, is_open=False, next_episode_id=4),
            "must exceed",
        ),
        (dict(lengths=[3], ids=[0], rows=3, cursor=9, is_open=False, next_episode_id=1), "cursor"),
    ],
)
def test_load_rejects_inconsistent_tables(kwargs, match):
    index = RingEpisodes(4)
    lengths, ids = kwargs.pop("lengths"), kwargs.pop("ids")
    with pytest.raises(ValueError, match=match):
        index.load(torch.tensor(lengths), torch.tensor(ids), **kwargs)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RingEpisodes(0)


@settings(max_examples=120, deadline=None)
@given(
    capacity=st.integers(1, 24),
    chunks=st.lists(
        st.lists(st.booleans(), min_size=1, max_size=40),
        min_size=1,
        max_size=12,
    ),
    end_rate=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_segments_match_brute_force_under_random_writes(capacity, chunks, end_rate, seed):
    gen = torch.Generator().manual_seed(seed)
    index, sim = RingEpisodes(capacity), Simulated(capacity)
    for chunk in chunks:
        # Episode lengths vary: an end flag with probability end_rate, or the drawn booleans.
        drawn = torch.tensor(chunk)
        flags = (torch.rand(len(chunk), generator=gen) < end_rate) if end_rate else drawn
        index.append(flags)
        sim.write(flags.tolist())
        assert as_list(index) == sim.segments()
        assert (index.rows, index.cursor, index.next_episode_id) == (
            sim.rows,
            sim.cursor,
            sim.next_id,
        )
        assert index.is_open == sim.open
        check_invariants(index, sim)


@pytest.mark.parametrize("rate", [0.02, 0.3, 0.9])
def test_scalar_and_vectorised_appends_leave_the_same_table(monkeypatch, rate):
    # Chunks with few episode ends (and evictions of few segments) take scalar steps,
    # others the vectorised path; forcing either must give the same index.
    gen = torch.Generator().manual_seed(1)
    chunks = [torch.rand(int(k), generator=gen) < rate for k in torch.randint(1, 60, (40,))]
    tables = []
    for limit in (0, 10**9):
        monkeypatch.setattr(ring_episodes, "_SCALAR_ENDS", limit)
        index = RingEpisodes(37)
        for chunk in chunks:
            index.append(chunk)
        tables.append((as_list(index), index.rows, index.cursor, index.next_episode_id))
    assert tables[0] == tables[1]
