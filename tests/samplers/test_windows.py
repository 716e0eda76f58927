"""Windows: inside one segment, never across the wrap, every valid window reachable."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_fakes import FakeRing
from sampler_strategies import rings

from torchstore.errors import EmptyStorageError
from torchstore.samplers.windows import (
    RowSet,
    choose_windows,
    clip_segments,
    context_windows,
    sample_windows,
    window_counts,
)


def all_windows(ring: FakeRing, T: int, pad: bool):
    """Enumerate every window (draw number 0 .. total - 1): the sampler's whole support."""
    start, length, ep = ring.episode_segments()
    total = int(window_counts(length, T, pad=pad).sum())
    return choose_windows(
        start, length, ep, torch.arange(total), capacity=ring.capacity, T=T, pad=pad
    )


def brute_force_windows(ring: FakeRing, T: int) -> set[tuple[int, ...]]:
    """Every run of T rows, consecutive in age order, from one episode."""
    first = ring.cursor if len(ring) == ring.capacity else 0
    order = [(first + a) % ring.capacity for a in range(len(ring))]
    found = set()
    for i in range(len(order) - T + 1):
        rows = order[i : i + T]
        if len({ring.row_episode[r] for r in rows}) == 1:
            found.add(tuple(rows))
    return found


def test_docstring_example():
    start, length, ep = torch.tensor([0, 5]), torch.tensor([5, 3]), torch.tensor([7, 8])
    w = choose_windows(start, length, ep, torch.tensor([0, 3, 4]), capacity=8, T=2)
    assert w.index.tolist() == [[0, 1], [3, 4], [5, 6]]
    assert w.episode_id.tolist() == [7, 7, 8] and w.start_step.tolist() == [0, 3, 0]
    assert w.mask.all()


@settings(max_examples=100, deadline=None)
@given(rings(), st.integers(1, 6))
def test_support_is_exactly_the_valid_windows(ring, T):
    want = brute_force_windows(ring, T)
    if not want:
        return
    w = all_windows(ring, T, pad=False)
    got = [tuple(row) for row in w.index.tolist()]
    assert len(got) == len(set(got))  # each window once: uniform over windows
    assert set(got) == want
    for rows, ep in zip(w.index.tolist(), w.episode_id.tolist(), strict=True):
        assert {ring.row_episode[r] for r in rows} == {ep}


@settings(max_examples=100, deadline=None)
@given(rings(), st.integers(1, 6), st.booleans())
def test_sampled_windows_never_cross_episode_or_wrap(ring, T, pad):
    start, length, ep = ring.episode_segments()
    if not pad and int(length.max()) < T:
        return
    w = sample_windows(
        start,
        length,
        ep,
        capacity=ring.capacity,
        T=T,
        n=32,
        pad=pad,
        generator=torch.Generator().manual_seed(0),
    )
    for rows, mask, e in zip(w.index.tolist(), w.mask.tolist(), w.episode_id.tolist(), strict=True):
        real = [r for r, m in zip(rows, mask, strict=True) if m]
        assert real == rows[: len(real)] and len(real) >= 1  # padding only at the end
        assert all(r == real[-1] for r in rows[len(real) :])  # padding repeats the last row
        assert {ring.row_episode[r] for r in rows} == {e}
        ages = [ring.age(r) for r in real]
        assert ages == list(range(ages[0], ages[0] + len(real)))  # consecutive, no wrap
        if not pad:
            assert len(real) == T


def test_last_step_of_every_episode_is_sampled():
    ring = FakeRing(16)
    for n in (5, 3, 7, 4, 6):  # wraps; the oldest episode is cut by the ring
        ring.write(n)
    start, length, ep = ring.episode_segments()
    T = 3
    last_rows = {int((s + n - 1) % 16) for s, n in zip(start, length, strict=True) if n >= T}
    w = sample_windows(
        start, length, ep, capacity=16, T=T, n=2000, generator=torch.Generator().manual_seed(1)
    )
    assert last_rows <= set(w.index[:, -1].tolist())
    # uniform over windows: each of the W windows is drawn about 2000 / W times
    counts = torch.unique(w.index, dim=0, return_counts=True)[1]
    W = int(window_counts(length, T).sum())
    assert counts.numel() == W
    assert (counts - 2000 / W).abs().max() < 5 * (2000 / W) ** 0.5


