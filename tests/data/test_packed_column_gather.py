"""One column of scattered rows: PackedColumns.gather_column / gather_columns and the kernel.

A column's gather reads its own bytes of each row only (an action chunk beside camera
frames never reads a frame); it must equal indexing the column's view, for every dtype and
byte position in the row, with the compiled kernel and without it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.data import ColumnSpec
from torchstore.data.quantize import Quantize
from torchstore.data.rows import packed as packed_module
from torchstore.data.rows import rowgather
from torchstore.data.rows.packed import PackedColumns
from torchstore.data.rows.recycled import RECYCLE_BYTES

DTYPES = [torch.uint8, torch.bool, torch.int16, torch.float32, torch.int64, torch.float64]


@pytest.fixture(params=[True, False], ids=["kernel", "index_select"])
def kernels(request, monkeypatch):
    monkeypatch.setattr(packed_module, "_ROW_KERNELS", request.param)
    return request.param


def filled(columns, capacity: int, seed: int = 0) -> PackedColumns:
    packed = PackedColumns(columns, capacity)
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (capacity, packed.row_bytes), dtype=torch.uint8, generator=gen)
    packed.blocks[0].view(torch.uint8).copy_(raw)  # every byte of every column random
    bools = {
        c.name: torch.rand(capacity, *c.shape, generator=gen) < 0.5
        for c in columns
        if c.dtype == torch.bool
    }
    if bools:  # a bool byte is 0 or 1
        packed.write(slice(0, capacity), bools)
    return packed


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bit for bit (random bytes make NaNs, which torch.equal calls unequal)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return got.numpy().tobytes() == want.numpy().tobytes()


@settings(max_examples=40, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(1, 5), max_size=3)),
        min_size=1,
        max_size=5,
    ),
    capacity=st.integers(1, 30),
    data=st.data(),
)
def test_a_column_gather_is_indexing_its_view(specs, capacity, data):
    """Any mix of dtypes and shapes (so every word size and byte offset in the row), with
    the kernel and with index_select."""
    columns = [ColumnSpec(f"c{i}", d, tuple(s)) for i, (d, s) in enumerate(specs)]
    packed = filled(columns, capacity, seed=len(specs))
    index = torch.tensor(
        data.draw(st.lists(st.integers(0, capacity - 1), max_size=40)), dtype=torch.int64
    )
    for on in (True, False):
        packed_module._ROW_KERNELS = on
        try:
            for spec in columns:
                got = packed.gather_column(index, spec.name)
                assert got.dtype == spec.dtype and same_bytes(got, packed.view(spec.name)[index])
            together = packed.gather_columns(index, [c.name for c in columns[:2]])
            for name, leaf in together.items():
                assert same_bytes(leaf, packed.view(name)[index]), name
        finally:
            packed_module._ROW_KERNELS = True


def test_frames_and_a_chunk_of_actions(kernels):
    """Camera-sized rows: the frames of B rows and the actions of 50 B rows, each its own
    bytes (large gathers take recycled memory)."""
    columns = [
        ColumnSpec("top", torch.uint8, (48, 64, 3)),
        ColumnSpec("state", torch.float32, (14,)),
        ColumnSpec("action", torch.float32, (14,)),
    ]
    packed = filled(columns, 40)
    rows = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(1))
    chunk = (rows.unsqueeze(1) + torch.arange(50)).clamp(max=39).reshape(-1)
    frames = packed.gather_column(rows.repeat(40), "top")  # 1.4 MiB: a recycled buffer
    assert frames.numel() >= RECYCLE_BYTES and same_bytes(
        frames, packed.view("top")[rows.repeat(40)]
    )
    actions = packed.gather_column(chunk, "action")
    assert same_bytes(actions, packed.view("action")[chunk])
    # a small share of the row: the column's own bytes; most of it: whole rows, as views
    small = packed.gather_columns(chunk, ["action", "state"])
    assert all(leaf.is_contiguous() for leaf in small.values())
    big = packed.gather_columns(rows, ["top", "state"])
    assert big["top"].untyped_storage().data_ptr() == big["state"].untyped_storage().data_ptr()
    for name, leaf in small.items():
        assert same_bytes(leaf, packed.view(name)[chunk]), name
    for name, leaf in big.items():
        assert same_bytes(leaf, packed.view(name)[rows]), name


def test_quantised_columns_are_decoded_unless_raw(kernels):
    spec = ColumnSpec("pix", torch.float32, (2,), quantize=Quantize(0.0, 1.0))
    packed = PackedColumns([spec, ColumnSpec("done", torch.bool)], capacity=4)
    packed.write(
        slice(0, 4),
        {
            "pix": torch.tensor([[0, 255]] * 4, dtype=torch.uint8),
            "done": torch.zeros(4, dtype=torch.bool),
        },
    )
    index = torch.tensor([0, 3])
    decoded, raw = packed.gather_column(index, "pix"), packed.gather_column(index, "pix", raw=True)
    assert decoded.dtype == torch.float32 and raw.dtype == torch.uint8
    assert torch.allclose(decoded, torch.tensor([[0.0, 1.0]] * 2))
    assert torch.equal(raw, torch.tensor([[0, 255]] * 2, dtype=torch.uint8))


def test_an_index_outside_the_block_is_refused(kernels):
    packed = filled([ColumnSpec("a", torch.float32, (3,)), ColumnSpec("b", torch.uint8)], 5)
    for bad in (5, -1):
        with pytest.raises(IndexError):
            packed.gather_column(torch.tensor([0, bad]), "a")


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([np.uint8, np.int16, np.int32, np.int64]),
    st.integers(1, 300),
    st.integers(0, 400),
    st.integers(1, 30),
    st.data(),
)
def test_the_slice_kernel_is_numpy_slicing(dtype, row_width, start, capacity, data):
    start = start % row_width
    width = data.draw(st.integers(1, row_width - start))
    source = (np.arange(capacity * row_width) % 251).astype(dtype).reshape(capacity, row_width)
    index = np.array(data.draw(st.lists(st.integers(0, capacity - 1), max_size=60)), dtype=np.int64)
    out = np.full((len(index), width), 7, dtype=dtype)
    assert rowgather.gather_slices(source, index, start, out) == -1
    np.testing.assert_array_equal(out, source[index, start : start + width])
    bad = np.array([0, capacity], dtype=np.int64)
    kept = np.full((2, width), 7, dtype=dtype)
    assert rowgather.gather_slices(source, bad, start, kept) == 1 and (kept == 7).all()
