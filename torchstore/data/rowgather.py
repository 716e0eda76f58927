"""Compiled CPU gather of scattered rows of a packed block (numba), with software prefetch.

A sampled batch is rows spread over the whole block: hundreds of MiB at a million walker
rows, so nearly every row is a cache and TLB miss. ``torch.index_select`` copies one row
after the other and waits for each row's memory in turn. :func:`gather_rows` asks for the
cache lines of the row ``AHEAD`` positions further on before it copies the current one, so
about that many rows' misses are in flight at once. Measured here (4096 of 1 M rows of 224
bytes, one thread, interleaved medians): ``index_select`` 329 us, this copy without
prefetch 402 us, with prefetch 8 rows ahead 238 us, 16 ahead 226 us, 32 ahead 258 us.
In ``benchmarks/sampling.py``, next to the other cases: 0.7-0.8x ``index_select`` for the
walker row, 0.82-0.9x for an 84x84x3 image row (there the copy itself is most of the time;
its first 512 bytes are asked for, the hardware prefetcher streams the rest).

For a small batch the cost is the call itself: with numpy arrays in and out there is no
tensor made per call but the one the caller wraps (a 256-row gather of 36-byte rows is
about half an ``index_select`` call).

:func:`prefetch` is the hint itself, shared with the sampling kernels (the sum-tree
descent). Imported on first use only (numba takes about a second to load), through
:func:`torchstore.data.packed.gather_kernels`.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch", "gather_rows", "AHEAD", "PREFETCH_BYTES"]

#: rows ahead whose lines the gather asks for before copying the current row
AHEAD = 16
#: bytes of a row's start asked for ahead; the hardware prefetcher streams the rest of a
#: long row (an image row) once its first lines are read
PREFETCH_BYTES = 512
_LINE = 64


@intrinsic
def prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """Ask the CPU to start loading the cache line of ``array[index]`` (a 1-D array): a
    hint only (it never faults and yields no value)."""

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, array_type, data, [args[1]], wraparound=False
        )
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(array, index), codegen


@numba.njit(cache=True, nogil=True)
def gather_rows(src, index, out):  # pragma: no cover - compiled
    """``out[i] = src[index[i]]`` for C-contiguous 2-D ``src`` and ``out`` of one dtype and
    a 1-D int64 ``index`` (callable from Python and from other kernels). Returns -1, or
    the position of the first index outside ``[0, len(src))`` (then nothing was written)."""
    rows, width = src.shape[0], src.shape[1]
    flat = src.reshape(-1)
    n = index.shape[0]
    for i in range(n):  # every index checked before anything is read
        if index[i] < 0 or index[i] >= rows:
            return i
    step = max(_LINE // src.itemsize, 1)
    span = min(width, max(PREFETCH_BYTES // src.itemsize, 1))
    for i in range(n):
        if i + AHEAD < n:
            base = index[i + AHEAD] * width
            for c in range(0, span, step):
                prefetch(flat, base + c)
            prefetch(flat, base + span - 1)  # a row straddling one more line
        r = index[i]
        for j in range(width):
            out[i, j] = src[r, j]
    return -1
