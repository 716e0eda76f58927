"""Compiled CPU kernels for writing rows into a packed block (numba), byte for byte.

A packed block holds every column of a row side by side (see
:mod:`torchstore.data.rows.packed`), so writing a chunk of rows is one strided copy per column:
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
:func:`torchstore.data.rows.packed.row_kernels`, which also decides whether a write may take them
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

from torchstore.kernel_cache import cached_njit

__all__ = ["copy_rows", "run_start", "append_rows"]

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


@cached_njit(nogil=True)
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


@cached_njit(nogil=True)
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


#: what :func:`append_rows` answers when it writes nothing
NOT_A_RUN, NOT_COPYABLE = -1, -2
#: block bytes per tile of a multi-env append (see :func:`_copy_tiled`)
_TILE_BYTES = 1 << 18


@intrinsic
def _load_i64(typingctx, address):  # pragma: no cover - compiled
    """The int64 at an integer address."""

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(types.int64), codegen


@intrinsic
def _load_u8(typingctx, address):  # pragma: no cover - compiled
    """The byte at an integer address."""

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(8).as_pointer()))

    return types.uint8(types.int64), codegen


@cached_njit(nogil=True)
def _is_run(address, stride, steps, first):  # pragma: no cover - compiled
    for i in range(steps):
        if _load_i64(address + i * stride) != first + i:
            return False
    return True


@cached_njit(nogil=True)
def _sources_ok(dest, block_end, row_bytes, steps, envs, table):  # pragma: no cover
    """Every column's bytes within a block row, and no source reaching into the block."""
    for c in range(table.shape[0]):
        offset, width = table[c, OFFSET], table[c, WIDTH]
        if offset < 0 or width < 0 or offset + width > row_bytes:
            return False
        address = table[c, ADDRESS]
        reach = (steps - 1) * table[c, STEP_STRIDE] + (envs - 1) * table[c, ENV_STRIDE]
        if address < block_end and dest < address + reach + width:
            return False  # read from the block itself: the torch path orders it
    return True


@cached_njit(nogil=True)
def _find_ends(steps, envs, table, end_rows, counts, stops):  # pragma: no cover - compiled
    for e in range(envs):
        counts[e] = 0
    for t in range(steps):
        for e in range(envs):
            flagged = False
            for r in end_rows:
                src = table[r, ADDRESS] + t * table[r, STEP_STRIDE] + e * table[r, ENV_STRIDE]
                for j in range(table[r, WIDTH]):
                    if _load_u8(src + j) != 0:
                        flagged = True
            if flagged:
                stops[e, counts[e]] = t
                counts[e] += 1


@numba.njit(inline="always")
def _copy_bytes(dest, src, width):  # pragma: no cover - compiled
    """``memcpy`` as 32-, 16-, 8-, 4- and 1-byte moves of constant size (inlined vector
    moves, not a libc call per column of a row): a warm 1000-row walker chunk 0.65x the
    time of the libc calls, a cold one the same; the 32- and 16-byte moves (a 96-byte
    ``obs`` is three, not twelve) made a whole ``rb.extend`` another 8 % faster."""
    i = 0
    while i + 32 <= width:
        _memcpy(dest + i, src + i, 32)
        i += 32
    if i + 16 <= width:
        _memcpy(dest + i, src + i, 16)
        i += 16
    if i + 8 <= width:
        _memcpy(dest + i, src + i, 8)
        i += 8
    if i + 4 <= width:
        _memcpy(dest + i, src + i, 4)
        i += 4
    while i < width:
        _memcpy(dest + i, src + i, 1)
        i += 1


@cached_njit(nogil=True)
def _copy_tiled(base, row_bytes, steps, envs, table):  # pragma: no cover - compiled
    # [time, env] chunks (transposed views of [env, time] data, as torchrl hands them) are
    # read env by env within tiles of time rows: each source is walked in order, and a
    # tile's block rows (about _TILE_BYTES) stay in cache between the env passes. A 1000-row
    # [8 envs, 125 steps] walker chunk (one tile): 0.45x the time of row after row.
    tile = steps if envs == 1 else max(16, _TILE_BYTES // (envs * row_bytes))
    for t0 in range(0, steps, tile):
        t1 = min(t0 + tile, steps)
        for e in range(envs):
            for t in range(t0, t1):
                row = base + (t * envs + e) * row_bytes
                for c in range(table.shape[0]):
                    src = table[c, ADDRESS] + t * table[c, STEP_STRIDE] + e * table[c, ENV_STRIDE]
                    _copy_bytes(row + table[c, OFFSET], src, table[c, WIDTH])


@cached_njit(nogil=True)
def append_rows(
    dest,
    time_capacity,
    row_bytes,
    rows,
    rows_stride,
    steps,
    first,
    envs,
    table,
    end_rows,
    counts,
    stops,
):  # pragma: no cover - compiled
    """A ring append in one pass: check the cursor, find the episode ends, copy the rows.

    The writer's ``steps`` time rows (int64 at address ``rows``, ``rows_stride`` bytes
    apart) must be ``first + arange(steps)`` within ``[0, time_capacity)``; the
    ``steps * envs`` block rows from ``first * envs`` on are then written as
    :func:`copy_rows` writes them (``table`` likewise), after the end flags are read: the
    bool columns at table rows ``end_rows`` (int64), a time row of an env ending an episode
    when any of its flag bytes is set. ``counts[e]`` gets the number of ends in env stream
    ``e`` and ``stops[e, :counts[e]]`` their time rows within the chunk, in order. The
    caller keeps the cursor and the sources alive for the call. The compiled kernel itself:
    the replay writers call it once a write, with no Python wrapper between.

    Returns:
        0 when written; :data:`NOT_A_RUN` (the rows are not that run) or
        :data:`NOT_COPYABLE` (a column's bytes fall outside a block row, a source reaches
        into the block, or a buffer is too small), having written nothing.
    """
    if first < 0 or envs < 1 or steps < 1 or first + steps > time_capacity:
        return NOT_A_RUN
    if not _is_run(rows, rows_stride, steps, first):
        return NOT_A_RUN
    block_end = dest + time_capacity * envs * row_bytes
    if not _sources_ok(dest, block_end, row_bytes, steps, envs, table):
        return NOT_COPYABLE
    for r in end_rows:
        if r < 0 or r >= table.shape[0]:
            return NOT_COPYABLE
    if counts.shape[0] < envs or stops.shape[0] < envs or stops.shape[1] < steps:
        return NOT_COPYABLE
    # the end flags first: a flag column is read before any row it could alias is written
    _find_ends(steps, envs, table, end_rows, counts, stops)
    _copy_tiled(dest + first * envs * row_bytes, row_bytes, steps, envs, table)
    return 0
