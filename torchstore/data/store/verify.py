"""A full checksum pass over a store: every committed byte read and checked once.

Opening a store checks its manifest, its commit record and its episode index; the column
data is checked block by block only when it is read. So ``torchstore info`` on a store
whose tail was truncated or whose bytes rotted prints a normal summary, and only a read of
the damaged rows raises :class:`~torchstore.errors.IntegrityError`. :func:`verify_store`
reads everything (every column, the episode index and the episode metadata) and reports
each damaged run of rows by column, instead of stopping at the first.

How it reads: every chunk of every table, in file order, by ``os.preadv`` at the chunks'
file offsets (from the chunk index, as :mod:`torchstore.data.residency.block_read` reads
window refills) into one reusable buffer of about a MiB, each chunk hashed where it
landed. So the file is read front to back once, as ``cat`` reads it, with neither a
buffer the size of a slab nor a copy; h5py's read of a 64 MiB slab into a new array cost
several times the hash (98 MB of 12 KiB image rows: 40 ms read, 4 ms hashed; a raw read
of the whole 124 MB file 20 ms). A chunk that does not match there (or cannot be read
that way) is read again through the table's own checked read, which decides what is
reported; a file the chunk offsets do not describe (another HDF5 driver, a user block,
filtered chunks) is read in slabs through h5py.

Examples:
    >>> report = verify_store("demo.h5", progress=False)
    >>> report.ok, report.verdict()
    (True, 'demo.h5: OK (6 columns, 4,000 rows, 20 episodes, 140.6 KiB of data checked)')
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from torchstore.data.file.layout import committed_packet_bytes
from torchstore.errors import IntegrityError, TorchstoreError
from torchstore.io.hdf5.checksummed import chunk_file_offsets

__all__ = ["Verification", "verify_store"]

#: Bytes read per slab (the h5py path): large enough for streaming speed, small enough to
#: stay out of the way.
SLAB_BYTES = 64 * 1024 * 1024
#: Bytes one ``preadv`` of the chunk pass reads at most: small enough that a chunk is still
#: in the CPU's cache when it is hashed right after the read.
READ_BYTES = 1 << 20
#: The widest gap between two chunks in the file that one read spans (reading a few KiB of
#: a checksum table or of HDF5's metadata costs less than another system call).
GAP_BYTES = 16 << 10


@dataclass
class Verification:
    """What :func:`verify_store` found.

    ``problems`` holds one line per damaged run of rows (naming the column and the rows)
    or the reason the store could not be opened at all; it is empty for a healthy store.
    """

    path: Path
    columns: int = 0
    rows: int = 0
    episodes: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def verdict(self) -> str:
        """One line: ``PATH: OK (...)`` or ``PATH: DAMAGED: <first problems>``."""
        from torchstore.data.store.summary import format_size

        if self.ok:
            return (
                f"{self.path}: OK ({self.columns} columns, {self.rows:,} rows, {self.episodes:,} "
                f"episodes, {format_size(self.bytes_checked)} of data checked)"
            )
        shown = "; ".join(self.problems[:5])
        more = f"; and {len(self.problems) - 5} more" if len(self.problems) > 5 else ""
        return f"{self.path}: DAMAGED: {shown}{more}"


def _runs(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge adjacent ``(first_row, last_row)`` ranges."""
    merged: list[tuple[int, int]] = []
    for first, last in blocks:
        if merged and merged[-1][1] + 1 == first:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def _check_table(table, committed: int, advance) -> list[tuple[int, int]]:
    """Read ``table`` rows ``[0, committed)`` in slabs through h5py; the failing blocks'
    ``(first_row, last_row)``."""
    block = table.block_rows
    per_slab = max(1, SLAB_BYTES // max(1, table.row_nbytes * block)) * block
    bad: list[tuple[int, int]] = []
    for start in range(0, committed, per_slab):
        stop = min(start + per_slab, committed)
        try:
            table.read(start, stop, committed)
        except IntegrityError:
            # narrow down to the failing blocks of this slab
            bad += _recheck_blocks(table, range(start // block, -(-stop // block)), committed)
        advance((stop - start) * table.row_nbytes)
    return bad


def _recheck_blocks(table, blocks, committed: int) -> list[tuple[int, int]]:
    """The table's own checked read of each block in ``blocks``; the rows of those that fail."""
    bad = []
    for block in blocks:
        first = block * table.block_rows
        last = min(first + table.block_rows, committed)
        try:
            table.read(first, last, committed)
        except IntegrityError:
            bad.append((first, last - 1))
    return bad


def _chunk_file(store: Any) -> int:
    """A descriptor of the store's file for reading its chunks at their offsets, or -1
    where the chunk index's offsets are not file offsets (another HDF5 driver, a user
    block) or ``os.preadv`` is missing (Windows)."""
    f = getattr(store, "_file", None)
    if not hasattr(os, "preadv") or not isinstance(f, h5py.File) or f.userblock_size != 0:
        return -1
    if f.id.get_access_plist().get_driver() != h5py.h5fd.SEC2:
        return -1
    fd = os.open(f.filename, os.O_RDONLY)
    st, ref = os.fstat(fd), os.stat(store.path)
    if (st.st_dev, st.st_ino) != (ref.st_dev, ref.st_ino):
        os.close(fd)
        return -1
    return fd


def _chunk_offsets(table, blocks: int) -> Any:
    """File offsets of the table's chunks ``0 .. blocks - 1`` (each one checksum block),
    -1 for a chunk not stored whole and unfiltered; None for a table whose chunks are not
    its checksum blocks (read through h5py instead)."""
    dsid = table.data.id
    chunks = table.data.chunks
    if chunks is None or chunks[0] != table.block_rows or dsid.get_create_plist().get_nfilters():
        return None
    return chunk_file_offsets(table.data, table.block_rows, blocks)


def _check_chunks(fd: int, tables: list, advance) -> list[list[tuple[int, int]]]:
    """Each table's failing blocks, for ``tables`` given as ``(table, committed rows, chunk
    offsets)``: every chunk read in file order and hashed where it landed, and each block
    that does not match there read again by the table's own checked read, which decides.

    A table whose checksum table cannot be read goes through :func:`_check_table`."""
    chunks = []  # (file offset, bytes, table number, block), for the whole pass
    sums: list[Any] = []
    recheck: list[list[int]] = [[] for _ in tables]  # blocks the pass did not verify
    bad: list[list[tuple[int, int]]] = [[] for _ in tables]
    row_bytes = [table.row_nbytes for table, _, _ in tables]
    for k, (table, committed, offsets) in enumerate(tables):
        blocks = math.ceil(committed / table.block_rows)
        try:
            sums.append(table._sum_rows(0, blocks - 1, committed) if blocks else None)
        except IntegrityError:
            sums.append(None)
            bad[k] = _check_table(table, committed, advance)
            continue
        for block in range(blocks):
            nbytes = min(table.block_rows, committed - block * table.block_rows) * row_bytes[k]
            if offsets[block] >= 0:
                chunks.append((int(offsets[block]), nbytes, k, block))
            else:  # not stored as one plain chunk: only the checked read sees it
                recheck[k].append(block)
                advance(nbytes)
    chunks.sort()
    buffer = np.empty(max([READ_BYTES] + [c[1] for c in chunks]), dtype=np.uint8)
    i = 0
    while i < len(chunks):
        end = _run_end(chunks, i, buffer.nbytes)
        start, last = chunks[i][0], chunks[end - 1]
        got = os.preadv(fd, [buffer[: last[0] + last[1] - start]], start)
        for at, nbytes, k, block in chunks[i:end]:
            piece = buffer[at - start : at - start + nbytes]
            rows = nbytes // row_bytes[k]
            if at + nbytes - start > got or not _matches(sums[k][block], piece, rows):
                recheck[k].append(block)
        advance(sum(c[1] for c in chunks[i:end]))
        i = end
    for k, (table, committed, _) in enumerate(tables):
        if recheck[k]:
            bad[k] = _recheck_blocks(table, sorted(recheck[k]), committed)
    return bad


def _run_end(chunks: list, i: int, most: int) -> int:
    """End (exclusive) of the run of ``chunks`` (sorted by file offset) from ``i`` that one
    read covers: each at most :data:`GAP_BYTES` past the one before, at most ``most`` bytes
    from the first's start to the last's end."""
    start = tail = chunks[i][0]
    end = i
    while end < len(chunks):
        at, nbytes = chunks[end][0], chunks[end][1]
        if at < tail or at - tail > GAP_BYTES or at + nbytes - start > most:
            break
        tail = at + nbytes
        end += 1
    return end


def _matches(slots: Any, data: Any, rows: int) -> bool:
    """Whether ``data`` (a block's ``rows`` rows, as bytes) matches the slot of its hash
    row ``slots`` that records ``rows`` rows."""
    if int(slots[0, 0]) == rows:
        return xxhash.xxh3_64_intdigest(data) == int(slots[0, 1])
    if int(slots[1, 0]) == rows:
        return xxhash.xxh3_64_intdigest(data) == int(slots[1, 1])
    return False


def verify_store(
    path: str | os.PathLike,
    *,
    progress: bool | Callable[[int, int], None] = True,
) -> Verification:
    """Read and check every checksum of the store at ``path``; never raises for damage.

    Args:
        path: the store file.
        progress: draw a progress bar (True), none (False), or call
            ``progress(bytes_done, bytes_total)`` after each slab.

    Returns:
        A :class:`Verification`; ``ok`` is False when anything failed, and ``problems``
        names each damaged column and its rows (or why the store did not open).
    """
    from torchstore.data.store.facts import StoreFacts  # the store's checks, without torch
    from torchstore.io.remote.ranged import is_url

    if Path(path).is_dir():
        return _verify_set(Path(path), progress)
    report = Verification(path if is_url(path) else Path(path))
    try:
        store = StoreFacts(path)
    except (TorchstoreError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        report.problems.append(text.removeprefix(f"{report.path}: "))
        return report
    with store:
        tables = store._ds
        rows, episodes, meta = tables.read_commit()
        report.columns, report.rows, report.episodes = len(store.columns), rows, episodes
        work = [(t, f"column '{name}'", rows) for name, t in tables.columns.items()]
        work += _packet_work(tables, rows, report)
        work += [
            (tables.ep_index, "episode index", episodes),
            (tables.ep_meta, "episode metadata", meta),
        ]
        total = sum(t.row_nbytes * n for t, _, n in work)
        bar = None
        if progress is True:
            from torchstore.io.progress import progress_bar

            bar = progress_bar(total=total, unit="B", unit_scale=True, desc="verify", leave=False)
        done = 0

        def advance(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            if bar is not None:
                bar.update(nbytes)
            elif callable(progress):
                progress(done, total)

        fd = _chunk_file(store)
        try:
            bad = _check_all(fd, work, advance)
        finally:
            if fd >= 0:
                os.close(fd)
            if bar is not None:
                bar.close()
        for (_, label, _), blocks in zip(work, bad):
            for first, last in _runs(sorted(blocks)):
                report.problems.append(f"{label} rows {first}..{last} fail their checksum")
        report.bytes_checked = done
    return report


def _packet_work(tables: Any, rows: int, report: Verification) -> list:
    """The packet bytes of each encoded column, up to where its last committed row's ends."""
    work = []
    for name, packets in tables.packets.items():
        try:
            end = committed_packet_bytes(tables.columns[name], rows)
        except TorchstoreError as exc:
            report.problems.append(f"column '{name}': {exc}")
            continue
        work.append((packets, f"column '{name}' packets", end))
    return work


def _check_all(fd: int, work: list, advance) -> list[list[tuple[int, int]]]:
    """Each table's failing blocks: by the chunk pass where its chunk offsets are known,
    else through h5py."""
    plans = [
        _chunk_offsets(t, math.ceil(n / t.block_rows)) if fd >= 0 else None for t, _, n in work
    ]
    bad: list[list[tuple[int, int]]] = [[] for _ in work]
    direct = [k for k, offsets in enumerate(plans) if offsets is not None]
    found = _check_chunks(fd, [(work[k][0], work[k][2], plans[k]) for k in direct], advance)
    for k, blocks in zip(direct, found):
        bad[k] = blocks
    for k, (table, _, committed) in enumerate(work):
        if plans[k] is None:
            bad[k] = _check_table(table, committed, advance)
    return bad


def _verify_set(folder: Path, progress: bool | Callable[[int, int], None]) -> Verification:
    """:func:`verify_store` of every shard of a folder (a store set), summed in one report;
    each problem names its shard."""
    from torchstore.data.store.store_set import find_shards

    report = Verification(folder)
    shards = find_shards(folder)
    if not shards:
        report.problems.append("no store shards in the folder (shards are *.h5 or *.hdf5 files)")
    for shard in shards:
        one = verify_store(shard, progress=progress)
        if report.columns and one.columns and one.columns != report.columns:
            report.problems.append(
                f"{shard.name}: {one.columns} columns, the other shards have {report.columns}"
            )
        report.columns = report.columns or one.columns
        report.rows += one.rows
        report.episodes += one.episodes
        report.bytes_checked += one.bytes_checked
        report.problems += [f"{shard.name}: {p}" for p in one.problems]
    return report
