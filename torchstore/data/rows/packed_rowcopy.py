"""The compiled row-copy path of packed writes: which values it takes, and their addresses.

:meth:`PackedColumns.write <torchstore.data.rows.packed.PackedColumns.write>` (in
:mod:`torchstore.data.rows.packed`, which decides whether the kernels are on) hands a chunk of
rows here first: :func:`copy_rows` checks which values the kernel of
:mod:`torchstore.data.rows.rowcopy` can copy as raw bytes (storage dtype, the per-row shape,
each row's bytes contiguous, not inside the block itself), builds each block's table of
source addresses and strides, and returns the values left for the ``copy_`` path.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch

__all__ = ["copy_rows"]

_STRIDED = torch.strided


@dataclass(frozen=True, slots=True)
class _ByteColumn:
    """Where a column's bytes sit in a block row, and what a source must look like to be
    copied as bytes (storage dtype, per-row shape, contiguous within a row)."""

    block: int
    offset: int  # bytes
    width: int  # bytes
    dtype: torch.dtype
    shape: tuple[int, ...]
    ndim: int
    inner_strides: tuple[int, ...]
    itemsize: int
    complex: bool  # a conjugate view must be resolved first


def copy_rows(
    packed: Any,
    kernels: ModuleType,
    start: int,
    count: int,
    values: Mapping[str, torch.Tensor],
) -> Mapping[str, torch.Tensor]:
    """Copy rows ``[start, start + count)`` of ``packed``'s columns that ``kernels`` (the
    :mod:`torchstore.data.rows.rowcopy` module) can take, one call per block; returns the
    columns left for the ``copy_`` path."""
    columns = packed._byte_columns
    sources = []
    envs = 1  # the chunk's [steps, envs] split: the first value not walked by one stride
    for name, value in values.items():
        column = columns.get(name)
        source = None if column is None else _byte_source(value, column, count)
        if source is not None:
            sources.append((name, column, source))
            if envs == 1:
                envs = max(source[1], 1)
    if not sources:
        return values
    steps = count // envs
    rest = dict(values)
    tables: dict[int, list[list[int]]] = {}
    for name, column, (address, lead_envs, step, env) in sources:
        if lead_envs == 0:  # one stride over every row: any [steps, envs] split of them
            step = env * envs
        elif lead_envs != envs:
            continue
        tables.setdefault(column.block, []).extend(
            (address, step, env, column.offset, column.width)
        )
        del rest[name]
    bases = {}
    for b, table in tables.items():
        block = packed.blocks[b]
        base = bases[b] = block.data_ptr()
        if not block.is_contiguous() or _overlaps(
            table, steps, envs, base, base + packed.capacity * packed.row_bytes
        ):
            return values  # rows read from the block itself: copy_ orders them
    for b, table in tables.items():
        words = np.frombuffer(array("q", table), dtype=np.int64).reshape(-1, 5)
        kernels.copy_rows(bases[b], packed.capacity, packed.row_bytes, start, steps, envs, words)
    return rest


def _byte_source(value: object, column: _ByteColumn, count: int) -> tuple[int, ...] | None:
    """``(address, envs, step stride, env stride)`` (strides in bytes) of a value the row
    kernel can copy as bytes, else None. ``envs`` is 0 when one stride walks every row
    (``env stride`` is it), else the value's ``[steps, envs]`` lead."""
    if (
        type(value) is not torch.Tensor
        or value.dtype is not column.dtype
        or value.requires_grad
        or not value.is_cpu
        or value.layout is not _STRIDED
        or value.is_neg()
        or (column.complex and value.is_conj())
    ):
        return None
    shape = value.shape
    lead = len(shape) - column.ndim
    if lead == 1:
        if shape[0] != count:
            return None
    elif lead != 2 or shape[0] * shape[1] != count:
        return None
    if column.ndim and tuple(shape)[lead:] != column.shape:
        return None
    if value.is_contiguous():  # the common case: rows back to back
        return value.data_ptr(), 0, 0, column.width
    return _strided_source(value, column, lead)


def _strided_source(value: torch.Tensor, column: _ByteColumn, lead: int) -> tuple[int, ...] | None:
    """:func:`_byte_source` of a value that is not contiguous (rows' bytes must still be)."""
    shape, strides = value.shape, value.stride()
    if strides[lead:] != column.inner_strides and not _dense_rows(shape[lead:], strides[lead:]):
        return None
    size = column.itemsize
    if lead == 1 or shape[1] == 1:
        return value.data_ptr(), 0, 0, strides[0] * size
    if shape[0] == 1 or strides[0] == shape[1] * strides[1]:
        return value.data_ptr(), 0, 0, strides[1] * size
    return value.data_ptr(), shape[1], strides[0] * size, strides[1] * size


def _dense_rows(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a row of ``shape`` with element ``strides`` is contiguous (size-1 dims free)."""
    step = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def _overlaps(table: list[int], steps: int, envs: int, start: int, end: int) -> bool:
    """Whether a source of a flat address table (5 numbers a column) reaches into
    the bytes ``[start, end)``."""
    for c in range(0, len(table), 5):
        address, step, env, _, width = table[c : c + 5]
        if address < end and start < address + (steps - 1) * step + (envs - 1) * env + width:
            return True
    return False
