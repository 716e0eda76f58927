"""Reading a block of rows of a store column straight from its chunks, the GIL released.

h5py holds the GIL for the whole of a read, so a refill read by h5py on a background thread
stops the thread that samples for as long as it lasts (a 100 MB block: tens of
milliseconds of no batches). A store's columns are unfiltered chunked datasets whose chunks
keep their place in the file once allocated, and each chunk is one checksum block
(:mod:`torchstore.io.checksummed`). So :class:`ChunkReader` reads a block of rows with
``os.preadv`` at the chunks' file offsets (looked up once from the chunk index, runs of
chunks adjacent in the file read in one call) into a small reusable buffer, verifies every
chunk against its xxh3 hash, and copies the rows into their destination (for a window: the
column's strided view of a slot). ``preadv``, the hash and numpy's copy all release the GIL,
and nothing is allocated per read.

Whatever does not fit that layout goes through the store's own verified read
(:meth:`~torchstore.data.TrajectoryStore.read_column`), with the same result: a store of
several files, another HDF5 file driver, a user block, a filtered dataset, a chunk not
allocated, a short read, or a chunk that fails its hash (a live writer rewriting the
last chunk; the store's read retries it and raises
:class:`~torchstore.errors.IntegrityError` for bytes that really changed).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import h5py
import numpy as np

__all__ = ["ChunkReader"]

#: most bytes one ``preadv`` reads (the reusable buffer: small enough that the hash and
#: the copy after the read find the bytes in cache)
MAX_READ_BYTES = 1 << 20


class _Column:
    """One column's chunk geometry and file offsets (``-1``: read through the store)."""

    def __init__(self, table: Any):
        self.table = table
        self.rows = int(table.block_rows)
        self.row_nbytes = int(table.row_nbytes)
        self.chunk_nbytes = self.rows * self.row_nbytes
        self.offsets = np.zeros(0, dtype=np.int64)

    def load_offsets(self, chunks: int) -> None:
        """File offsets of chunks ``0 .. chunks - 1`` (from the dataset's chunk index)."""
        offsets = np.full(chunks, -1, dtype=np.int64)
        dsid = self.table.data.id

        def note(info: Any) -> None:
            c = info.chunk_offset[0] // self.rows
            if c < chunks and info.byte_offset is not None and info.size == self.chunk_nbytes:
                offsets[c] = info.byte_offset

        if hasattr(dsid, "chunk_iter"):
            dsid.chunk_iter(note)
        else:  # h5py < 3.8
            for i in range(dsid.get_num_chunks()):
                note(dsid.get_chunk_info(i))
        self.offsets = offsets


