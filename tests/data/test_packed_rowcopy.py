"""Slice writes through the compiled row-copy kernel leave the bytes ``copy_`` leaves.

Every dtype the packed layout stores (bool, ints, half and wider floats), scalar
and shaped columns, contiguous and strided sources (``[time, env]`` leads, transposed
views, every other row), partial writes, sources that cannot be copied as bytes (other
dtypes, broadcasts, negative views, rows needing grad, rows read from the block itself), and a
replay ring written across its end, quantised columns and ``ndim=2`` included.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchstore.data import ColumnSpec, Quantize
from torchstore.data.replay.ring import StoreReplay
from torchstore.data.rows import packed as packed_module
from torchstore.data.rows.packed import PackedColumns

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
]
SHAPES = [(), (1,), (3,), (2, 3), (1, 4), (4, 1)]


@contextmanager
def kernels(on: bool):
    saved = packed_module._ROW_KERNELS
    packed_module._ROW_KERNELS = on
    try:
        yield
    finally:
        packed_module._ROW_KERNELS = saved


def random_values(gen: torch.Generator, dtype: torch.dtype, shape: tuple[int, ...]):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen).to(dtype)


def twin(columns, capacity):
    """Two identical packed stores (one per write path), the blocks filled with noise."""
    made = []
    for _ in range(2):
        packed = PackedColumns(columns, capacity)
        for block in packed.blocks:
            block.view(torch.uint8).copy_(
                torch.arange(block.numel() * block.element_size()).reshape(
                    block.view(torch.uint8).shape
                )
                % 251
            )
        made.append(packed)
    return made


def same_bytes(a: PackedColumns, b: PackedColumns) -> bool:
    return all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for x, y in zip(a.blocks, b.blocks, strict=True)
    )


def write_both(columns, capacity, rows, values) -> tuple[PackedColumns, PackedColumns]:
    fast, slow = twin(columns, capacity)
    with kernels(True):
        fast.write(rows, values)
    with kernels(False):
        slow.write(rows, values)
    return fast, slow


def test_a_cpu_write_takes_the_kernel_and_the_switch_turns_it_off(monkeypatch):
    assert packed_module.row_kernels() is not None
    with kernels(False):
        assert packed_module.row_kernels() is None
    cols = [ColumnSpec("obs", torch.float32, (3,)), ColumnSpec("done", torch.bool)]
    packed = PackedColumns(cols, 8)
    calls = []
    rowcopy = packed_module.row_kernels()
    monkeypatch.setattr(rowcopy, "copy_rows", lambda *a: calls.append(a))
    packed.write(slice(2, 4), {"obs": torch.ones(2, 3), "done": torch.ones(2, dtype=torch.bool)})
    assert len(calls) == 1


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(DTYPES), st.sampled_from(SHAPES)), min_size=1, max_size=5
    ),
    capacity=st.integers(1, 40),
    data=st.data(),
)
def test_slice_writes_match_copy(specs, capacity, data):
    columns = [ColumnSpec(f"c{i}", dtype, shape) for i, (dtype, shape) in enumerate(specs)]
    start = data.draw(st.integers(0, capacity - 1))
    count = data.draw(st.integers(1, capacity - start))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    values = {}
    for spec in columns:
        kind = data.draw(st.sampled_from(["contiguous", "every other row", "transposed"]))
        if kind == "every other row":
            value = random_values(gen, spec.dtype, (2 * count, *spec.shape))[::2]
        elif kind == "transposed" and len(spec.shape) == 2:  # rows not dense: copy_ path
            value = random_values(gen, spec.dtype, (count, *spec.shape[::-1])).transpose(1, 2)
        else:
            value = random_values(gen, spec.dtype, (count, *spec.shape))
        values[spec.name] = value
    if data.draw(st.booleans()):  # a partial write: columns left out keep their bytes
        values.pop(columns[0].name)
    fast, slow = write_both(columns, capacity, slice(start, start + count), values)
    assert same_bytes(fast, slow)
    for name, value in values.items():
        assert torch.equal(fast.view(name)[start : start + count], value)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(1, 6),
    envs=st.integers(1, 5),
    layout=st.sampled_from(["contiguous", "env major", "strided env"]),
    seed=st.integers(0, 2**31),
)
def test_time_env_leads_match_copy(steps, envs, layout, seed):
    """``[time, env]`` values (ndim=2 rings) are laid out row-major over the rows."""
    columns = [
        ColumnSpec("obs", torch.float32, (3,)),
        ColumnSpec("reward", torch.float64),
        ColumnSpec("done", torch.bool),
    ]
    gen = torch.Generator().manual_seed(seed)
    values = {}
    for spec in columns:
        if layout == "env major":  # what torchrl hands an ndim=2 storage: a transposed view
            value = random_values(gen, spec.dtype, (envs, steps, *spec.shape)).transpose(0, 1)
        elif layout == "strided env":
            value = random_values(gen, spec.dtype, (steps, 2 * envs, *spec.shape))[:, ::2]
        else:
            value = random_values(gen, spec.dtype, (steps, envs, *spec.shape))
        values[spec.name] = value
    capacity = steps * envs + 3
    fast, slow = write_both(columns, capacity, slice(2, 2 + steps * envs), values)
    assert same_bytes(fast, slow)
    for name, value in values.items():
        expected = value.reshape(steps * envs, *value.shape[2:])
        assert torch.equal(fast.view(name)[2 : 2 + steps * envs], expected)


def test_values_the_kernel_cannot_copy_as_bytes_take_copy():
    columns = [ColumnSpec("obs", torch.float32, (3,)), ColumnSpec("done", torch.bool)]
    gen = torch.Generator().manual_seed(0)
    cases = [
        {"obs": torch.randn(4, 3, dtype=torch.float64, generator=gen)},  # another dtype
        {"obs": torch.randn(1, 3, generator=gen)},  # broadcast over the rows
        {"obs": torch.randn(3, generator=gen)},  # broadcast, no row dim
        {"obs": torch.randn(4, 3, generator=gen, requires_grad=True).detach().requires_grad_()},
        # a negative view (the imaginary part of a conjugate)
        {"obs": torch.imag(torch.randn(4, 3, dtype=torch.complex64, generator=gen).conj())},
        {"done": torch.ones(4, 1, dtype=torch.bool)[:, 0].expand(4)},
    ]
    for values in cases:
        with torch.no_grad():
            fast, slow = write_both(columns, 6, slice(1, 5), values)
        assert same_bytes(fast, slow), values


def test_rows_read_from_the_block_itself_are_copied_in_copys_order():
    columns = [ColumnSpec("obs", torch.float32, (3,)), ColumnSpec("done", torch.bool)]
    fast, slow = twin(columns, 10)
    with kernels(True):
        fast.write(slice(3, 7), {"obs": fast.view("obs")[0:4], "done": fast.view("done")[1:5]})
    with kernels(False):
        slow.write(slice(3, 7), {"obs": slow.view("obs")[0:4], "done": slow.view("done")[1:5]})
    assert same_bytes(fast, slow)


def test_the_kernel_refuses_rows_outside_the_block():
    rowcopy = packed_module.row_kernels()
    block = torch.zeros(4, 8, dtype=torch.uint8)
    source = torch.ones(5, 8, dtype=torch.uint8)
    table = np.array([[source.data_ptr(), 8, 0, 0, 8]], dtype=np.int64)
    with pytest.raises(ValueError, match="outside a block"):
        rowcopy.copy_rows(block.data_ptr(), 4, 8, 0, 5, 1, table)
    with pytest.raises(ValueError, match="outside a block"):
        rowcopy.copy_rows(block.data_ptr(), 4, 8, 0, 1, 1, table + [[0, 0, 0, 1, 0]])
    rowcopy.copy_rows(block.data_ptr(), 4, 8, 0, 4, 1, table)
    assert bool((block == 1).all())


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.integers(-3, 12), max_size=8) | st.builds(list, st.just(range(3, 9))),
    cap=st.integers(1, 12),
)
def test_run_start_is_the_consecutive_run_check(rows, cap):
    rowcopy = packed_module.row_kernels()
    array = np.asarray(rows, dtype=np.int64)
    consecutive = (len(rows) > 0 and rows[0] >= 0 and rows[0] + len(rows) <= cap) and rows == list(
        range(rows[0], rows[0] + len(rows))
    )
    assert rowcopy.run_start(array, cap) == (rows[0] if consecutive else -1)


def walker_chunk(start: int, n: int, *, lead: tuple[int, ...] | None = None) -> TensorDict:
    gen = torch.Generator().manual_seed(start)
    shape = lead or (n,)
    return TensorDict(
        {
            "obs": torch.randn(*shape, 4, generator=gen),
            "action": torch.randn(*shape, 2, generator=gen),
            "reward": torch.rand(*shape, generator=gen),
            "done": torch.rand(*shape, generator=gen) < 0.1,
            "next": {"obs": torch.randn(*shape, 4, generator=gen)},
        },
        batch_size=shape,
    )


@pytest.mark.parametrize("quantised", [False, True])
def test_a_ring_written_across_its_end_matches_the_copy_path(quantised):
    from torchrl.data import TensorDictReplayBuffer

    columns = None
    if quantised:
        columns = [
            ColumnSpec("obs", torch.float32, (4,), quantize=Quantize(-3.0, 3.0, clip=True)),
            ColumnSpec("action", torch.float32, (2,)),
            ColumnSpec("reward", torch.float32),
            ColumnSpec("done", torch.bool),
            ColumnSpec("next/obs", torch.float32, (4,)),
        ]
    rings = []
    for on in (True, False):
        with kernels(on):
            rb = TensorDictReplayBuffer(storage=StoreReplay(23, columns=columns), batch_size=4)
            for k in range(9):
                rb.extend(walker_chunk(k, 7))
        rings.append(rb.storage)
    fast, slow = rings
    assert same_bytes(fast.packed, slow.packed)
    assert fast.cursor == slow.cursor and len(fast) == len(slow)
    assert all(torch.equal(a, b) for a, b in zip(fast.episode_segments(), slow.episode_segments()))


def test_a_multi_env_ring_matches_the_copy_path():
    from torchrl.data import TensorDictReplayBuffer

    rings = []
    for on in (True, False):
        with kernels(on):
            rb = TensorDictReplayBuffer(storage=StoreReplay(30, ndim=2), batch_size=4)
            for k in range(7):
                rb.extend(walker_chunk(k, 0, lead=(3, 4)))  # [envs, time]: written transposed
        rings.append(rb.storage)
    fast, slow = rings
    assert same_bytes(fast.packed, slow.packed)
    assert all(torch.equal(a, b) for a, b in zip(fast.episode_segments(), slow.episode_segments()))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(0, 2**31))
def test_appends_of_any_column_width_match_the_copy_path(widths, seed):
    """Appended rows are copied in 32-, 16-, 8-, 4- and 1-byte moves: column widths from 1
    to 160 bytes (float32 and uint8 columns) give the bytes the copy path gives."""
    from torchrl.data import TensorDictReplayBuffer

    def chunk(k: int) -> TensorDict:
        gen = torch.Generator().manual_seed(seed + k)
        leaves = {f"f{i}": torch.randn(5, w, generator=gen) for i, w in enumerate(widths)}
        leaves |= {
            f"b{i}": torch.randint(0, 255, (5, w), generator=gen).to(torch.uint8)
            for i, w in enumerate(widths)
        }
        leaves["done"] = torch.rand(5, generator=gen) < 0.3
        return TensorDict(leaves, batch_size=[5])

    rings = []
    for on in (True, False):
        with kernels(on):
            rb = TensorDictReplayBuffer(storage=StoreReplay(12), batch_size=2)
            for k in range(4):
                rb.extend(chunk(k))
        rings.append(rb.storage)
    fast, slow = rings
    assert fast._append_plans and not slow._append_plans  # the kernel took the appends
    assert same_bytes(fast.packed, slow.packed)
    assert all(torch.equal(a, b) for a, b in zip(fast.episode_segments(), slow.episode_segments()))