def test_pad_gives_short_episodes_one_masked_window():
    start, length, ep = torch.tensor([0, 2]), torch.tensor([2, 6]), torch.tensor([0, 1])
    w = choose_windows(start, length, ep, torch.arange(4), capacity=8, T=4, pad=True)
    assert w.index.tolist() == [[0, 1, 1, 1], [2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]]
    assert w.mask.tolist()[0] == [True, True, False, False]
    assert w.mask[1:].all()


@settings(max_examples=100, deadline=None)
@given(rings(), st.integers(0, 40))
def test_clip_segments_keeps_exactly_the_newest_rows(ring, count):
    count = min(count, len(ring))
    start, length, _ = ring.episode_segments()
    new_start, new_length = clip_segments(
        start, length, cursor=ring.cursor, count=count, capacity=ring.capacity
    )
    kept = set()
    for s, n in zip(new_start.tolist(), new_length.tolist(), strict=True):
        kept |= {(s + j) % ring.capacity for j in range(n)}
    assert kept == ring.newest(count)
    assert int(new_length.sum()) == count


def test_window_longer_than_every_episode_is_an_error():
    start, length, ep = torch.tensor([0, 5]), torch.tensor([5, 3]), torch.tensor([0, 1])
    with pytest.raises(
        EmptyStorageError, match=r"T=8: the longest episode has 5 rows; pass pad=True"
    ):
        sample_windows(start, length, ep, capacity=8, T=8, n=1)
    empty = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(EmptyStorageError, match="Cannot sample windows from an empty storage"):
        sample_windows(empty, empty, empty, capacity=8, T=1, n=1)


def test_bad_arguments_are_rejected():
    s = torch.tensor([0])
    with pytest.raises(ValueError, match=r"T \(0\) must be an int >= 1 \(the window length\)"):
        sample_windows(s, s + 3, s, capacity=4, T=0, n=1)
    with pytest.raises(ValueError, match=r"n \(-1\) must be an int >= 0 \(the number of windows\)"):
        sample_windows(s, s + 3, s, capacity=4, T=1, n=-1)
    with pytest.raises(ValueError, match=r"must be 1-D of one shape, got \(1,\), \(2,\), \(1,\)"):
        sample_windows(s, torch.tensor([1, 2]), s, capacity=4, T=1, n=1)


@st.composite
def row_sets(draw):
    """Disjoint segments of a store, in any order (shards, validation splits)."""
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))
    gaps = draw(st.lists(st.integers(0, 3), min_size=len(lengths), max_size=len(lengths)))
    starts, at = [], 0
    for length, gap in zip(lengths, gaps):
        starts.append(at + gap)
        at += gap + length
    order = draw(st.permutations(range(len(lengths))))
    return [starts[i] for i in order], [lengths[i] for i in order]


@settings(max_examples=150, deadline=None)
@given(row_sets())
def test_row_set_numbers_every_row_once_and_finds_its_segment(segments):
    starts, lengths = segments
    rows = RowSet(torch.tensor(starts), torch.tensor(lengths), torch.arange(len(starts)) + 100)
    g = torch.arange(len(rows))
    row, seg = rows.locate(g)
    want = [s + k for s, n in zip(starts, lengths) for k in range(n)]
    assert row.tolist() == want and torch.equal(rows.rows(g), row)
    assert torch.equal(rows.segment_of(row), seg)
    assert rows.episode[seg].tolist() == [100 + i for i, n in enumerate(lengths) for _ in range(n)]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(0, 11), st.integers(0, 4), st.integers(0, 4))
def test_context_windows_clamp_to_the_episode(length, step, before, after):
    step = step % length
    first = 20
    index, mask = context_windows(
        torch.tensor([first + step]),
        torch.tensor([first]),
        torch.tensor([length]),
        before=before,
        after=after,
    )
    for j, k in enumerate(range(step - before, step + after + 1)):
        assert int(index[0, j]) == first + min(max(k, 0), length - 1)
        assert bool(mask[0, j]) == (0 <= k < length)
