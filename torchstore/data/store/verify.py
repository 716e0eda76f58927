"""A full checksum pass over a store: every committed byte read and checked once.

Opening a store checks its manifest, its commit record and its episode index; the column
data is checked block by block only when it is read. So ``torchstore info`` on a store
whose tail was truncated or whose bytes rotted prints a normal summary, and only a read of
the damaged rows raises :class:`~torchstore.errors.IntegrityError`. :func:`verify_store`
reads everything (every column, the episode index and the episode metadata) in slabs,
and reports each damaged run of rows by column, instead of stopping at the first.

Examples:
    >>> report = verify_store("demo.h5", progress=False)
    >>> report.ok, report.verdict()
    (True, 'demo.h5: OK (6 columns, 4,000 rows, 20 episodes, 140.6 KiB of data checked)')
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torchstore.errors import IntegrityError, TorchstoreError

__all__ = ["Verification", "verify_store"]

#: Bytes read per slab: large enough for streaming speed, small enough to stay out of the way.
SLAB_BYTES = 64 * 1024 * 1024


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


def _check_table(table, label: str, committed: int, report: Verification, advance) -> None:
    """Read ``table`` rows ``[0, committed)`` in slabs; record every failing run of rows."""
    block = table.block_rows
    per_slab = max(1, SLAB_BYTES // max(1, table.row_nbytes * block)) * block
    bad: list[tuple[int, int]] = []
    for start in range(0, committed, per_slab):
        stop = min(start + per_slab, committed)
        try:
            table.read(start, stop, committed)
        except IntegrityError:
            # narrow down to the failing blocks of this slab
            for first in range(start, stop, block):
                last = min(first + block, stop)
                try:
                    table.read(first, last, committed)
                except IntegrityError:
                    bad.append((first, last - 1))
        advance((stop - start) * table.row_nbytes)
    for first, last in _runs(bad):
        report.problems.append(f"{label} rows {first}..{last} fail their checksum")


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
    from torchstore.data.store.store import TrajectoryStore

    if Path(path).is_dir():
        return _verify_set(Path(path), progress)
    report = Verification(Path(path))
    try:
        store = TrajectoryStore(path)
    except (TorchstoreError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        report.problems.append(text.removeprefix(f"{report.path}: "))
        return report
    with store:
        tables = store._ds
        rows, episodes, meta = tables.read_commit()
        report.columns, report.rows, report.episodes = len(store.columns), rows, episodes
        work = [(t, f"column '{name}'", rows) for name, t in tables.columns.items()]
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

        try:
            for table, label, committed in work:
                _check_table(table, label, committed, report, advance)
        finally:
            if bar is not None:
                bar.close()
        report.bytes_checked = done
    return report


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
