"""Reading a block of rows of a store column straight from its chunks, the GIL released.

h5py holds the GIL for the whole of a read, so a refill read by h5py on a background thread
stops the thread that samples for as long as it lasts (a 100 MB block: tens of
milliseconds of no batches). A store's columns are unfiltered chunked datasets whose chunks
keep their place in the file once allocated, and each chunk is one checksum block
(:mod:`torchstore.io.hdf5.checksummed`). So :class:`ChunkReader` reads a block of rows with
``os.preadv`` at the chunks' file offsets (looked up once from the chunk index, runs of
chunks adjacent in the file read in one call) into a small reusable buffer, verifies every
chunk against its xxh3 hash, and copies the rows into their destination (for a window: the
column's strided view of a slot). ``preadv``, the hash and numpy's copy all release the GIL,
and nothing is allocated per read.

A store opened by URL (a ``RangedFile`` under h5py's file-object driver) is read the same
way, each span's bytes from a range request through the file's cache instead of
``preadv``; the window's hint for its next blocks fetches their chunks ahead, in the
background (:class:`_RemoteAhead`).

Whatever does not fit that layout goes through the store's own verified read
(:meth:`~torchstore.data.TrajectoryStore.read_column`), with the same result: a store of
several files, another HDF5 file driver, a user block, a filtered dataset, a chunk not
allocated, a short read, or a chunk that fails its hash (a live writer rewriting the
last chunk; the store's read retries it and raises
:class:`~torchstore.errors.IntegrityError` for bytes that really changed).
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from torchstore.data.file.encoded import (
    decode_pool,
    decode_threads,
    split_runs,
    submit_pieces,
    wait_all,
)
from torchstore.data.file.layout import PACKET_EXTRA, PACKET_NBYTES, PACKET_OFFSET
from torchstore.io.frames.decode_device import check_decode_device
from torchstore.io.frames.resize import FrameResize
from torchstore.io.hdf5.checksummed import chunk_file_offsets
from torchstore.io.hdf5.files import file_object_of

__all__ = ["ChunkReader"]

#: most bytes one ``preadv`` reads (the reusable buffer: small enough that the hash and
#: the copy after the read find the bytes in cache)
MAX_READ_BYTES = 1 << 20

#: a column whose rows hold this many bytes or more is read straight into its
#: destination's rows (one iovec a row), without the buffer's copy, by the compiled read
#: (:mod:`torchstore.data.residency.direct_read`). Measured on windows over 2 KiB rows: refills
#: 1.8-2.1 GB/s straight against 1.3-1.6 GB/s through the buffer, 1.2-1.3x the batches/s;
#: 512-byte rows refilled slower straight (1.0 against 1.2 GB/s), an iovec a row costing
#: more than the copy it saves.
DIRECT_ROW_BYTES = 2048
#: the same with the compiled kernels off: ``os.preadv`` of a list of row views and a
#: Python call per row to hash them cost more, so only rows of 4 KiB or more go straight
DIRECT_ROW_BYTES_UNCOMPILED = 4096

#: the largest gap between two chunks of a column that a read spans (reading it costs
#: less than another system call)
MAX_GAP_BYTES = 16 << 10

#: decode pieces a thread gets of a window's block (a store's own threaded read of a run
#: cuts it finer, :data:`~torchstore.data.file.encoded.PIECES_PER_THREAD`: there the last,
#: slowest piece ends the read with a core idle). A window starts its next block's read
#: while a block's last pieces decode (``BlockWindow._read_early``), so short pieces buy
#: no busy cores there, and each costs a task and a decoder flush. Measured on the
#: 480x640 + 240x320 AV1 window at reuse 1 (GOP 2, 150-row blocks, 2 cores, quiet): the
#: cores 1.96-1.97 busy either way, 8 a thread took 3-4 % less CPU a row than 32 (three
#: runs in turn; medians 1.09x against 1.13x one thread's sequential decode, 470-474 rows/s
#: against 447-460)
REFILL_PIECES_PER_THREAD = 8

#: whether direct reads may take the compiled read (``TORCHSTORE_KERNELS=0`` turns it off)
KERNELS = os.environ.get("TORCHSTORE_KERNELS", "1") != "0"

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

#: the page size, the distances within a page between a copy's source and destination
#: that ``rep movsb`` crawls over (1 .. _SLOW - 1), and a landing's lead (see _landing)
_PAGE = 4096
_SLOW = 32
_LEAD = 64


def _compiled_read_on() -> bool:
    """Whether direct reads take the compiled read: the kernel switch is on
    (:data:`KERNELS`; ``TORCHSTORE_KERNELS=0`` in the environment turns it off, as it does
    the samplers' and the row writes' kernels) and the read has not failed to build here."""
    return KERNELS and not _DIRECT_FAILED


def _direct_kernels() -> Any:
    """:mod:`torchstore.data.residency.direct_read` while :func:`_compiled_read_on`, else None;
    numba is imported on first use."""
    if not _compiled_read_on():
        return None
    from torchstore.data.residency import direct_read

    return direct_read


_DIRECT_FAILED: list[str] = []  # why the compiled read could not run here (once said)


def _direct_failed(exc: Exception) -> None:
    """The compiled read raised (it could not be built here: no ``preadv`` symbol to link,
    say): warn once, and read through ``os.preadv`` from now on."""
    _DIRECT_FAILED.append(f"{type(exc).__name__}: {exc}")
    warnings.warn(
        "torchstore: window refills read through os.preadv, the compiled read failed "
        f"({_DIRECT_FAILED[0][:300]})",
        RuntimeWarning,
        stacklevel=3,
    )


def _byte_rows(out: np.ndarray) -> np.ndarray | None:
    """``out`` (``[n, *shape]``) as ``[n, row bytes]`` uint8 rows, a view; ``None`` when a
    row's bytes are not contiguous."""
    if out.ndim == 0 or (out.shape[0] and not out[:1].flags.c_contiguous):
        return None
    # inner dimensions contiguous: reshape returns a view (it copies only when it must)
    return out.reshape(out.shape[0], -1).view(np.uint8)


