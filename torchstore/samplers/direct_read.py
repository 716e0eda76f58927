"""A span of a column's chunks read straight into row memory and verified, in one compiled
call that holds no GIL (numba; libc's ``preadv`` and the xxh3 check of
:mod:`torchstore.io.xxh3_rows`).

:class:`~torchstore.samplers.block_read.ChunkReader` reads rows of 4 KiB or more (pixels)
with one iovec a row straight into a window's slot. Through ``os.preadv`` that takes a
Python list of a few hundred row views a span, built and converted while the refill thread
holds the GIL, which the thread sampling batches then waits for. Here the iovecs are
written into an array, the read and the check of every chunk run with no GIL, and Python
is entered once a span. Imported on first use only (numba takes about a second to load).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types

from torchstore.io.xxh3_rows import verify_rows

__all__ = ["read_rows"]

# ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t offset): the iovec
# pointer is passed as a 64-bit integer (the same register on the LP64 ABIs this reader
# runs on: it is used only where ``os.preadv`` exists, which Windows lacks)
_preadv = types.ExternalFunction(
    "preadv", types.int64(types.int32, types.int64, types.int32, types.int64)
)


@numba.njit(cache=True, nogil=True)
def _read_rows(fd, offset, rows, row_bytes, counts, at, trash, sums, ok):  # pragma: no cover
    chunks = counts.shape[0]
    pieces = 0
    for i in range(chunks):
        pieces += counts[i] + (1 if i else 0)
    iov = np.empty((pieces, 2), dtype=np.int64)  # struct iovec: base, length
    k, first = 0, 0
    for i in range(chunks):
        if i:
            gap = at[i] - at[i - 1] - counts[i - 1] * row_bytes
            iov[k, 0] = trash
            iov[k, 1] = gap
            k += 1
        for r in range(counts[i]):
            iov[k, 0] = rows[first + r]
            iov[k, 1] = row_bytes
            k += 1
        first += counts[i]
    got = _preadv(fd, iov.ctypes.data, pieces, offset)
    if got < 0:
        return got
    verify_rows(rows, row_bytes, counts, sums, ok)
    return got


def read_rows(
    fd: int,
    offset: int,
    rows: np.ndarray,
    row_bytes: int,
    counts: np.ndarray,
    at: np.ndarray,
    trash: int,
    sums: np.ndarray,
    ok: np.ndarray,
) -> int:
    """Read chunks of whole rows from file ``fd`` at byte ``offset`` into the rows at
    addresses ``rows``, then check each chunk against its recorded hash.

    Args:
        rows: int64 addresses of the rows in file order; chunk ``i`` is the next
            ``counts[i]`` of them, ``row_bytes`` bytes each.
        at: int64 byte place of each chunk in the read; the bytes between one chunk's end
            and the next one's start land at address ``trash`` (room for the largest gap).
        sums, ok: as :func:`torchstore.io.xxh3_rows.verify_rows` takes them (``ok[i]``:
            chunk ``i`` matched; a chunk the read did not reach fails its check).

    Returns:
        the bytes read (``preadv``'s result: fewer at the end of the file), or -1 when the
        call failed (more iovecs than ``IOV_MAX``, a signal, a closed file: each ``ok`` is
        then left ``False``; ``os.preadv`` raises what it was).
    """
    ok[:] = False
    return int(_read_rows(fd, offset, rows, row_bytes, counts, at, trash, sums, ok))
