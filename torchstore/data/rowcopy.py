"""Compiled CPU kernels for writing rows into a packed block (numba), byte for byte.

A packed block holds every column of a row side by side (see
:mod:`torchstore.data.packed`), so writing a chunk of rows is one strided copy per column:
torch's ``copy_`` of ``[n, 24]`` floats into a view whose rows are 224 bytes apart costs a
few microseconds of dispatch per column and does not stream the destination rows in order.
:func:`copy_rows` fills the destination row by row instead, every column's bytes of a row
one ``memcpy`` after the other, so each destination cache line is written once, whole.
A 1000-row walker chunk (five columns, 221 bytes a row) into a 1 M-row block: the copy
about 0.4-0.5x the five ``copy_`` calls' time, the whole write (the per-column checks
that pick this path included) about 0.8x (one thread, medians on a loaded machine).

Only bytes move: a column's values must already be in its storage dtype with the rows'
bytes contiguous (leading dims may be strided: a ``[time, env]`` chunk that is a transposed
view is read in place). The caller keeps the source tensors alive for the call and checks
bounds; the kernel checks them again and refuses a write outside the block.

:func:`run_start` is the check writers' cursors take: whether an int64 index is
``first + arange(n)`` (one pass, no temporaries).

Imported on first use only (numba takes about a second to load) by
:func:`torchstore.data.packed.row_kernels`, which also decides whether a write may take them
(CPU, not tracing; ``TORCHSTORE_KERNELS=0`` in the environment keeps every write on the
torch path).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["copy_rows", "run_start"]

#: columns of the address table :func:`copy_rows` reads (one table row per column)
ADDRESS, STEP_STRIDE, ENV_STRIDE, OFFSET, WIDTH = range(5)


@intrinsic
def _memcpy(typingctx, dest, src, nbytes):  # pragma: no cover - compiled
    """``memcpy(dest, src, nbytes)`` between two integer addresses."""

    def codegen(context, builder, signature, args):
        byte_ptr = ir.IntType(8).as_pointer()
        dest_ptr = builder.inttoptr(args[0], byte_ptr)
        src_ptr = builder.inttoptr(args[1], byte_ptr)
        cgutils.raw_memcpy(builder, dest_ptr, src_ptr, args[2], 1)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@numba.njit(cache=True, nogil=True)
def _copy_rows(dest, capacity, row_bytes, first, steps, envs, table):  # pragma: no cover
    if first < 0 or steps < 0 or envs < 1 or first + steps * envs > capacity:
        return False
    for c in range(table.shape[0]):
        offset, width = table[c, OFFSET], table[c, WIDTH]
        if offset < 0 or width < 0 or offset + width > row_bytes:
            return False
    row = dest + first * row_bytes
    for t in range(steps):
        for e in range(envs):
            for c in range(table.shape[0]):
                src = table[c, ADDRESS] + t * table[c, STEP_STRIDE] + e * table[c, ENV_STRIDE]
                _memcpy(row + table[c, OFFSET], src, table[c, WIDTH])
            row += row_bytes
    return True


def copy_rows(
    dest: int,
    capacity: int,
    row_bytes: int,
    first: int,
    steps: int,
    envs: int,
    table: np.ndarray,
) -> None:
    """Write ``steps * envs`` rows of a block from ``first`` on, row-major over ``[steps, envs]``.

    Args:
        dest: address of row 0 of the block (``capacity`` rows of ``row_bytes`` bytes).
        first: the first row written.
        steps, envs: the chunk's leading dims (``envs`` is 1 for a plain run of rows).
        table: int64 ``[columns, 5]``: per column the address of its first row's bytes,
            its byte strides along ``steps`` and ``envs``, its byte offset within a block
            row and its width in bytes (:data:`ADDRESS` ... :data:`WIDTH`).

    Raises:
        ValueError: the rows or a column's bytes fall outside the block.
    """
    if not _copy_rows(dest, capacity, row_bytes, first, steps, envs, table):
        raise ValueError(
            f"rows {first}..{first + steps * envs} or the column bytes fall outside a block "
            f"of {capacity} rows of {row_bytes} bytes"
        )


@numba.njit(cache=True, nogil=True)
def _run_start(rows, cap):  # pragma: no cover - compiled
    n = rows.shape[0]
    if n == 0:
        return -1
    first = rows[0]
    if first < 0 or first + n > cap:
        return -1
    for i in range(1, n):
        if rows[i] != first + i:
            return -1
    return first


def run_start(rows: np.ndarray, cap: int) -> int:
    """``rows[0]`` when int64 ``rows`` is ``first + arange(n)`` within ``[0, cap)``, else -1."""
    return int(_run_start(rows, cap))
