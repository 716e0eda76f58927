"""Many store files read as one store: how torchstore scales past one writer.

An HDF5 store has exactly one writer (an OS lock enforces it), so many collectors, Ray
actors or machines each write a shard of their own, and :class:`StoreSet` reads a folder
(or a list) of shards as one logical store: one row numbering, one episode index, slabs
and residency across shard edges, and :meth:`StoreSet.refresh` picks up both episodes the
live writers committed and shards that appeared since.

Row numbers are those of the current snapshot: shards are laid end to end in the order
they were found (a folder's shards sorted by file name at open; shards that appear later
follow, sorted among themselves), so when a refresh adds rows to a shard, the row numbers
of the shards after it move up. Episodes never straddle shards.

A writer makes its new file visible (renames it into place) a moment before it opens it
for SWMR writing, and a reader that opens the file in that moment holds HDF5's file lock,
so the writer cannot open it. The set therefore never opens a shard whose live writer has
not opened it yet: at open it waits for that writer (a few seconds at most), and
:meth:`StoreSet.refresh` leaves such a shard for a later refresh.

Examples:
    >>> shards = StoreSet("runs/")            # runs/collector-0.h5, runs/collector-1.h5, ...
    >>> shards.read_slab(0, len(shards))      # one slab across every shard edge
    >>> view = shards.resident()              # all of it in memory, for sampling
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchstore.data.episodes import EpisodeIndex
from torchstore.data.file.layout import store_location
from torchstore.data.file.manifest import Manifest
from torchstore.data.store.store import TrajectoryStore
from torchstore.errors import ColumnError, RowIndexError, StoreFormatError
from torchstore.io.dataset_folders import not_a_store
from torchstore.io.frames.resize import FrameResize
from torchstore.io.hdf5.files import SWMR_WRITE_FLAG, superblock_flags
from torchstore.io.hdf5.writer_lock import live_writer
from torchstore.io.remote.chunk_cache import ChunkCache
from torchstore.io.remote.range_requests import is_url, list_folder

__all__ = ["StoreSet", "SHARD_SUFFIXES", "find_shards", "open_store"]

#: File suffixes a folder's shards carry.
SHARD_SUFFIXES = (".h5", ".hdf5")
#: How long opening a set waits for a shard's live writer to open that shard.
_WRITER_OPEN_WAIT_S = 5.0


def _open_by_its_writer(path: Path) -> bool:
    """Whether the superblock says a writer has ``path`` open for SWMR writing."""
    return bool(superblock_flags(path) & SWMR_WRITE_FLAG)


def _writer_is_opening(path: str | os.PathLike) -> bool:
    """Whether a live writer holds ``path``'s writer lock but has not opened the file yet.

    A reader must not open such a file: its HDF5 file lock would keep the writer out. A
    writer that replaces an existing store (``overwrite=True``) writes a hidden file aside
    and never opens ``path`` itself, so ``path`` stays readable then.
    """
    path = Path(path)
    if live_writer(path) is None:
        return False
    if path.with_name(f".{path.name}.partial").exists():
        return False
    return not _open_by_its_writer(path)


def _wait_for_writer(path: Path, timeout: float) -> bool:
    """Wait (up to ``timeout`` seconds) until no live writer is opening ``path``."""
    deadline = time.monotonic() + timeout
    while _writer_is_opening(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def find_shards(folder: str | os.PathLike) -> list[Path]:
    """The shard files of ``folder``, sorted by name.

    Hidden files (a writer's ``.NAME.partial``, ``.NAME.tmp-*`` and ``.NAME.lock``) are
    skipped: a writer creates a store under a hidden name and renames it, so every shard
    listed here opens.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise StoreFormatError(f"{folder} is not a folder of store shards")
    return sorted(
        p
        for p in folder.iterdir()
        if p.suffix in SHARD_SUFFIXES and not p.name.startswith(".") and p.is_file()
    )


def open_store(path: str | os.PathLike) -> TrajectoryStore:
    """A folder of shards as a :class:`StoreSet` (a local folder, or a Hub folder URL ending
    in ``/``); a file, or a file's URL, as a :class:`TrajectoryStore`."""
    where = store_location(path)
    if isinstance(where, Path):
        return StoreSet(where) if where.is_dir() else TrajectoryStore(where)
    return StoreSet(where) if where.endswith("/") else TrajectoryStore(where)


def _common_location(paths: Sequence[Path | str]) -> Path | str:
    """What names a list of shards: the folder the local ones share, or the URLs' common
    prefix up to a ``/``."""
    if not paths:
        return Path()
    if all(isinstance(p, Path) for p in paths):
        return Path(os.path.commonpath([os.path.abspath(p) for p in paths]))
    prefix = os.path.commonprefix([str(p) for p in paths])
    return prefix[: prefix.rfind("/") + 1] or prefix


def _same_columns(a: TrajectoryStore, b: TrajectoryStore) -> str | None:
    """Why ``b``'s columns differ from ``a``'s, or None when they agree."""
    if [c.name for c in a.columns] != [c.name for c in b.columns]:
        return f"columns {[c.name for c in b.columns]} instead of {[c.name for c in a.columns]}"
    for x, y in zip(a.columns, b.columns):
        if (x.dtype, tuple(x.shape), x.quantize) != (y.dtype, tuple(y.shape), y.quantize):
            return f"column '{y.name}' is {y.describe()} instead of {x.describe()}"
    return None


class StoreSet(TrajectoryStore):
    """Shards (one store file per writer) read as one store.

    Everything a :class:`TrajectoryStore` offers works on the set: ``len``, indexing,
    ``read_slab``/``read_column``/``iter_slabs`` across shard edges, ``episode`` and
    ``iter_episodes`` over one episode index, ``episode_metadata``, ``resident()`` and
    ``window()`` over all rows; so a set goes wherever a store goes (DataModules, replay
    prefill, samplers).

    Args:
        source: a folder (its ``*.h5``/``*.hdf5`` files are the shards, and shards that
            appear later are picked up by :meth:`refresh`), or a list of shard files
            (a fixed set). Shards may be URLs (see :class:`TrajectoryStore`), read in
            place; a Hub folder ``hf://datasets/NS/NAME[@REV]/DIR/`` is listed once, at
            the commit its revision names then (a fixed set too).
        cache: what URL shards read through (see :class:`TrajectoryStore`).

    Every shard must declare the same columns (names, dtypes, shapes, quantisation);
    one that does not is a :class:`~torchstore.errors.ColumnError` naming it.
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        cache: ChunkCache | int | str | bool = True,
    ):
        self._cache = cache
        self.folder: Path | None = None
        if isinstance(source, str) and is_url(source):
            paths: list[Path | str] = list(list_folder(source, SHARD_SUFFIXES))
            self.path: Path | str = source
        elif isinstance(source, (str, os.PathLike)):
            self.folder = Path(source)
            if not self.folder.exists():
                raise FileNotFoundError(f"no store folder at {self.folder}")
            paths = list(find_shards(self.folder))
            self.path = self.folder
        else:
            paths = [store_location(p) for p in source]
            names = [os.path.realpath(p) if isinstance(p, Path) else p for p in paths]
            if len(set(names)) != len(paths):
                raise StoreFormatError(
                    "a shard is listed twice: every shard must be a different file"
                )
            self.path = _common_location(paths)
        if not paths:
            where = self.path if isinstance(source, (str, os.PathLike)) else "the list"
            raise StoreFormatError(
                (self.folder is not None and not_a_store(self.folder, empty=False))
                or f"no store shards in {where} (shards are *.h5 or *.hdf5 files)"
            )
        self._shards: list[TrajectoryStore] = []
        try:
            for path in paths:
                # a shard its writer is still opening: a folder's is left to refresh()
                # (a URL is read-only: no writer of this machine opens it)
                if (
                    not isinstance(path, Path)
                    or _wait_for_writer(path, _WRITER_OPEN_WAIT_S)
                    or self.folder is None
                ):
                    self._add(path)
        except BaseException:
            self.close()
            raise
        if not self._shards:
            raise StoreFormatError(
                f"no store shards in {self.folder} that their writers have opened (waited "
                f"{_WRITER_OPEN_WAIT_S} s for {[p.name for p in paths]})"
            )
        self._manifest = self._shards[0]._manifest
        self._rows = self._episodes_n = -1
        self._index()

    # ----------------------------------------------------------------- shards
    def _add(self, path: Path | str) -> None:
        store = TrajectoryStore(path, cache=self._cache)
        if self._shards:
            why = _same_columns(self._shards[0], store)
            if why is not None:
                store.close()
                raise ColumnError(
                    f"shard {path} does not match shard {self._shards[0].path}: it has {why}"
                )
        self._shards.append(store)

    def _index(self) -> bool:
        """Rebuild the row and episode numbering from the shards' snapshots; True if it moved."""
        rows = np.array([s.num_rows for s in self._shards], dtype=np.int64)
        episodes = np.array([s.num_episodes for s in self._shards], dtype=np.int64)
        #: first global row and first global episode of each shard (and the totals, last)
        self.row_starts = np.concatenate([[0], np.cumsum(rows)])
        self.episode_starts = np.concatenate([[0], np.cumsum(episodes)])
        total, total_eps = int(self.row_starts[-1]), int(self.episode_starts[-1])
        changed = (total, total_eps) != (self._rows, self._episodes_n)
        lengths = torch.cat([s.episodes.lengths for s in self._shards])
        self._episodes = EpisodeIndex(lengths, num_rows=total)
        self._rows, self._episodes_n = total, total_eps
        return changed

    @property
    def shards(self) -> tuple[TrajectoryStore, ...]:
        """The open shards, in row order."""
        return tuple(self._shards)

    @property
    def manifest(self) -> Manifest:
        """The first shard's manifest with the set's committed counts."""
        return self._manifest.with_counts(self._rows, self._episodes_n)

    def locate(self, row: int) -> tuple[int, int]:
        """``(shard number, row inside that shard)`` of a global row."""
        if not 0 <= row < self._rows:
            raise RowIndexError(
                f"row {row} is out of range for {self.path}, which holds {self._rows} rows"
            )
        shard = int(np.searchsorted(self.row_starts, row, side="right")) - 1
        return shard, row - int(self.row_starts[shard])

    def refresh(self) -> bool:
        """Catch up with episodes the shards' writers committed and, for a folder, with
        shards that appeared since (a new shard whose writer has not opened it yet comes
        in on a later refresh); True if the set shows anything new."""
        grew = False
        for shard in self._shards:
            grew |= shard.refresh()
        if self.folder is not None:
            known = {os.path.realpath(s.path) for s in self._shards}
            for path in find_shards(self.folder):
                if os.path.realpath(path) not in known and not _writer_is_opening(path):
                    self._add(path)
                    grew = True
        return self._index() or grew

    # ----------------------------------------------------------------- reading
    def read_column(
        self,
        name: str,
        start: int,
        stop: int,
        *,
        resize: FrameResize | None = None,
        decode_device: str = "cpu",
    ) -> np.ndarray:
        """One column's rows ``[start, stop)`` across shard edges, storage dtype (verified);
        ``resize`` and ``decode_device`` as in
        :meth:`~torchstore.data.TrajectoryStore.read_column`."""
        spec = self.column(name)
        if not 0 <= start <= stop <= self._rows:
            raise RowIndexError(
                f"rows [{start}, {stop}) are outside the rows [0, {self._rows}) of {self.path}"
            )
        parts = []
        first = int(np.searchsorted(self.row_starts, start, side="right")) - 1
        for i in range(max(first, 0), len(self._shards)):
            lo, hi = int(self.row_starts[i]), int(self.row_starts[i + 1])
            if lo >= stop:
                break
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                parts.append(
                    self._shards[i].read_column(
                        spec.name, a - lo, b - lo, resize=resize, decode_device=decode_device
                    )
                )
        if not parts:
            return self._shards[0].read_column(
                spec.name, 0, 0, resize=resize, decode_device=decode_device
            )
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def episode_metadata(self, index: int) -> dict[str, Any]:
        """The metadata the episode was committed with, read from its shard."""
        self._episodes.range(index)  # bounds check
        index %= self._episodes_n
        shard = int(np.searchsorted(self.episode_starts, index, side="right")) - 1
        return self._shards[shard].episode_metadata(index - int(self.episode_starts[shard]))

    def shard_of_episode(self, index: int) -> int:
        """The shard number that holds episode ``index``."""
        self._episodes.range(index)
        index %= self._episodes_n
        return int(np.searchsorted(self.episode_starts, index, side="right")) - 1

    # ----------------------------------------------------------------- lifetime
    def _open_args(self) -> tuple[Any, ...]:
        """What opens the set again in another process: its folder, or its shard files
        (a Hub folder's as listed, at their commit)."""
        return (self.folder if self.folder is not None else [s.path for s in self._shards],)

    def size_on_disk(self) -> int:
        return sum(s.size_on_disk() for s in self._shards)

    def close(self) -> None:
        for shard in getattr(self, "_shards", ()):
            shard.close()

    def __enter__(self) -> StoreSet:
        return self

    def __repr__(self) -> str:
        return (
            f"StoreSet({str(self.path)!r}, shards={len(self._shards)}, rows={self._rows}, "
            f"episodes={self._episodes_n})"
        )
