"""The gather side of PackedColumns: batch plans and the TensorDicts built from them."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchstore.data import ColumnSpec
from torchstore.data.quantize import Quantize
from torchstore.data.rows import rowgather
from torchstore.data.rows.packed import PackedColumns, _plain_matches, _state, tensordict_of

COLUMNS = [
    ColumnSpec("obs", torch.float32, (3,)),
    ColumnSpec("action", torch.float32, (2,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("next/obs", torch.float32, (3,)),
    ColumnSpec("step", torch.int64),
]


@pytest.fixture
def packed():
    packed = PackedColumns(COLUMNS, capacity=50)
    gen = torch.Generator().manual_seed(0)
    packed.write(
        slice(0, 50),
        {
            "obs": torch.randn(50, 3, generator=gen),
            "action": torch.randn(50, 2, generator=gen),
            "reward": torch.randn(50, generator=gen),
            "done": torch.rand(50, generator=gen) < 0.3,
            "next/obs": torch.randn(50, 3, generator=gen),
            "step": torch.arange(50) * 7,
        },
    )
    return packed


def expected_rows(packed, index):
    return {spec.name: packed.view(spec.name)[index] for spec in COLUMNS}


def test_the_direct_tensordict_is_what_new_unsafe_builds():
    assert _plain_matches()
    leaf = torch.arange(4)
    size, device = torch.Size([4]), torch.device("cpu")
    ours = tensordict_of({"a": leaf, "n": {"b": leaf, "m": {"c": leaf}}}, size, device)
    theirs = TensorDict._new_unsafe(
        {"a": leaf, "n": {"b": leaf, "m": {"c": leaf}}}, batch_size=size, device=device
    )
    assert _state(ours) == _state(theirs)
    assert ours.device == device and ours["n"].device == device
    assert ours["n", "m"].batch_size == size
    assert list(ours.keys(include_nested=True)) == list(theirs.keys(include_nested=True))
    # a normal TensorDict afterwards: set, clone, stack
    ours["x"] = leaf + 1
    assert torch.equal(ours.clone()["n", "m", "c"], leaf)
    assert torch.stack([ours, ours]).batch_size == torch.Size([2, 4])


def test_gather_gives_the_rows_in_column_order(packed):
    index = torch.tensor([4, 0, 49, 4, 17])
    td = packed.gather(index)
    assert list(td.keys()) == ["obs", "action", "reward", "done", "next", "step"]
    for name, value in expected_rows(packed, index).items():
        key = tuple(name.split("/")) if "/" in name else name
        assert td[key].dtype == value.dtype and torch.equal(td[key], value), name
    assert td.batch_size == torch.Size([5]) and td["next"].batch_size == torch.Size([5])


def test_slices_and_caller_buffers_take_the_general_cut(packed):
    sliced = packed.slice(10, 20)
    for name, value in expected_rows(packed, torch.arange(10, 20)).items():
        key = tuple(name.split("/")) if "/" in name else name
        assert torch.equal(sliced[key], value), name
    # a view: no copy
    assert sliced["obs"].data_ptr() == packed.view("obs")[10:].data_ptr()
    index = torch.tensor([3, 1, 2])
    # rows 1-3 of larger buffers: not at offset 0
    out = [torch.empty(6, b.shape[1], dtype=b.dtype)[1:4] for b in packed.blocks]
    blocks = packed.gather_blocks(index, out=out)
    td = packed.batch_from_blocks(blocks, extra={"index": index})
    for name, value in expected_rows(packed, index).items():
        key = tuple(name.split("/")) if "/" in name else name
        assert torch.equal(td[key], value), name
    assert td["index"] is index


def test_plans_rename_and_unsqueeze(packed):
    index = torch.tensor([5, 6, 7])
    plan = packed.batch_plan(
        ["obs", "reward", "next/obs", "done"],
        keys={"obs": "observation", "reward": ("next", "reward"), "done": ("next", "done")},
        unsqueeze=["reward", "done"],
    )
    assert (
        packed.batch_plan(
            ["obs", "reward", "next/obs", "done"],
            keys={"done": ("next", "done"), "obs": "observation", "reward": ("next", "reward")},
            unsqueeze=["done", "reward"],
        )
        is plan
    )
    leaves = plan.leaves(packed.gather_blocks(index), 3, fresh=True)
    assert list(leaves) == ["observation", "next"]
    assert list(leaves["next"]) == ["reward", "obs", "done"]
    rows = expected_rows(packed, index)
    assert torch.equal(leaves["observation"], rows["obs"])
    assert leaves["next"]["reward"].shape == (3, 1)
    assert torch.equal(leaves["next"]["reward"][:, 0], rows["reward"])
    assert torch.equal(leaves["next"]["done"][:, 0], rows["done"])
    assert torch.equal(leaves["next"]["obs"], rows["next/obs"])
    with pytest.raises(ValueError, match="not a scalar"):
        packed.batch_plan(["obs"], unsqueeze=["obs"])


def test_gathered_batches_are_never_rewritten(packed):
    first = packed.gather(torch.tensor([1, 2, 3]))
    kept = first.clone()
    for start in range(0, 50, 7):
        packed.gather(torch.arange(start, min(start + 7, 50)))
    assert (first == kept).all()


def test_quantised_columns_are_decoded_unless_raw():
    spec = ColumnSpec("pix", torch.float32, (2,), quantize=Quantize(0.0, 1.0))
    packed = PackedColumns([spec, ColumnSpec("done", torch.bool)], capacity=4)
    packed.write(
        slice(0, 4),
        {
            "pix": torch.tensor([[0, 255]] * 4, dtype=torch.uint8),
            "done": torch.zeros(4, dtype=torch.bool),
        },
    )
    decoded = packed.gather(torch.tensor([0, 3]))
    raw = packed.gather(torch.tensor([0, 3]), raw=True)
    assert decoded["pix"].dtype == torch.float32 and raw["pix"].dtype == torch.uint8
    assert torch.allclose(decoded["pix"], torch.tensor([[0.0, 1.0]] * 2))


def torch_blocks(packed, index):
    """The blocks gathered the tensor way (what every device takes)."""
    return [torch.index_select(block, 0, index) for block in packed.blocks]


def assert_same_leaves(got: dict, want: dict):
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same_leaves(got[key], value)
        else:
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def test_the_compiled_cut_is_the_tensor_cut(packed):
    """Numpy-gathered leaves (the CPU path) equal the tensor cut: renamed, nested,
    unsqueezed, and in the columns' order."""
    index = torch.tensor([7, 0, 49, 7])
    plans = [
        packed.batch_plan(),
        packed.batch_plan(
            ["obs", "reward", "next/obs", "done"],
            keys={"obs": "observation", "reward": ("next", "reward"), "done": ("x", "y", "done")},
            unsqueeze=["reward", "done"],
        ),
    ]
    for plan in plans:
        assert plan.cuts_arrays
        got = packed.gather_leaves(index, plan)
        assert_same_leaves(got, plan.leaves(torch_blocks(packed, index), 4, fresh=True))
    spec = ColumnSpec("pix", torch.float32, (2,), quantize=Quantize(0.0, 1.0))
    quantised = PackedColumns([spec, ColumnSpec("step", torch.int64)], capacity=4)
    quantised.write(
        slice(0, 4),
        {"pix": torch.tensor([[0, 255], [1, 2]] * 2, dtype=torch.uint8), "step": torch.arange(4)},
    )
    for raw in (False, True):
        plan = quantised.batch_plan(raw=raw)
        got = quantised.gather_leaves(torch.tensor([1, 3]), plan)
        assert_same_leaves(got, plan.leaves(torch_blocks(quantised, torch.tensor([1, 3])), 2))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([torch.uint8, torch.int16, torch.int32, torch.int64, torch.float64]),
    st.integers(1, 700),  # past the bytes the kernel prefetches of a row
    st.integers(1, 60),
    st.data(),
)
def test_the_gather_kernel_is_index_select(dtype, width, capacity, data):
    source = (torch.arange(capacity * width) % 251).to(dtype).reshape(capacity, width)
    index = torch.tensor(
        data.draw(st.lists(st.integers(0, capacity - 1), min_size=0, max_size=80)),
        dtype=torch.int64,
    )
    out = np.full((len(index), width), 7, dtype=source.numpy().dtype)
    assert rowgather.gather_rows(source.numpy(), index.numpy(), out) == -1
    assert torch.equal(torch.from_numpy(out), torch.index_select(source, 0, index))


