"""Compiled CPU gather of scattered rows of a packed block (numba), with software prefetch.

A sampled batch is rows spread over the whole block: hundreds of MiB at a million walker
rows, so nearly every row is a cache and TLB miss. ``torch.index_select`` copies one row
after the other and waits for each row's memory in turn. :func:`gather_rows` asks for the
cache lines of the row ``AHEAD`` positions further on before it copies the current one, so
about that many rows' misses are in flight at once. Measured here with the hint into L1
(4096 of 1 M rows of 224 bytes, one thread, interleaved medians): ``index_select`` 329 us,
this copy without prefetch 402 us, 8 rows ahead 238 us, 16 ahead 226 us, 32 ahead 258 us.

The hint asks for the lines into L2 only (:func:`prefetch_to_l2`): a row asked for 16 rows
early is 64 lines in flight, more than L1 has miss buffers for, and a hint into L1 waits for
one. Measured side by side (the same 4096 of 1 M rows, a 13 MB read between calls, 16 rows
ahead): the L1 hint 228 us, the L2 hint 184 us, ``index_select`` 294 us; for an 84x84x3 row
(256 of 20,000) the two hints are alike (the copy is bandwidth bound there: 0.72-0.77x
``index_select`` into a preallocated batch, about 0.9x next to the other cases of
``benchmarks/sampling.py``). Its first 512 bytes are asked for; the hardware prefetcher
streams the rest of a long row.

For a small batch the cost is the call itself: with numpy arrays in and out there is no
tensor made per call but the one the caller wraps (a 256-row gather of 36-byte rows is
about half an ``index_select`` call).

:func:`prefetch` (into every level) serves the sampling kernels: the sum-tree descent reads
each line it asked for a few draws later (there the L2 hint measured the same, 396 against
397 us for a cold 4096-draw descent at 1 M leaves). Imported on first use only (numba takes
about a second to load), through :func:`torchstore.data.rows.packed.gather_kernels`.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from torchstore.kernel_cache import cached_njit

__all__ = ["prefetch", "prefetch_to_l2", "gather_rows", "gather_slices", "AHEAD", "PREFETCH_BYTES"]

#: rows ahead whose lines the gather asks for before copying the current row
AHEAD = 16
#: bytes of a row's start asked for ahead; the hardware prefetcher streams the rest of a
#: long row (an image row) once its first lines are read
PREFETCH_BYTES = 512
_LINE = 64


def _prefetch_intrinsic(name: str, locality: int, doc: str):
    """A numba intrinsic ``name(array, index)`` asking the CPU to start loading the cache
    line of ``array[index]`` (a 1-D array) with LLVM's ``locality`` hint (3: into every
    level, 2: into L2 and below): a hint only (it never faults and yields no value)."""

    def typer(typingctx, array, index):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            data = context.make_array(array_type)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(
                context, builder, array_type, data, [args[1]], wraparound=False
            )
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [ptr, i32(0), i32(locality), i32(1)])  # read, data
            return context.get_dummy_value()

        return types.void(array, index), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


prefetch = _prefetch_intrinsic(
    "prefetch", 3, "Start loading the cache line of ``array[index]`` into every cache level."
)
prefetch_to_l2 = _prefetch_intrinsic(
    "prefetch_to_l2",
    2,
    "Start loading the cache line of ``array[index]`` into L2 (not L1): for data read a "
    "few dozen lines later, so the hints do not crowd L1's few miss buffers.",
)


@cached_njit(nogil=True)
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
                prefetch_to_l2(flat, base + c)
            prefetch_to_l2(flat, base + span - 1)  # a row straddling one more line
        r = index[i]
        for j in range(width):
            out[i, j] = src[r, j]
    return -1


@cached_njit(nogil=True)
def gather_slices(src, index, start, out):  # pragma: no cover - compiled
    """``out[i] = src[index[i], start : start + out.shape[1]]``: one column of scattered
    rows, for C-contiguous 2-D ``src`` and ``out`` of one dtype (a block's bytes and the
    column's). Only the column's bytes are read, with the same prefetch as
    :func:`gather_rows`, so an action chunk of 50 steps from a block that also holds camera
    frames reads 50 action slices and never a frame. Returns -1, or the position of the
    first index outside ``[0, len(src))`` (then nothing was written)."""
    rows, row_width = src.shape[0], src.shape[1]
    width = out.shape[1]
    flat = src.reshape(-1)
    n = index.shape[0]
    for i in range(n):
        if index[i] < 0 or index[i] >= rows:
            return i
    step = max(_LINE // src.itemsize, 1)
    span = min(width, max(PREFETCH_BYTES // src.itemsize, 1))
    for i in range(n):
        if i + AHEAD < n:
            base = index[i + AHEAD] * row_width + start
            for c in range(0, span, step):
                prefetch_to_l2(flat, base + c)
            prefetch_to_l2(flat, base + span - 1)
        at = index[i] * row_width + start
        for j in range(width):
            out[i, j] = flat[at + j]
    return -1
