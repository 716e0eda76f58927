"""A store file's facts, read and checked without torch: what ``info`` and ``verify`` open.

A :class:`~torchstore.data.store.store.TrajectoryStore` holds column specs (torch dtypes)
and an episode index (torch tensors), so opening one imports torch: seconds of start-up
on a small machine, for a command that reads a few attributes. :class:`StoreFacts` opens
the file with h5py, numpy and xxhash only, through the checks a store's open makes:

- the manifest against its hash, and its fields (format, version, env id, seed, metadata,
  a list of columns), the columns kept as the dicts the manifest holds;
- the commit record against its own hash, and its counts against the file's size;
- each column's table against the committed rows;
- the episode index: its blocks' checksums, then lengths of at least 1 in contiguous,
  non-overlapping ranges that cover the committed rows, and metadata offsets that rise
  to the committed metadata bytes.

It keeps the file and its datasets open (``_file``, ``_ds``, as the store's reader names
them) for :func:`~torchstore.data.store.verify.verify_store`, which reads every block.

Examples:
    >>> with StoreFacts("data/reach_demo.h5") as facts:  # doctest: +SKIP
    ...     facts.num_episodes, [c["name"] for c in facts.columns][:2]
    (50, ['obs/pos', 'obs/vel'])
"""

from __future__ import annotations

import os

import numpy as np

from torchstore.data.file.layout import (
    StoreDatasets,
    open_store_file,
    read_manifest_fields,
    store_location,
)
from torchstore.errors import IntegrityError, StoreFormatError
from torchstore.io.hdf5.files import opened_bytes

__all__ = ["StoreFacts"]


class StoreFacts:
    """A store file opened for its facts: manifest fields, counts, episode lengths.

    Attributes:
        path: the store file.
        manifest: the manifest's fields (see
            :func:`~torchstore.data.file.manifest.parse_manifest_json`).
        columns: the manifest's column dicts (``name``, ``dtype``, ``shape``,
            ``quantize``, and ``codec`` for an encoded column).
        num_rows, num_episodes: the committed counts.
        episode_lengths: rows per committed episode (int64).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = store_location(path)
        self._file = open_store_file(self.path)
        try:
            self.manifest = read_manifest_fields(self._file, str(self.path))
            self.columns = self.manifest["columns"]
            self._ds = self._open_datasets()
            self._read_snapshot()
        except BaseException:
            self._file.close()
            raise

    def _open_datasets(self) -> StoreDatasets:
        try:
            named = [(c["name"], c.get("codec") is not None) for c in self.columns]
        except (TypeError, KeyError, AttributeError) as exc:
            raise StoreFormatError(
                f"{self.path}: the manifest's column list is malformed ({exc!r})"
            ) from None
        return StoreDatasets.open_checked(
            self._file, named, str(self.path), self.manifest["format_version"]
        )

    def _read_snapshot(self) -> None:
        rows, episodes, meta = self._ds.committed_counts(str(self.path))
        table = self._ds.ep_index.read(0, episodes, episodes)
        lengths, offsets = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
        why = _episode_problem(lengths, offsets, rows)
        if why is not None:
            raise IntegrityError(f"{self.path}: the episode index is inconsistent: {why}")
        meta_end = table[:, 2]
        if episodes and (meta_end[-1] != meta or bool((np.diff(meta_end) < 0).any())):
            raise IntegrityError(f"{self.path}: the episode metadata offsets are inconsistent")
        self.num_rows, self.num_episodes, self.episode_lengths = rows, episodes, lengths

    def size_on_disk(self) -> int:
        return opened_bytes(self._file)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> StoreFacts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _episode_problem(lengths: np.ndarray, offsets: np.ndarray, rows: int) -> str | None:
    """What breaks the episode index's rules (the rules and words of
    :class:`~torchstore.data.episodes.EpisodeIndex`), or None."""
    short = np.flatnonzero(lengths < 1)
    if len(short):
        bad = int(short[0])
        return f"episode {bad} has length {int(lengths[bad])}; lengths must be >= 1"
    expected = np.concatenate([[0], np.cumsum(lengths[:-1])]) if len(lengths) else lengths
    moved = np.flatnonzero(offsets != expected)
    if len(moved):
        bad = int(moved[0])
        return (
            f"episode {bad} starts at row {int(offsets[bad])}, expected {int(expected[bad])}: "
            "episodes must be contiguous and non-overlapping"
        )
    total = int(lengths.sum())
    if total != rows:
        return f"episodes cover {total} rows but the store holds {rows}"
    return None
