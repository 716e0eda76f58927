"""A span of a column's chunks read straight into row memory and verified, in one compiled
call that holds no GIL (numba; libc's ``preadv`` and the xxh3 check of
:mod:`torchstore.io.hdf5.xxh3_rows`).

:class:`~torchstore.data.residency.block_read.ChunkReader` reads rows of 2 KiB or more (pixels)
with one iovec a row straight into a window's slot. Through ``os.preadv`` that takes a
Python list of a few hundred row views a span, built and converted while the refill thread
holds the GIL, which the thread sampling batches then waits for. Here the iovecs are
written into an array, the reads and the check of every chunk run with no GIL, and Python
is entered once a span. Imported on first use only (numba takes about a second to load).
"""

from __future__ import annotations

import numpy as np
from numba import types

from torchstore.io.hdf5.xxh3_rows import verify_rows
from torchstore.kernel_cache import cached_njit

__all__ = ["read_rows"]

# ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t offset): the iovec
# pointer is passed as a 64-bit integer (the same register on the LP64 ABIs this reader
# runs on: it is used only where ``os.preadv`` exists, which Windows lacks)
_preadv = types.ExternalFunction(
    "preadv", types.int64(types.int32, types.int64, types.int32, types.int64)
)


@cached_njit(nogil=True)
def _read_rows(fd, offset, rows, row_bytes, counts, at, sums, ok):  # pragma: no cover
    # chunk by chunk: each chunk is hashed right after its read, while its ~128 KiB are
    # still in the core's cache, and the gaps between chunks are not read. (One read of
    # the whole span, then the hashes, refilled at the same 2.3-2.5 GB/s here; a syscall
    # a chunk costs a few microseconds of a ~50 us chunk.)
    iov = np.empty((counts.max(), 2), dtype=np.int64)  # struct iovec: base, length
    one = np.empty(1, dtype=np.bool_)
    first = 0
    for i in range(counts.shape[0]):
        n = counts[i]
        for r in range(n):
            iov[r, 0] = rows[first + r]
            iov[r, 1] = row_bytes
        got = _preadv(fd, iov.ctypes.data, n, offset + at[i])
        if got < 0:
            return got if i == 0 else at[i]
        if got < n * row_bytes:
            return at[i] + got
        verify_rows(rows[first : first + n], row_bytes, counts[i : i + 1], sums[i : i + 1], one)
        ok[i] = one[0]
        first += n
    return at[-1] + counts[-1] * row_bytes


def read_rows(
    fd: int,
    offset: int,
    rows: np.ndarray,
    row_bytes: int,
    counts: np.ndarray,
    at: np.ndarray,
    sums: np.ndarray,
    ok: np.ndarray,
) -> int:
    """Read chunks of whole rows from file ``fd`` into the rows at addresses ``rows``,
    checking each chunk against its recorded hash as soon as it is read.

    Args:
        offset: the file offset of chunk 0; chunk ``i`` starts ``at[i]`` bytes further
            (int64; the gaps between chunks are not read).
        rows: int64 addresses of the rows in file order; chunk ``i`` is the next
            ``counts[i]`` of them, ``row_bytes`` bytes each.
        sums, ok: as :func:`torchstore.io.hdf5.xxh3_rows.verify_rows` takes them (``ok[i]``:
            chunk ``i`` matched).

    Returns:
        how far the reads got, in bytes from ``offset``: the end of the last chunk, or
        less where a read came back short (end of file) or failed, so that the chunks from
        there on are not counted as read; -1 when the first read failed (a signal, a
        closed file: ``os.preadv`` then raises what it was).
    """
    ok[:] = False
    return int(_read_rows(fd, offset, rows, row_bytes, counts, at, sums, ok))