def test_an_index_outside_the_block_is_refused_before_anything_is_written(packed):
    out = [torch.full((3, b.shape[1]), 5, dtype=b.dtype) for b in packed.blocks]
    for bad in (50, -1):
        with pytest.raises(IndexError, match=f"row index {bad} is out of range"):
            packed.gather_blocks(torch.tensor([0, bad, 1]), out=out)
        assert all(bool((b == 5).all()) for b in out)
        with pytest.raises(IndexError):
            packed.gather_leaves(torch.tensor([bad]), packed.batch_plan())


def test_the_kernel_follows_blocks_moved_into_shared_memory(packed):
    index = torch.tensor([3, 9])
    before = packed.gather(index)
    packed.blocks[0].share_memory_()  # moves the block's memory in place
    packed.write(slice(0, 50), {"step": torch.arange(50) * -1})
    after = packed.gather(index)
    assert torch.equal(after["step"], torch.tensor([-3, -9]))
    assert torch.equal(after["obs"], before["obs"])


def test_a_copied_store_gathers_its_own_memory(packed):
    packed.gather(torch.tensor([1]))  # the numpy views of the blocks are made
    for copied in (pickle.loads(pickle.dumps(packed)), copy.deepcopy(packed)):
        copied.write(slice(0, 50), {"step": torch.zeros(50, dtype=torch.int64)})
        assert int(copied.gather(torch.tensor([4]))["step"][0]) == 0
        assert int(packed.gather(torch.tensor([4]))["step"][0]) == 28