class ChunkReader:
    """Verified reads of rows ``[lo, hi)`` of a store's columns by ``preadv``.

    Args:
        store: an open :class:`~torchstore.data.TrajectoryStore` (anything else is read
            through its ``read_column``).
        names: the columns to read.
        buffer_bytes: size of the reusable read buffer, at most :data:`MAX_READ_BYTES`;
            one smaller than :attr:`chunk_bytes` (0, say) reads everything through the store.
        lock: held around every h5py call (the store's handle is shared).
        stats: a dict to count ``direct_chunks`` and ``store_reads`` in.
    """

    def __init__(
        self,
        store: Any,
        names: list[str],
        *,
        buffer_bytes: int = MAX_READ_BYTES,
        lock: threading.Lock,
        stats: dict | None = None,
    ):
        self.store = store
        self.lock = lock
        self._fd = -1
        self._columns: dict[str, _Column] = {}
        with lock:
            self._open(names)
        #: the largest chunk of the columns read directly: the least buffer that reads them
        self.chunk_bytes = max((c.chunk_nbytes for c in self._columns.values()), default=0)
        self.buffer_bytes = 0
        self.set_buffer(buffer_bytes)
        self._buffer: np.ndarray | None = None
        #: chunks read by ``preadv`` and reads through the store (into ``stats`` when given)
        self.stats = stats if stats is not None else {}
        self.stats.update(direct_chunks=0, store_reads=0)

    def set_buffer(self, nbytes: int) -> None:
        """Size the read buffer (before the first read); under :attr:`chunk_bytes`, every
        read goes through the store."""
        self.buffer_bytes = min(int(nbytes), MAX_READ_BYTES)
        if self.buffer_bytes < self.chunk_bytes or not self._columns:
            self.buffer_bytes = 0
            self._columns.clear()
            self.close()

    def _open(self, names: list[str]) -> None:
        """Find which columns can be read from their chunks; open the file once for them."""
        if not hasattr(os, "preadv"):  # Windows: every read goes through the store
            return
        f = getattr(self.store, "_file", None)
        ds = getattr(self.store, "_ds", None)
        if not isinstance(f, h5py.File) or ds is None or f.userblock_size != 0:
            return
        if f.id.get_access_plist().get_driver() != h5py.h5fd.SEC2:
            return
        for name in names:
            table = ds.columns.get(self.store.column(name).name)
            data = getattr(table, "data", None)
            if data is None or data.chunks is None or data.chunks[0] != table.block_rows:
                continue
            if data.id.get_create_plist().get_nfilters() != 0:
                continue
            self._columns[name] = _Column(table)
        if self._columns:
            fd = os.open(f.filename, os.O_RDONLY)
            st, ref = os.fstat(fd), os.stat(self.store.path)
            if (st.st_dev, st.st_ino) != (ref.st_dev, ref.st_ino):
                os.close(fd)
                self._columns.clear()
                return
            self._fd = fd

    def read(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of column ``name`` into ``out`` (``[hi - lo, *shape]``, any
        strides), verified against the store's checksums."""
        col = self._columns.get(name)
        if (
            col is None
            or hi <= lo
            or out.dtype != col.table.dtype
            or out.shape[1:] != col.table.row_shape
        ):
            self._via_store(name, lo, hi, out, 0)
            return
        committed = int(self.store._rows)
        first, last = lo // col.rows, (hi - 1) // col.rows
        self._offsets(col, last)
        with self.lock:
            sums = col.table._sum_rows(first, last, committed)
        c = first
        while c <= last:
            if c >= len(col.offsets) or col.offsets[c] < 0:
                self._chunk_via_store(col, name, c, lo, hi, out)
                c += 1
                continue
            end = self._run_end(col, c, last)
            self._read_run(col, name, c, end, lo, hi, committed, sums[c - first :], out)
            c = end

    def _offsets(self, col: _Column, last: int) -> None:
        """Make sure the chunk offsets reach chunk ``last`` (the store may have grown)."""
        if last >= len(col.offsets):
            with self.lock:
                col.load_offsets(-(-int(self.store._rows) // col.rows))

    def advise(self, names: list[str], lo: int, hi: int) -> None:
        """Ask the kernel to start reading the chunks of rows ``[lo, hi)`` of ``names`` now
        (``POSIX_FADV_WILLNEED``): a block not in the page cache then has all its reads in
        flight at once instead of one after the other."""
        if self._fd < 0 or hi <= lo or not hasattr(os, "posix_fadvise"):
            return
        for name in names:
            col = self._columns.get(name)
            if col is None:
                continue
            c, last = lo // col.rows, (hi - 1) // col.rows
            self._offsets(col, last)
            while c <= min(last, len(col.offsets) - 1):
                end = self._run_end(col, c, last)
                if col.offsets[c] >= 0:
                    size = (end - c) * col.chunk_nbytes
                    os.posix_fadvise(self._fd, int(col.offsets[c]), size, os.POSIX_FADV_WILLNEED)
                c = end

    def _run_end(self, col: _Column, c: int, last: int) -> int:
        """End (exclusive) of the chunks from ``c`` that lie back to back in the file and
        fit in the buffer."""
        most = max(1, self.buffer_bytes // col.chunk_nbytes)
        end = c + 1
        offsets = col.offsets
        while (
            end <= last and end - c < most and offsets[end] == offsets[end - 1] + col.chunk_nbytes
        ):
            end += 1
        return end

    def _read_run(
        self,
        col: _Column,
        name: str,
        c: int,
        end: int,
        lo: int,
        hi: int,
        committed: int,
        sums: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """Chunks ``c .. end - 1`` in one ``preadv``, each verified, copied in one go."""
        if self._buffer is None:
            self._buffer = np.empty(self.buffer_bytes, dtype=np.uint8)
        a = c * col.rows
        z = min(end * col.rows, committed)
        nbytes = (z - a) * col.row_nbytes
        got = os.preadv(self._fd, [self._buffer[:nbytes]], int(col.offsets[c]))
        rows = self._buffer[:nbytes].view(col.table.dtype).reshape(z - a, *col.table.row_shape)
        bad = []
        for i in range(end - c):
            ca, cz = a + i * col.rows, min(a + (i + 1) * col.rows, committed)
            if got < (cz - a) * col.row_nbytes or not col.table._verified(
                sums[i], rows[ca - a : cz - a]
            ):
                bad.append(c + i)
        self.stats["direct_chunks"] += end - c - len(bad)
        s, e = max(a, lo), min(z, hi)
        out[s - lo : e - lo] = rows[s - a : e - a]  # one copy of the run (GIL released)
        for chunk in bad:  # overwritten with what the store's verified read returns
            self._chunk_via_store(col, name, chunk, lo, hi, out)

    def _chunk_via_store(
        self, col: _Column, name: str, c: int, lo: int, hi: int, out: np.ndarray
    ) -> None:
        s, e = max(c * col.rows, lo), min((c + 1) * col.rows, hi)
        self._via_store(name, s, e, out, s - lo)

    def _via_store(self, name: str, lo: int, hi: int, out: np.ndarray, at: int) -> None:
        if hi > lo:
            with self.lock:
                value = self.store.read_column(name, lo, hi)
            out[at : at + hi - lo] = value
            self.stats["store_reads"] += 1

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1
        self._buffer = None
