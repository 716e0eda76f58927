"""SumTree: totals, ranges, the zero-leaf guard, duplicates, graph safety, checkpoints."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_strategies import priority_batches

from torchstore.samplers.sumtree import SumTree, last_write_wins


def apply(tree: SumTree, batches) -> torch.Tensor:
    """Write ``batches`` into ``tree`` and into a plain list, the oracle."""
    leaves = [0.0] * tree.capacity
    for index, value in batches:
        tree.update(torch.tensor(index), torch.tensor(value, dtype=torch.float64))
        for i, v in zip(index, value, strict=True):
            leaves[i] = v
    return torch.tensor(leaves, dtype=torch.float64)


def ring_rows(start: int, count: int, capacity: int) -> list[int]:
    return sorted((start + j) % capacity for j in range(count))


@st.composite
def trees(draw):
    capacity = draw(st.integers(1, 70))
    batches = draw(priority_batches(capacity))
    tree = SumTree(capacity)
    return tree, apply(tree, batches)


@st.composite
def ranges(draw, capacity):
    return draw(st.integers(0, capacity - 1)), draw(st.integers(0, capacity))


def test_docstring_example():
    tree = SumTree(5)
    tree.update(torch.tensor([0, 1, 3]), torch.tensor([1.0, 0.0, 3.0]))
    assert float(tree.total()) == 4.0 and float(tree.min()) == 1.0
    assert tree.find(torch.tensor([0.5, 1.0, 3.9])).tolist() == [0, 3, 3]


@settings(max_examples=80, deadline=None)
@given(trees())
def test_total_is_sum_of_leaves_after_batches_with_duplicates(tree_and_leaves):
    tree, leaves = tree_and_leaves
    assert torch.equal(tree.values(), leaves)
    assert torch.allclose(tree.total(), leaves.sum(), rtol=1e-12)
    positive = leaves[leaves > 0]
    assert float(tree.min()) == (float(positive.min()) if positive.numel() else float("inf"))


def test_duplicate_indices_last_write_wins():
    tree = SumTree(4)
    tree.update(torch.tensor([2, 1, 2, 2, 1]), torch.tensor([5.0, 7.0, 1.0, 3.0, 0.0]))
    assert tree.values().tolist() == [0.0, 0.0, 3.0, 0.0]
    idx, val = last_write_wins(torch.tensor([3, 0, 3]), torch.tensor([1.0, 2.0, 9.0]))
    assert idx.tolist() == [0, 3, 3] and val.tolist() == [2.0, 9.0, 9.0]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_ring_range_total_and_min_match_brute_force(data):
    tree, leaves = data.draw(trees())
    start, count = data.draw(ranges(tree.capacity))
    rows = ring_rows(start, count, tree.capacity)
    want = leaves[rows]
    assert torch.allclose(tree.total(count, start=start), want.sum(), rtol=1e-12, atol=0)
    positive = want[want > 0]
    want_min = float(positive.min()) if positive.numel() else float("inf")
    assert float(tree.min(count, start=start)) == want_min


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_find_is_inverse_cdf_over_the_range(data):
    # Integer values keep every partial sum exact, so the descent must match searchsorted.
    capacity = data.draw(st.integers(1, 50))
    values = data.draw(st.lists(st.integers(0, 5), min_size=capacity, max_size=capacity))
    tree = SumTree(capacity)
    tree.update(torch.arange(capacity), torch.tensor(values, dtype=torch.float64))
    start, count = data.draw(ranges(capacity))
    rows = torch.tensor(ring_rows(start, count, capacity), dtype=torch.int64)
    weights = torch.tensor(values, dtype=torch.float64)[rows]
    total = int(weights.sum())
    if total == 0:
        return
    mass = torch.arange(2 * total, dtype=torch.float64) / 2  # every half-step of the CDF
    got = tree.find(mass, count, start=start)
    want = rows[torch.searchsorted(weights.cumsum(0), mass, right=True)]
    assert torch.equal(got, want)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_sample_never_returns_zero_leaf_or_leaf_outside_range(data):
    tree, leaves = data.draw(trees())
    start, count = data.draw(ranges(tree.capacity))
    rows = set(ring_rows(start, count, tree.capacity))
    if not any(leaves[r] > 0 for r in rows):
        return
    u = torch.cat(
        [torch.tensor([0.0, 0.5, 1 - 2**-53, 1.0, 1.5]), torch.rand(64, dtype=torch.float64)]
    )
    index, value, _ = tree.sample(u, count, start=start)
    assert set(index.tolist()) <= rows
    assert (value > 0).all() and torch.equal(value, leaves[index])


def test_float32_rounding_cannot_reach_a_zero_leaf():
    tree = SumTree(4, dtype=torch.float32)
    tree.update(torch.tensor([0, 1]), torch.tensor([1e8, 1.0]))  # 1e8 + 1 rounds to 1e8
    total = tree.total()
    assert float(total) == 1e8
    # mass at and past the total: the rightmost positive leaf, never the empty leaves 2, 3.
    got = tree.find(torch.tensor([float(total), float(total) * 1.5, 5e7]))
    assert got.tolist() == [1, 1, 0]


def test_prefix_limit_excludes_positive_leaves_beyond_it():
    tree = SumTree(3)
    tree.update(torch.arange(3), torch.tensor([1.0, 1.0, 5.0]))
    got = tree.find(torch.tensor([0.0, 1.5, 2.0, 7.0]), 2)
    assert got.tolist() == [0, 1, 1, 1]


def test_state_dict_round_trip_and_assign():
    tree = SumTree(6)
    tree.update(torch.tensor([0, 4, 5]), torch.tensor([1.0, 2.0, 0.5]))
    other = SumTree(6)
    other.load_state_dict(tree.state_dict())
    assert torch.equal(other._sum, tree._sum) and torch.equal(other._min, tree._min)
    other.assign(torch.zeros(6))
    assert float(other.total()) == 0 and float(other.min()) == float("inf")
    tree.clear()
    assert float(tree.total()) == 0


def _step(tree: SumTree, index, value, u, count, start):
    tree.update(index, value, check=False)
    index_out, leaf, total = tree.sample(u, count, start=start)
    return index_out, leaf, total, tree.min(count, start=start), tree.find(u * total, count)


def test_compiled_fullgraph_matches_eager():
    torch.manual_seed(0)
    eager, compiled_tree = SumTree(20), SumTree(20)
    fn = torch.compile(_step, fullgraph=True, backend="aot_eager")
    for _ in range(2):  # the second call reuses the graph with new values
        index = torch.randint(0, 20, (16,))
        value = torch.rand(16, dtype=torch.float64) * (torch.rand(16) < 0.8)
        u = torch.rand(32, dtype=torch.float64)
        count, start = torch.tensor(15), torch.tensor(12)  # a wrapped ring range
        want = _step(eager, index, value, u, count, start)
        got = fn(compiled_tree, index, value, u, count, start)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        assert torch.equal(compiled_tree._sum, eager._sum)
        assert torch.equal(compiled_tree._min, eager._min)


@pytest.mark.slow
def test_compiled_inductor_matches_eager():
    eager, compiled_tree = SumTree(4), SumTree(4)
    index, value = (
        torch.tensor([1, 3, 3, 0]),
        torch.tensor([1.0, 2.0, 3.0, 0.5], dtype=torch.float64),
    )
    u, count, start = torch.rand(8, dtype=torch.float64), torch.tensor(3), torch.tensor(2)
    got = torch.compile(_step, fullgraph=True)(compiled_tree, index, value, u, count, start)
    for g, w in zip(got, _step(eager, index, value, u, count, start), strict=True):
        assert torch.equal(g, w)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"capacity \(0\) must be an int >= 1"):
        SumTree(0)
    with pytest.raises(ValueError, match="dtype must be a floating dtype, got torch.int64"):
        SumTree(4, dtype=torch.int64)
    tree = SumTree(4)
    with pytest.raises(ValueError, match=r"index must be in \[0, 4\), got 4 at position 1"):
        tree.update(torch.tensor([0, 4]), 1.0)
    with pytest.raises(ValueError, match="value must be finite and >= 0, got nan at index 3"):
        tree.update(torch.tensor([2, 3]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="value must be finite and >= 0, got -1.0 at index 0"):
        tree.update(0, -1.0)
    with pytest.raises(
        ValueError, match=r"value must have one element or as many as index \(2\), got 3"
    ):
        tree.update(torch.tensor([0, 1]), torch.ones(3))
    with pytest.raises(ValueError, match="values must have 4 elements, got 2"):
        tree.assign(torch.ones(2))
    with pytest.raises(
        ValueError, match="capacity must match the checkpoint: this tree has 4, the checkpoint 6"
    ):
        tree.load_state_dict(SumTree(6).state_dict())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_trees_run_on_the_cpu(dtype):
    """numpy has no bfloat16 and numba little float16: such trees take the tensor code."""
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from torchstore.data.replay.ring import StoreReplay
    from torchstore.samplers import PrioritizedSampler

    tree = SumTree(8, dtype=dtype)
    tree.update(torch.tensor([1, 3]), torch.tensor([1.0, 3.0]))
    assert tree._sum.dtype == dtype and float(tree.total()) == 4.0
    sampler = PrioritizedSampler(64, alpha=0.7, beta=0.5, dtype=dtype, seed=0)
    rb = TensorDictReplayBuffer(storage=StoreReplay(64), sampler=sampler, batch_size=16)
    rb.extend(TensorDict({"obs": torch.arange(40.0)}, [40]))
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.full((16,), 0.5))
    assert (rb.sample()["index"] < 40).all()


def binary_tree(leaves: torch.Tensor, depth: int) -> torch.Tensor:
    """Every level of a binary sum-tree over ``leaves`` (node 1 the root), summed pairwise."""
    sums = torch.zeros(2 << depth, dtype=torch.float64)
    sums[1 << depth : (1 << depth) + leaves.shape[0]] = leaves
    for node in range((1 << depth) - 1, 0, -1):
        sums[node] = sums[2 * node] + sums[2 * node + 1]
    return sums


def binary_descent(sums: torch.Tensor, depth: int, mass: float) -> int:
    node = 1
    for _ in range(depth):
        left, right = float(sums[2 * node]), float(sums[2 * node + 1])
        go = left <= 0 or (mass >= left and right > 0)
        mass = mass - left * go
        node = 2 * node + go
    return node - (1 << depth)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_other_level_stored_gives_the_binary_trees_bits(data):
    """Only every other level is stored; the rest are computed when read. Totals, stored
    nodes and whole-tree draws must be those of a tree storing every level, for odd and
    even depths, with the compiled kernels and with the tensor code."""
    from torchstore.samplers import philox as philox_module

    capacity = data.draw(st.integers(1, 140))  # depths 0 to 8
    leaves = torch.tensor(
        data.draw(
            st.lists(
                st.one_of(st.just(0.0), st.floats(1e-9, 1e6)),
                min_size=capacity,
                max_size=capacity,
            )
        ),
        dtype=torch.float64,
    )
    u = torch.tensor(
        data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=40)),
        dtype=torch.float64,
    )
    for kernels in (True, False):
        saved, philox_module.KERNELS = philox_module.KERNELS, kernels
        try:
            tree = SumTree(capacity)
            tree.update(torch.arange(capacity), leaves)
            want = binary_tree(leaves, tree.depth)
            for level in range(tree.depth % 2, tree.depth + 1, 2):
                rows = slice(1 << level, 2 << level)
                assert torch.equal(tree._sum[rows], want[rows])
            assert float(tree.total()) == float(want[1])
            index, value, total = tree.sample_whole(u)
        finally:
            philox_module.KERNELS = saved
        assert float(total) == float(want[1])
        if float(total) > 0:
            drawn = [binary_descent(want, tree.depth, m) for m in (u * total).tolist()]
            assert index.tolist() == [min(i, capacity - 1) for i in drawn]
            assert torch.equal(value, leaves[index])