def _items(rows: np.ndarray) -> np.ndarray:
    """Byte rows ``[n, w]`` as ``[n]`` items of ``w`` bytes, a view: numpy copies an item
    in one ``memcpy`` (measured for strided 68-byte rows: 10.6 GB/s, against 5.5 GB/s as
    17 words and 5.9 GB/s as 68 bytes; 4-byte rows 1.9 GB/s against 0.34 as bytes)."""
    return rows.view(_item_dtype(rows.shape[1]))[:, 0]


@functools.lru_cache(maxsize=64)
def _item_dtype(width: int) -> np.dtype:
    return np.dtype((np.void, width))


class _Column:
    """One column's chunk geometry and file offsets (``-1``: read through the store)."""

    def __init__(self, table: Any):
        self.table = table
        self.rows = int(table.block_rows)
        self.row_nbytes = int(table.row_nbytes)
        self.chunk_nbytes = self.rows * self.row_nbytes
        self.offsets = np.zeros(0, dtype=np.int64)
        #: read straight into the destination's rows (see ChunkReader.set_buffer)
        self.direct = False

    def load_offsets(self, chunks: int) -> None:
        """File offsets of chunks ``0 .. chunks - 1`` (from the dataset's chunk index)."""
        self.offsets = chunk_file_offsets(self.table.data, self.rows, chunks)


