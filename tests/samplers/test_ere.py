"""ERE: the paper's numbers, annealing, and samplers that stay inside the newest c_k rows."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_strategies import rings

from torchstore.samplers import (
    ERE,
    PrioritizedSampler,
    SequenceWindowSampler,
    UniformSampler,
    recent_range,
)


def test_paper_numbers():
    ere = ERE(eta=0.996, c_min=5000)
    ere.set_progress(1, 1000)
    assert ere.recent_count(1_000_000) == 996_000
    ere.set_progress(1000, 1000)
    assert ere.recent_count(1_000_000) == 18_169
    assert 1e6 * ere.factor == pytest.approx(18_169.31, abs=0.01)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 10**9),
    st.integers(1, 2000),
    st.data(),
    st.floats(0.5, 1.0),
    st.integers(1, 10**6),
)
def test_count_bounds_and_tensor_agrees_with_int(n, K, data, eta, c_min):
    k = data.draw(st.integers(1, K))
    ere = ERE(eta=eta, c_min=c_min)
    ere.set_progress(k, K)
    c = ere.recent_count(n)
    assert c == min(n, max(c_min, math.floor(n * eta ** (k * 1000 / K) + 0.5)))
    assert 0 <= c <= n and (n == 0 or c >= 1)
    assert int(ere.recent_count(torch.tensor(n))) == c


def test_eta_one_is_uniform_and_annealing_moves_toward_it():
    assert ERE(eta=1.0).recent_count(123_456) == 123_456
    ere = ERE(eta=0.996, c_min=1, anneal_to=1.0)
    ere.set_progress(1000, 1000, frac=0.0)
    assert ere.recent_count(10**6) == 18_169
    ere.set_progress(1000, 1000, frac=0.5)
    assert ere.current_eta == pytest.approx(0.998)
    assert ere.recent_count(10**6) == math.floor(1e6 * 0.998**1000 + 0.5)
    ere.set_progress(500, 1000)  # frac is kept
    assert ere.current_eta == pytest.approx(0.998)
    ere.set_progress(1, 1000, frac=1.0)
    assert ere.recent_count(10**6) == 10**6


def test_state_round_trip():
    ere = ERE(eta=0.99, c_min=7, anneal_to=1.0)
    ere.set_progress(3, 9, frac=0.25)
    copy = ERE.from_state_dict(ere.state_dict())
    assert copy == ere and copy.recent_count(1000) == ere.recent_count(1000)


def test_recent_range_wraps():
    assert recent_range(3, 5, 10) == (8, 5)  # rows 8, 9, 0, 1, 2
    assert recent_range(7, 7, 10) == (0, 7)  # not full yet: cursor == rows
    start, count = recent_range(torch.tensor(3), torch.tensor(5), 10)
    assert int(start) == 8 and int(count) == 5


def test_bad_schedules_are_rejected():
    with pytest.raises(ValueError, match=r"eta \(0\) must be a number in \(0, 1\]"):
        ERE(eta=0)
    with pytest.raises(ValueError, match=r"eta \(1.5\) must be a number in \(0, 1\]"):
        ERE(eta=1.5)
    with pytest.raises(ValueError, match=r"anneal_to \(2\) must be a number in \(0, 1\]"):
        ERE(anneal_to=2)
    with pytest.raises(ValueError, match=r"c_min \(0\) must be an int >= 1"):
        ERE(c_min=0)
    ere = ERE()
    with pytest.raises(ValueError, match=r"K \(0\) must be an int >= 1"):
        ere.set_progress(1, 0)
    with pytest.raises(ValueError, match=r"k must be in \[1, K=10\], got 11"):
        ere.set_progress(11, 10)
    with pytest.raises(ValueError, match=r"frac \(1.5\) must be a number in \[0, 1\]"):
        ere.set_progress(1, 10, frac=1.5)


def _ere_for(ring, c_min: int) -> ERE:
    ere = ERE(eta=0.5, c_min=c_min)
    ere.set_progress(1, 1)  # factor 0.5**1000: the window is exactly c_min rows
    return ere


@settings(max_examples=60, deadline=None)
@given(rings(), st.integers(1, 40))
def test_uniform_ere_stays_in_newest_rows(ring, c_min):
    ere = _ere_for(ring, c_min)
    newest = ring.newest(min(c_min, len(ring)))
    index, _ = UniformSampler(ere=ere, generator=0).sample(ring, 200)
    assert set(index.tolist()) <= newest
    if len(newest) <= 5:
        assert set(index.tolist()) == newest


@settings(max_examples=60, deadline=None)
@given(rings(), st.integers(1, 40))
def test_prioritized_ere_stays_in_newest_rows_and_weights_use_them(ring, c_min):
    sampler = PrioritizedSampler(
        ring.capacity, alpha=1.0, beta=1.0, eps=0.0, ere=_ere_for(ring, c_min), generator=0
    )
    rows = torch.arange(len(ring))
    sampler.update_priority(rows, rows.to(torch.float64) + 1)
    newest = sorted(ring.newest(min(c_min, len(ring))))
    index, info = sampler.sample(ring, 200)
    assert set(index.tolist()) <= set(newest)
    p = index.to(torch.float64) + 1
    p_min = min(newest) + 1  # priority of row r is r + 1
    assert torch.allclose(info["priority_weight"], (p / p_min).pow(-1.0).float())


@settings(max_examples=60, deadline=None)
@given(rings(), st.integers(1, 40), st.integers(1, 4), st.booleans())
def test_window_ere_keeps_whole_windows_in_newest_rows(ring, c_min, T, pad):
    sampler = SequenceWindowSampler(T, pad=pad, ere=_ere_for(ring, c_min), generator=0)
    newest = ring.newest(min(c_min, len(ring)))
    if sampler._sampleable_count(ring, 8 * T) == 0:
        return
    index, info = sampler.sample_windows(ring, 8)
    assert set(index[info["mask"]].tolist()) <= newest
