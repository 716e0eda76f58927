"""The compiled CPU kernels and the graph-safe tensor code give identical answers.

Same state in, same bits out: tree nodes after batched updates (duplicates, zeros, ragged
capacities), descents (indices, values, totals), Philox words at any offset and sub-stream,
a prioritized sampler's rows and importance weights for the same stream state, a fused
uniform draw and gather, and one over runs of rows (a window's active blocks).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.samplers import PrioritizedSampler, SumTree
from torchstore.samplers import philox as philox_module
from torchstore.samplers.draws import uniform_gathered, uniform_rows
from torchstore.samplers.philox import (
    PhiloxStream,
    counters_from_offset,
    philox4x32,
    randint_below,
    uniform_from_words,
)


@contextmanager
def tensors_only():
    saved = philox_module.KERNELS
    philox_module.KERNELS = False
    try:
        yield
    finally:
        philox_module.KERNELS = saved


def test_the_kernels_are_what_cpu_tensors_take():
    assert philox_module.cpu_kernels(torch.zeros(1)) is not None
    with tensors_only():
        assert philox_module.cpu_kernels(torch.zeros(1)) is None


priority = st.one_of(
    st.just(0.0), st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, width=64)
)


@st.composite
def tree_histories(draw):
    capacity = draw(st.integers(1, 300))
    batches = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, capacity - 1), priority), min_size=1, max_size=40),
            min_size=1,
            max_size=5,
        )
    )
    u = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=50))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    return capacity, batches, u, dtype


@settings(max_examples=150, deadline=None)
@given(tree_histories())
def test_tree_update_and_descent_are_identical(history):
    capacity, batches, u, dtype = history
    kernel = SumTree(capacity, dtype=dtype)
    with tensors_only():
        tensor = SumTree(capacity, dtype=dtype)
    for batch in batches:
        index = torch.tensor([i for i, _ in batch])
        value = torch.tensor([v for _, v in batch], dtype=torch.float64)
        kernel.update(index, value)
        with tensors_only():
            tensor.update(index, value)
        assert torch.equal(kernel._sum, tensor._sum)
        assert torch.equal(kernel._min, tensor._min)
    draws = torch.tensor(u, dtype=torch.float64)
    got = kernel.sample_whole(draws)
    with tensors_only():
        want = tensor.sample_whole(draws)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    if float(want[2]) > 0:  # never a zero leaf, whatever the rounding
        assert bool((kernel.values(got[0]) > 0).all())


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**62),
    st.one_of(st.integers(1, 70), st.integers(250, 600)),  # the kernel works 256 at a time
)
def test_philox_words_are_identical(seed, stream, offset, n):
    s = PhiloxStream(seed, stream)
    s.seek(offset)
    got = s.words(n)
    key = torch.tensor([seed & 0xFFFFFFFF, seed >> 32])
    want = philox4x32(counters_from_offset(torch.tensor(offset), n, stream), key)
    assert torch.equal(got, want)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**62),
    st.integers(1, 70),
    st.one_of(st.integers(0, 2**62 - 1), st.integers(0, 2000)),
)
def test_randint_is_identical(seed, offset, n, high):
    s = PhiloxStream(seed)
    s.seek(offset)
    words = s.words(n)
    got = randint_below(words, high)
    on_device_scalar = randint_below(words, torch.tensor(high))
    with tensors_only():
        want = randint_below(words, high)
    assert torch.equal(got, want) and torch.equal(on_device_scalar, want)
    assert bool((want >= 0).all()) and bool((want < max(high, 1)).all())
    for dtype in (torch.float64, torch.float32):
        u = uniform_from_words(words, dtype)
        with tensors_only():
            assert torch.equal(u, uniform_from_words(words, dtype))
        assert u.dtype == dtype and bool((u >= 0).all()) and bool((u < 1).all())


@settings(max_examples=30, deadline=None)
@given(
    st.integers(2, 500),
    st.integers(0, 2**32),
    st.lists(priority, min_size=1, max_size=60),
    st.integers(1, 64),
    st.sampled_from([torch.float64, torch.float32]),
)
def test_prioritized_rows_and_weights_are_identical(capacity, seed, priorities, n, dtype):
    rows = torch.arange(len(priorities)) % capacity
    values = torch.tensor(priorities, dtype=torch.float64)
    kernel = PrioritizedSampler(capacity, alpha=0.6, beta=0.4, seed=seed, dtype=dtype)
    with tensors_only():
        tensor = PrioritizedSampler(capacity, alpha=0.6, beta=0.4, seed=seed, dtype=dtype)
        tensor.update_priority(rows, values)
    kernel.update_priority(rows, values)
    for _ in range(2):
        a = kernel.draw(n)
        with tensors_only():
            b = tensor.draw(n)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        kernel.write_priorities(a[0], a[1].double())
        with tensors_only():
            tensor.write_priorities(b[0], b[1].double())
    assert torch.equal(kernel.tree._sum, tensor.tree._sum)
    assert torch.equal(kernel.tree._min, tensor.tree._min)
    assert torch.equal(kernel._raw, tensor._raw)
    assert kernel.default_priority == tensor.default_priority


@settings(max_examples=20, deadline=None)
@given(
    st.integers(2, 300),
    st.integers(0, 2**32),
    st.lists(priority, min_size=1, max_size=40),
    st.integers(1, 64),
)
def test_generator_sampling_and_checked_updates_are_identical(capacity, seed, priorities, n):
    # torch-generator draws and eager update_priority (validated and written in one call)
    rows = torch.arange(len(priorities)) % capacity
    values = torch.tensor(priorities, dtype=torch.float64)
    kernel = PrioritizedSampler(capacity, alpha=0.7, beta=0.5, generator=seed)
    with tensors_only():
        tensor = PrioritizedSampler(capacity, alpha=0.7, beta=0.5, generator=seed)
    storage = torch.zeros(capacity)
    for sampler, ctx in ((kernel, nullcontext), (tensor, tensors_only)):
        with ctx():
            sampler.update_priority(rows, values)
            for _ in range(2):
                index, info = sampler.sample(storage, n)
                sampler.update_priority(index, info["priority_weight"] * 3)
            sampler.drawn = (index, info["priority_weight"])
    assert torch.equal(kernel.drawn[0], tensor.drawn[0])
    assert torch.equal(kernel.drawn[1], tensor.drawn[1])
    assert torch.equal(kernel.tree._sum, tensor.tree._sum)
    assert torch.equal(kernel.tree._min, tensor.tree._min)
    assert torch.equal(kernel._raw, tensor._raw)
    assert kernel.default_priority == tensor.default_priority


def test_an_empty_graph_safe_update_keeps_the_default_priority():
    sampler = PrioritizedSampler(8)
    sampler.write_priorities(torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    assert sampler.default_priority == 1.0
    sampler.update_priority(torch.tensor([1, 2]), torch.tensor([0.5, 2.5]))
    sampler.write_priorities(torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    assert sampler.default_priority == 2.5


def test_a_fused_draw_and_gather_is_the_draw_then_the_gather():
    """``uniform_gathered`` takes the same stream positions and rows as ``uniform_rows``
    followed by a gather; it refuses rows outside the source before writing any."""
    source = np.arange(300 * 3, dtype=np.int32).reshape(300, 3)
    fused, plain = PhiloxStream(5, block=64), PhiloxStream(5, block=64)
    for n in (10, 70, 5):  # the second one crosses into a new block
        index, rows = uniform_gathered(fused, n, 200, 50, source)
        want = uniform_rows(plain, n, 200, start=50)
        assert torch.equal(index, want) and np.array_equal(rows, source[want.numpy()])
    assert int(fused.position) == int(plain.position) == 85
    assert uniform_gathered(PhiloxStream(5), 4, 10, 0, source) is None  # graph-safe mode
    with tensors_only():
        assert uniform_gathered(fused, 4, 10, 0, source) is None
    with pytest.raises(IndexError, match="outside the 300 rows"):
        uniform_gathered(fused, 64, 300, 50, source)


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    gaps=st.lists(st.integers(0, 9), min_size=8, max_size=8),
    n=st.integers(1, 90),
    position=st.integers(0, 500),
)
@settings(max_examples=60, deadline=None)
def test_a_draw_over_runs_maps_and_gathers_as_numpy_does(lengths, gaps, n, position):
    """``draw_runs_gather``: the stream's integers below the runs' total, each placed in its
    run as ``searchsorted(run_end, x, side="right")`` places it, and those rows gathered."""
    from torchstore.samplers import kernels

    run_end = np.cumsum(lengths).astype(np.int64)
    starts, at = [], 0
    for length, gap in zip(lengths, gaps):  # runs laid out in order with gaps between
        at += gap
        starts.append(at)
        at += length
    packed_off = np.array(starts, dtype=np.int64) - (run_end - np.array(lengths))
    store_off = packed_off + 1000
    source = np.arange(at * 2, dtype=np.float32).reshape(at, 2)
    stream, plain = PhiloxStream(3, block=128), PhiloxStream(3, block=128)
    stream.seek(position)
    plain.seek(position)
    words, first = stream.block_words(n)
    out = np.empty((n, 2), dtype=np.float32)
    index = kernels.draw_runs_gather(
        words, first, int(run_end[-1]), (run_end, packed_off, store_off), source, out
    )
    x = uniform_rows(plain, n, int(run_end[-1])).numpy()
    q = run_end.searchsorted(x, side="right")
    np.testing.assert_array_equal(index, x + store_off[q])
    np.testing.assert_array_equal(out, source[x + packed_off[q]])


def test_a_draw_over_runs_refuses_rows_outside_the_source():
    from torchstore.samplers import kernels

    words, first = PhiloxStream(1, block=64).block_words(16)
    runs = (np.array([50], dtype=np.int64), np.array([40], dtype=np.int64), np.zeros(1, np.int64))
    out = np.zeros((16, 1), dtype=np.int32)
    with pytest.raises(IndexError, match="outside the 60 rows"):
        kernels.draw_runs_gather(words, first, 50, runs, np.ones((60, 1), np.int32), out)
    assert not out.any()  # every row checked before any is written