class ChunkReader:
    """Verified reads of rows ``[lo, hi)`` of a store's columns by ``preadv`` (by range
    requests for a store opened by URL).

    Args:
        store: an open :class:`~torchstore.data.TrajectoryStore` (anything else is read
            through its ``read_column``).
        names: the columns to read.
        buffer_bytes: size of the reusable read buffer, at most :data:`MAX_READ_BYTES`;
            one smaller than :attr:`chunk_bytes` (0, say) reads everything through the store.
        lock: held around every h5py call (the store's handle is shared).
        stats: a dict to count ``direct_chunks`` and ``store_reads`` in (and, from a URL,
            ``ahead_bytes``: the distinct bytes of the chunk and packet spans fetched ahead).
        resize: ``{column: FrameResize}``: camera columns kept at training resolution,
            cropped and resized as they are decoded (or, kept raw, as they are read), so
            their destinations have the resized shape.
        decode_device: where video frames are decoded, ``"cpu"`` or ``"cuda"`` (see
            :mod:`torchstore.io.frames.decode_device`).
    """

    def __init__(
        self,
        store: Any,
        names: list[str],
        *,
        buffer_bytes: int = MAX_READ_BYTES,
        lock: threading.Lock,
        stats: dict | None = None,
        resize: Mapping[str, FrameResize] | None = None,
        decode_device: str = "cpu",
    ):
        self.store = store
        self.lock = lock
        #: a store opened by URL: the chunks of the blocks to come are fetched ahead
        self._remote: _RemoteAhead | None = None
        self.resize = dict(resize or {})
        self.decode_device = check_decode_device(decode_device)
        self._fd = -1
        self._columns: dict[str, _Column] = {}
        with lock:
            self._open(names)
        #: the largest chunk of the columns read directly: the least buffer that reads them
        self.chunk_bytes = max((c.chunk_nbytes for c in self._columns.values()), default=0)
        self.buffer_bytes = 0
        self.set_buffer(buffer_bytes)
        self._buffer: np.ndarray | None = None
        self._buffer_at = 0  # its address
        #: held by a read while it uses the buffer and submits its decoding (see read_block)
        self._reading = threading.Lock()
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
        least = DIRECT_ROW_BYTES if _compiled_read_on() else DIRECT_ROW_BYTES_UNCOMPILED
        for col in self._columns.values():
            # a direct read holds the rows of its first and last chunk that are not asked
            # for, and the gaps, in the buffer
            room = 2 * col.chunk_nbytes + min(MAX_GAP_BYTES, col.chunk_nbytes // 8)
            col.direct = (
                self._remote is None and col.row_nbytes >= least and self.buffer_bytes >= room
            )

    def _open(self, names: list[str]) -> None:
        """Find which columns can be read from their chunks; open the file once for them."""
        f = getattr(self.store, "_file", None)
        ds = getattr(self.store, "_ds", None)
        if not isinstance(f, h5py.File) or ds is None or f.userblock_size != 0:
            return
        ranged = file_object_of(f)
        remote = ranged is not None and hasattr(ranged, "fetch_spans")
        if remote:
            # a store opened by URL: the same chunk reads, their bytes by range requests
            # (through the file's cache) instead of preadv, and fetched ahead (advise)
            self._remote = _RemoteAhead(self, ranged, ds, names)
        elif not hasattr(os, "preadv"):  # Windows: every read goes through the store
            return
        elif f.id.get_access_plist().get_driver() != h5py.h5fd.SEC2:
            return
        for name in names:
            if self.store.column(name).codec is not None:
                continue  # packets, not rows: decoded through the store (see _via_store)
            table = ds.columns.get(self.store.column(name).name)
            data = getattr(table, "data", None)
            if data is None or data.chunks is None or data.chunks[0] != table.block_rows:
                continue
            if data.id.get_create_plist().get_nfilters() != 0:
                continue
            self._columns[name] = _Column(table)
        if self._columns and not remote:
            fd = os.open(f.filename, os.O_RDONLY)
            st, ref = os.fstat(fd), os.stat(self.store.path)
            if (st.st_dev, st.st_ino) != (ref.st_dev, ref.st_ino):
                os.close(fd)
                self._columns.clear()
                return
            self._fd = fd

    def read_block(self, lo: int, hi: int, outs: Mapping[str, np.ndarray]) -> None:
        """Rows ``[lo, hi)`` of every column of ``outs`` into its array (as :meth:`read`),
        the decoding of every camera at once: the packets of each encoded column are read
        first (under the lock, in one read each), then all their pieces (runs cut at
        keyframes) go to the decode threads together, as do the resizes of raw camera
        columns, while this thread reads the plain columns. So no core waits for the
        slowest piece of one camera while another camera has pieces left.

        Frames are decoded straight into ``outs`` when each frame of it is contiguous
        (a window slot's camera rows, which lie between the other columns' bytes), else
        into an array of their own, copied after. Reads from several threads take turns
        until their pieces are submitted, then wait for them together: a second read's
        pieces queue behind the first's, so the decode threads go from one block to the
        next without a gap (the window starts its next read early for that)."""
        jobs: list = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        try:
            with self._reading:  # the buffer is this reader's, one read at a time
                self._submit_block(lo, hi, outs, jobs, copies)
        finally:
            wait_all(jobs)  # every job ends before an error (theirs or this thread's) is raised
        for out, target in copies:
            out[...] = target

    def _submit_block(
        self,
        lo: int,
        hi: int,
        outs: Mapping[str, np.ndarray],
        jobs: list,
        copies: list[tuple[np.ndarray, np.ndarray]],
    ) -> None:
        """:meth:`read_block` up to the wait: encoded columns' pieces and raw camera
        columns' resizes into ``jobs``, plain columns read; ``copies``: ``(out, target)``
        for the frames decoded into an array of their own."""
        threads = decode_threads()
        encoded = hasattr(self.store, "read_packet_runs")
        decoded: dict[str, tuple[list, np.ndarray]] = {}  # column -> (its runs, the target)
        for name, out in outs.items():
            if hi > lo and encoded and self.store.column(name).codec is not None:
                with self.lock:
                    runs = self.store.read_packet_runs(name, lo, hi)
                target = out if _frames_contiguous(out) else np.empty(out.shape, np.uint8)
                if target is not out:
                    copies.append((out, target))
                decoded[name] = (runs, target)
        # pieces sized over every camera's frames together: the threads' shares even
        # out to the end of the block, with as few decoder flushes as that allows
        frames = sum(len(r.packets) for runs, _ in decoded.values() for r in runs)
        for name, (runs, target) in decoded.items():
            pieces = split_runs(runs, threads, frames, REFILL_PIECES_PER_THREAD)
            spec, resize = self.store.column(name), self.resize.get(name)
            jobs += submit_pieces(spec, pieces, target, threads, resize, self.decode_device)
            self.stats["decoded_reads"] = self.stats.get("decoded_reads", 0) + 1
        for name, out in outs.items():
            resize = self.resize.get(name)
            if hi <= lo or name in decoded:
                continue
            if resize is not None:
                full = np.empty((hi - lo, *self.store.column(name).shape), out.dtype)
                self._read_plain(name, lo, hi, full)
                jobs += _resize_jobs(resize, full, out, threads)
            else:
                self._read_plain(name, lo, hi, out)

    def after_fork_in_child(self) -> None:
        """In a forked child: a read lock of its own. A refill thread of the parent may have
        held it while the process was copied (between two reads under the store's lock,
        say); that thread does not exist here, and the child's first read would wait for
        it for ever."""
        self._reading = threading.Lock()

    def read(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of column ``name`` into ``out`` (``[hi - lo, *shape]``, any
        strides; a resized camera column's resized shape), verified against the store's
        checksums."""
        if name in self.resize:
            self.read_block(lo, hi, {name: out})
            return
        with self._reading:
            self._read_plain(name, lo, hi, out)

    def _read_plain(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
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
        rows = _byte_rows(out)
        items = None if rows is None or col.direct else _items(rows)
        c = first
        while c <= last:
            if c >= len(col.offsets) or col.offsets[c] < 0:
                self._chunk_via_store(col, name, c, lo, hi, out)
                c += 1
                continue
            end = self._span_end(col, c, last, None if col.direct else self.buffer_bytes)
            self._read_span(
                col, name, c, end, lo, hi, committed, sums[c - first :], out, rows, items
            )
            c = end

    def _offsets(self, col: _Column, last: int) -> None:
        """Make sure the chunk offsets reach chunk ``last`` (the store may have grown)."""
        if last >= len(col.offsets):
            with self.lock:
                col.load_offsets(-(-int(self.store._rows) // col.rows))

    @property
    def ahead_phases(self) -> int:
        """How many phase changes ahead the window hints its blocks (:meth:`advise`): one
        from a local file (the kernel reads a block well within a phase); more from a URL,
        whose blocks each wait a round trip plus their transfer (see :class:`_RemoteAhead`)."""
        return 1 if self._remote is None else self._remote.phases

    def advise(self, names: list[str], lo: int, hi: int) -> None:
        """Ask the kernel to start reading the chunks of rows ``[lo, hi)`` of ``names`` now
        (``POSIX_FADV_WILLNEED``): a block not in the page cache then has all its reads in
        flight at once instead of one after the other. A store opened by URL: fetch them
        into its cache in the background instead (see :class:`_RemoteAhead`)."""
        if self._remote is not None and hi > lo:
            self._remote.advise(names, lo, hi)
            return
        if self._fd < 0 or hi <= lo or not hasattr(os, "posix_fadvise"):
            return
        for name in names:
            col = self._columns.get(name)
            if col is None:
                continue
            c, last = lo // col.rows, (hi - 1) // col.rows
            self._offsets(col, last)
            while c <= min(last, len(col.offsets) - 1):
                end = self._span_end(col, c, last, None)
                if col.offsets[c] >= 0:
                    size = int(col.offsets[end - 1]) + col.chunk_nbytes - int(col.offsets[c])
                    os.posix_fadvise(self._fd, int(col.offsets[c]), size, os.POSIX_FADV_WILLNEED)
                c = end

    def _span_end(self, col: _Column, c: int, last: int, limit: int | None) -> int:
        """End (exclusive) of the span of chunks from ``c`` read in one ``preadv``: chunks
        in file order, each at most :data:`MAX_GAP_BYTES` (and an eighth of a chunk) past
        the one before (a store's chunks sit on 4 KiB boundaries, a few KiB apart), the
        whole span at most ``limit`` bytes (``None``: no limit), at most ``IOV_MAX``
        iovecs for a direct read."""
        offsets = col.offsets
        if offsets[c] < 0:
            return c + 1
        gap = min(MAX_GAP_BYTES, col.chunk_nbytes // 8)
        most = last + 1
        if col.direct:
            most = min(most, c + max(1, _IOV_MAX // (col.rows + 1)))
        first = int(offsets[c])
        tail = first + col.chunk_nbytes
        end = c + 1
        while end < most:
            at = int(offsets[end])
            if at < tail or at - tail > gap:
                break
            if limit is not None and at + col.chunk_nbytes - first > limit:
                break
            tail = at + col.chunk_nbytes
            end += 1
        return end

    def _read_span(
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
        out_rows: np.ndarray | None,
        out_items: np.ndarray | None,
    ) -> None:
        """Chunks ``c .. end - 1`` (and the small gaps between them) in one ``preadv``, each
        chunk verified.

        Rows of a direct column (:data:`DIRECT_ROW_BYTES` or more a row) land straight in
        ``out``, one iovec a row (the span's rows outside ``[lo, hi)`` and the gaps land in
        the buffer), and are hashed where they lie. Other rows land in the buffer and are
        copied chunk by chunk. ``out_rows``, ``out_items``: ``out`` as byte rows
        (:func:`_byte_rows`) and as row items (:func:`_items`)."""
        if self._buffer is None:
            self._buffer = np.empty(self.buffer_bytes + _PAGE + 2 * _LEAD, dtype=np.uint8)
            self._buffer_at = self._buffer.__array_interface__["data"][0]
        a = c * col.rows
        z = min(end * col.rows, committed)
        s, e = max(a, lo), min(z, hi)
        rnb = col.row_nbytes
        first = int(col.offsets[c])
        if end == c + 1:  # most spans: one chunk
            at, counts = [0], [z - a]
        else:  # each chunk's place in the read, and its rows
            at = (col.offsets[c:end] - first).tolist()
            counts = [min(col.rows, z - a - i * col.rows) for i in range(end - c)]
        dst = None if out_rows is None else out_rows[s - lo : e - lo]
        direct = col.direct and dst is not None
        matched = None
        if direct:
            got, matched = self._read_direct(col, first, dst, s - a, z - e, at, counts, sums)
        else:
            # the copy's destination at the span's first row, where one memcpy a chunk
            # lands there (contiguous rows; see _landing)
            to = None
            if dst is not None and dst.strides[0] == rnb:
                to = dst.__array_interface__["data"][0] - (s - a) * rnb
            landing = self._landing(first, at[-1] + counts[-1] * rnb, to)
            got = self._pread(landing, first)
        bad = []
        for i in range(end - c):
            ca, n = a + i * col.rows, counts[i]
            if got < at[i] + n * rnb:
                ok = False
            elif matched is not None:
                ok = bool(matched[i])
            else:
                chunk = landing[at[i] : at[i] + n * rnb].reshape(n, rnb)
                ok = col.table._verified(sums[i], chunk)
                x, y = max(ca, s), min(ca + n, e)
                if ok and x < y:  # this chunk's rows of [lo, hi): one copy, GIL released
                    if dst is not None:
                        out_items[x - lo : y - lo] = _items(chunk)[x - ca : y - ca]
                    else:
                        typed = chunk.view(col.table.dtype).reshape(n, *col.table.row_shape)
                        out[x - lo : y - lo] = typed[x - ca : y - ca]
            if not ok:
                bad.append(c + i)
        self.stats["direct_chunks"] += end - c - len(bad)
        for chunk in bad:  # what the store's verified read returns instead
            self._chunk_via_store(col, name, chunk, lo, hi, out)

    def _pread(self, landing: np.ndarray, offset: int) -> int:
        """Fill ``landing`` from the file at ``offset``: ``preadv`` for a local file, one
        range (from the cache, or fetched) for a store opened by URL; the bytes read."""
        if self._remote is None:
            return os.preadv(self._fd, [landing], offset)
        (data,) = self._remote.ranged.fetch_spans([(offset, offset + len(landing))])
        landing[: len(data)] = np.frombuffer(data, np.uint8)
        return len(data)

    def _direct_parts(
        self, col: _Column, dst: np.ndarray, head: int, tail: int, at: list, counts: list
    ) -> tuple[list, list]:
        """A direct read's rows in file order (``head`` rows before ``dst``'s and ``tail``
        after them in the buffer) and its iovecs: the rows, and the gaps between chunks
        (``at``: each chunk's place in the read) in the buffer past them."""
        rnb = col.row_nbytes
        spare = self._buffer[: (head + tail) * rnb].reshape(-1, rnb)
        trash = self._buffer[(head + tail) * rnb :]
        rows = [*spare[:head], *dst, *spare[head:]]
        parts = rows[: counts[0]]
        for i in range(1, len(at)):
            gap = at[i] - at[i - 1] - col.chunk_nbytes
            if gap:
                parts.append(trash[:gap])
            parts.extend(rows[i * col.rows : i * col.rows + counts[i]])
        return rows, parts

    def _read_direct(
        self,
        col: _Column,
        first: int,
        dst: np.ndarray,
        head: int,
        tail: int,
        at: list,
        counts: list,
        sums: np.ndarray,
    ) -> tuple[int, np.ndarray]:
        """A direct read of a span at file offset ``first``: the bytes read, and whether
        each chunk matched its hash.

        The rows land as :meth:`_direct_parts` places them: ``head`` rows at the buffer's
        start, ``dst``'s rows, then ``tail`` rows after the first ``head`` in the buffer.
        With the compiled kernels on, the read and every chunk's check are one call that
        holds no GIL (:mod:`torchstore.data.residency.direct_read`); with them off, or should
        that call fail, ``os.preadv`` of the rows' views and ``xxhash`` chunk by chunk."""
        rnb = col.row_nbytes
        kernels = _direct_kernels()
        ok = np.zeros(len(counts), dtype=np.bool_)
        if kernels is not None:
            spare = self._buffer_at + rnb * np.arange(head + tail, dtype=np.int64)
            inside = dst.__array_interface__["data"][0] + dst.strides[0] * np.arange(
                dst.shape[0], dtype=np.int64
            )
            addresses = np.concatenate([spare[:head], inside, spare[head:]])
            counted = np.asarray(counts, dtype=np.int64)
            try:
                got = kernels.read_rows(
                    self._fd, first, addresses, rnb, counted, np.asarray(at, dtype=np.int64),
                    sums[: len(counts)], ok,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - a build failure: fall back, said once
                _direct_failed(exc)
                got = -1
            if got >= 0:
                return got, ok
        rows, parts = self._direct_parts(col, dst, head, tail, at, counts)
        got = os.preadv(self._fd, parts, first)
        start = 0
        for i, n in enumerate(counts):
            ok[i] = col.table._verified_parts(sums[i], rows[start : start + n], n)
            start += n
        return got, ok

    def _landing(self, offset: int, nbytes: int, to: int | None) -> np.ndarray:
        """``nbytes`` of the buffer to read the file's bytes at ``offset`` into, to be
        copied to address ``to`` (``None``: not in one ``memcpy``).

        Where the bytes land matters twice. The kernel copies from the page cache, and
        numpy's copy of contiguous rows calls ``memcpy``; both use ``rep movsb``, which on
        some x86 CPUs (AMD Zen here: 1.6-2.8 GB/s instead of 16-23 GB/s) crawls when the
        destination sits 1 to 31 bytes past the source within a 4 KiB page. A numpy
        buffer's data starts 16 bytes into a page and a store's chunks start on a page,
        so a plain buffer hit exactly that on every read. The landing takes the page
        offset of ``to`` (the copy then has none) unless that puts it 1 to 31 bytes past
        the file offset; then it sits 32 bytes past the file offset, which leaves the copy
        4065 to 4095 bytes apart (fast). Without ``to`` it sits 64 bytes past, 64-byte
        aligned."""
        base = self._buffer_at
        src = offset % _PAGE
        if to is None:
            want = (-(-src // _LEAD) * _LEAD + _LEAD) % _PAGE
        else:
            want = to % _PAGE
            if 0 < (want - src) % _PAGE < _SLOW:
                want = (src + _SLOW) % _PAGE
        shift = (want - base) % _PAGE
        return self._buffer[shift : shift + nbytes]

    def _chunk_via_store(
        self, col: _Column, name: str, c: int, lo: int, hi: int, out: np.ndarray
    ) -> None:
        s, e = max(c * col.rows, lo), min((c + 1) * col.rows, hi)
        self._via_store(name, s, e, out, s - lo)

    def _via_store(self, name: str, lo: int, hi: int, out: np.ndarray, at: int) -> None:
        if hi <= lo:
            return
        if hasattr(self.store, "read_packet_runs") and self.store.column(name).codec is not None:
            # an encoded camera column: its packets are read under the lock, then decoded
            # without it (the decoders release the GIL), cut at keyframes over the decode
            # threads, straight into out
            with self.lock:
                runs = self.store.read_packet_runs(name, lo, hi)
            target = out[at : at + hi - lo]
            threads = decode_threads()
            resize = self.resize.get(name)
            options = {"threads": threads, "resize": resize, "decode_device": self.decode_device}
            if _frames_contiguous(target):
                self.store.decode_packet_runs(name, runs, target, **options)
            else:
                target[...] = self.store.decode_packet_runs(
                    name, runs, np.empty(target.shape, np.uint8), **options
                )
            self.stats["decoded_reads"] = self.stats.get("decoded_reads", 0) + 1
            return
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


def _frames_contiguous(out: np.ndarray) -> bool:
    """Whether the decoders can write ``out``'s frames where they lie: each frame (row)
    contiguous, the rows at any stride (a camera column of a window's slot, whose rows sit
    between the other columns' bytes). Decoding into a contiguous array and copying it
    into such a slot cost a window 10-15 % more CPU a row than one thread's sequential
    decode: a second copy of every frame, on the refill thread while the decode threads
    waited, and the page faults of a fresh array of a block's frames each read."""
    return out.ndim >= 2 and (out.shape[0] == 0 or out[0].flags.c_contiguous)


def _resize_jobs(resize: FrameResize, full: np.ndarray, out: np.ndarray, threads: int) -> list:
    """Resize ``full`` (raw camera rows) into ``out`` on the decode threads, in ``threads``
    parts (Pillow releases the GIL)."""
    bounds = np.linspace(0, len(full), min(threads, len(full)) + 1).astype(int)
    pool = decode_pool(threads)
    return [
        pool.submit(resize.apply, full[a:b], out[a:b])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        if b > a
    ]


class _RemoteAhead:
    """The read-ahead of a store opened by URL (a ``RangedFile`` under h5py's file-object
    driver): the window's hint for its coming blocks (:meth:`ChunkReader.advise`) becomes a
    background fetch of exactly their chunks (their byte spans in the file, adjacent chunks
    coalesced into one range) into the file's cache, where the refill's reads find them.
    Plain columns: the chunks of rows ``[lo, hi)`` (the reader's own chunk geometry);
    encoded columns: their packet rows, and the packet bytes those rows point at (from the
    first packet of the episode ``lo`` falls in, where decoding may start, with its
    extradata)."""

    #: Phase changes fetched ahead when the file keeps what it fetches in a cache. A phase
    #: of a fast low-dim window lasts about 45 ms (walker, 2 cores), shorter than a 1.9 MB
    #: block's fetch at 20 ms a request and 200 MB/s; four phases ahead, the fetch is done
    #: before the refill reads the block. Without a cache, fetched blocks wait in memory
    #: only (a few MiB), so the window hints one phase ahead as from a local file.
    PHASES = 4

    def __init__(self, reader: ChunkReader, ranged: Any, ds: Any, names: list[str]):
        self.reader, self.ranged = reader, ranged
        ranged.exact_reads = True
        self.phases = self.PHASES if getattr(ranged, "cached", ()) else 1
        #: the byte spans hinted so far, merged (for ``ahead_bytes``)
        self.seen: list[tuple[int, int]] = []
        #: encoded column -> (its packet rows, its packet bytes)
        self.packets: dict[str, tuple[_Column, _Column]] = {}
        for name in names:
            spec = reader.store.column(name)
            if spec.codec is not None and spec.name in ds.packets:
                self.packets[name] = (
                    _Column(ds.columns[spec.name]),
                    _Column(ds.packets[spec.name]),
                )
        # each column's checksum table, read now (a round trip each, once; the reader
        # holds its lock while it opens): a refill that read one first would wait for it
        committed = int(reader.store._rows)
        for name in names:
            if name in ds.columns and committed:
                ds.columns[name]._sum_rows(0, 0, committed)
        for name in self.packets if committed else ():
            reader.store.read_packet_runs(name, 0, 1)  # and its packets' table, through it

    def advise(self, names: list[str], lo: int, hi: int) -> None:
        spans: list[tuple[int, int]] = []
        for name in names:
            col = self.reader._columns.get(name)
            if col is not None:
                self.reader._offsets(col, (hi - 1) // col.rows)  # as its reads load them
                spans += self._chunk_spans(col, lo, hi)
            elif name in self.packets:
                spans += self._packet_spans(name, lo, hi)
        if spans:
            stats = self.reader.stats
            stats["ahead_bytes"] = stats.get("ahead_bytes", 0) + self._new_bytes(spans)
            self.ranged.prefetch_spans(spans)

    def _new_bytes(self, spans: list[tuple[int, int]]) -> int:
        """Bytes of ``spans`` outside every span hinted before (blocks share chunks, and
        each epoch hints its blocks again); :attr:`seen` is kept sorted and disjoint."""
        seen, added = self.seen, 0
        for a, z in spans:
            added += z - a
            i = max(bisect.bisect_right(seen, (a, a)) - 1, 0)
            lo, hi = a, z
            while i < len(seen) and seen[i][0] <= z:
                s_lo, s_hi = seen[i]
                if s_hi < a:
                    i += 1
                    continue
                added -= max(0, min(s_hi, z) - max(s_lo, a))
                lo, hi = min(lo, s_lo), max(hi, s_hi)
                del seen[i]
            seen.insert(i, (lo, hi))
        return added

    def _chunk_spans(self, col: _Column, lo: int, hi: int) -> list[tuple[int, int]]:
        """Byte spans of the chunks holding items ``[lo, hi)`` of ``col`` (known chunks only:
        one not stored whole is read through the store when it is needed)."""
        first, last = lo // col.rows, (hi - 1) // col.rows
        if last >= len(col.offsets):  # every chunk the dataset has now (rows or bytes)
            with self.reader.lock:
                col.load_offsets(-(-int(col.table.data.shape[0]) // col.rows))
        offsets = col.offsets[first : last + 1]
        offsets = np.sort(offsets[offsets >= 0])
        spans: list[tuple[int, int]] = []
        for at in offsets.tolist():
            if spans and at - spans[-1][1] <= MAX_GAP_BYTES:
                spans[-1] = (spans[-1][0], at + col.chunk_nbytes)
            else:
                spans.append((at, at + col.chunk_nbytes))
        return spans

    def _packet_spans(self, name: str, lo: int, hi: int) -> list[tuple[int, int]]:
        """Byte spans of encoded column ``name``'s packet rows for ``[lo, hi)`` and of the
        packet bytes they decode from (the rows' chunks fetched now, as exact spans, and
        read)."""
        index, packets = self.packets[name]
        episodes = self.reader.store.episodes
        start = int(episodes.offsets[int(episodes.episode_of(lo))])
        committed = int(self.reader.store._rows)
        spans = self._chunk_spans(index, start, hi)
        if spans:  # the rows' chunks exactly, now: h5py's read below then fetches nothing
            self.ranged.fetch_spans(spans)
        with self.reader.lock:
            rows = index.table.read(start, min(hi, committed), committed)
        if not len(rows):
            return spans
        a = int(rows[0, PACKET_OFFSET]) - int(rows[0, PACKET_EXTRA])
        z = int(rows[-1, PACKET_OFFSET]) + int(rows[-1, PACKET_NBYTES])
        if not 0 <= a < z:
            return spans  # damaged rows: the read reports them
        return spans + self._chunk_spans(packets, a, z)
