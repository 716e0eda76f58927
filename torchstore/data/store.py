"""Reading a trajectory store: contiguous slabs, episodes, and the step into residency.

A store is a sequence of rows, as a torchrl storage or a LeRobot dataset is: ``len(store)``
is the committed row count, ``store[i]`` one row, ``store[a:b]`` a slab, and iterating
yields rows (read in slabs underneath); ``store.episode(i)`` and ``iter_episodes()`` walk
episodes. Scattered rows read from disk cost about 4500x a gather from memory, so
sampling reads a resident view (``resident``) or a window refilled by contiguous reads
(``window``); ``store[index_tensor]`` works but reads the runs of rows it touches.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchstore.data.columns import ColumnSpec
from torchstore.data.episodes import EpisodeIndex
from torchstore.data.layout import StoreDatasets, read_manifest
from torchstore.data.manifest import Manifest
from torchstore.errors import (
    ColumnError,
    EnvUnavailableError,
    IntegrityError,
    RowIndexError,
    StoreFormatError,
    TorchstoreError,
)
from torchstore.io.hdf5 import open_for_read

__all__ = ["TrajectoryStore"]


def _recorded_spec(metadata: dict, env_id: str) -> str | None:
    """The ``EnvSpec`` JSON a recording or a Minari import kept for ``env_id``, if any."""
    for source in ("gymnasium", "minari"):
        entry = metadata.get(source)
        spec = entry.get("env_spec") if isinstance(entry, dict) else None
        if isinstance(spec, str):
            try:
                if json.loads(spec).get("id") == env_id:
                    return spec
            except (ValueError, AttributeError):
                continue
    return None


class TrajectoryStore:
    """A store file opened for reading (a live writer may keep appending).

    What the store shows is a snapshot of the committed episodes taken at open; call
    :meth:`refresh` to see episodes committed since.

    Examples:
        >>> store = TrajectoryStore("demo.h5")
        >>> store.read_slab(0, 100)["obs"].shape
        torch.Size([100, 3])
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open_for_read(self.path)
        try:
            self._manifest = read_manifest(self._file, str(self.path))
            try:
                self._ds = StoreDatasets.open(self._file, self._manifest)
            except TorchstoreError:
                raise
            except Exception as exc:  # KeyError, OSError, RuntimeError from a damaged header
                raise StoreFormatError(
                    f"{self.path}: a dataset the manifest names is missing or unreadable ({exc})"
                ) from exc
            if self._manifest.format_version > 1 and not self._ds.checked:
                raise StoreFormatError(
                    f"{self.path}: the commit record lacks the checksum its format version keeps"
                )
            self._rows = self._episodes_n = self._meta_n = -1
            self.refresh()
        except BaseException:
            self._file.close()
            raise

    # ----------------------------------------------------------------- snapshot
    def refresh(self) -> bool:
        """Catch up with episodes a live writer committed since; True if there were any."""
        try:
            # the commit record first: everything it counts was flushed before it was written
            rows, episodes, meta = self._ds.read_commit()
        except TorchstoreError as exc:
            raise type(exc)(f"{self.path}: {exc}") from exc
        try:
            for table in self._ds.all():
                table.refresh()
        except Exception as exc:  # h5py: OSError, ValueError, KeyError, RuntimeError
            raise IntegrityError(
                f"{self.path}: the store's tables cannot be refreshed ({exc})"
            ) from exc
        if (rows, episodes, meta) == (self._rows, self._episodes_n, self._meta_n):
            return False
        for name, table in self._ds.columns.items():
            if table.data.shape[0] < rows:
                raise IntegrityError(
                    f"{self.path}: column '{name}' holds {table.data.shape[0]} rows but {rows} are "
                    "committed; the file is truncated or damaged"
                )
        if min(rows, episodes, meta) < 0 or (episodes == 0) != (rows == 0):
            raise IntegrityError(
                f"{self.path}: the commit record ({rows}, {episodes}, {meta}) is inconsistent"
            )
        table = self._ds.ep_index.read(0, episodes, episodes, self._latest(1))
        lengths, offsets = (
            torch.from_numpy(table[:, 0].copy()),
            torch.from_numpy(table[:, 1].copy()),
        )
        try:
            self._episodes = EpisodeIndex(lengths, offsets, num_rows=rows)
        except StoreFormatError as exc:
            raise IntegrityError(f"{self.path}: the episode index is inconsistent: {exc}") from exc
        self._meta_end = table[:, 2].copy()
        if episodes and (self._meta_end[-1] != meta or bool((np.diff(self._meta_end) < 0).any())):
            raise IntegrityError(f"{self.path}: the episode metadata offsets are inconsistent")
        self._rows, self._episodes_n, self._meta_n = rows, episodes, meta
        return True

    def _latest(self, field: int):
        """Re-reads one count of the commit record (for a block a live writer just extended)."""
        return lambda: self._ds.read_commit()[field]

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        return self._manifest.columns

    @property
    def manifest(self) -> Manifest:
        """The manifest, with the committed counts of the current snapshot."""
        return self._manifest.with_counts(self._rows, self._episodes_n)

    @property
    def episodes(self) -> EpisodeIndex:
        return self._episodes

    @property
    def num_rows(self) -> int:
        return self._rows

    @property
    def num_episodes(self) -> int:
        return self._episodes_n

    def __len__(self) -> int:
        """Committed rows (of the current snapshot), as for a torchrl storage."""
        return self._rows

    def __getitem__(self, index: Any) -> TensorDict:
        """Rows: ``store[i]`` one row (batch size ``[]``), ``store[a:b:step]`` a slab,
        ``store[tensor]`` the rows at those indices (read as the runs of rows they touch);
        negative indices count from the end."""
        n = self._rows
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return self.read_slab(start, max(start, stop))
            rows = torch.arange(start, stop, step)
            return self._read_rows(rows)
        try:
            i = operator.index(index)
        except TypeError:
            pass
        else:
            if not -n <= i < n:
                raise RowIndexError(
                    f"row {i} is out of range for {self.path}, which holds {n} rows"
                )
            i %= n
            return self.read_slab(i, i + 1)[0]
        try:
            rows = torch.as_tensor(index)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise RowIndexError(
                f"cannot index {self.path} with {index!r:.80}: use an int, a slice or integer rows"
            ) from exc
        if rows.numel() == 0 and rows.ndim == 1:
            rows = rows.to(torch.int64)
        if rows.dtype == torch.bool:
            if rows.shape != (n,):
                raise RowIndexError(
                    f"a boolean mask over {self.path} must have shape [{n}], got {list(rows.shape)}"
                )
            rows = torch.nonzero(rows).flatten()
        if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.ndim != 1:
            raise RowIndexError(
                f"row indices must be a 1-D integer sequence, got {rows.dtype} of shape {list(rows.shape)}"
            )
        return self._read_rows(rows)

    def _read_rows(self, rows: torch.Tensor) -> TensorDict:
        rows = rows.to(torch.int64).cpu()
        n = self._rows
        if rows.numel() and (int(rows.min()) < -n or int(rows.max()) >= n):
            bad = rows[(rows < -n) | (rows >= n)][0]
            raise RowIndexError(
                f"row {int(bad)} is out of range for {self.path}, which holds {n} rows"
            )
        rows = torch.where(rows < 0, rows + n, rows)
        unique = torch.unique(rows)
        breaks = (torch.nonzero(torch.diff(unique) != 1).flatten() + 1).tolist()
        parts = [
            self.read_slab(int(run[0]), int(run[-1]) + 1)
            for run in torch.tensor_split(unique, breaks)
            if len(run)
        ]
        if not parts:
            return self.read_slab(0, 0)[rows]
        slab = torch.cat(parts) if len(parts) > 1 else parts[0]
        return slab[torch.searchsorted(unique, rows)]

    def __iter__(self) -> Iterator[TensorDict]:
        """Every committed row in order (batch size ``[]`` each), read in slabs."""
        for slab in self.iter_slabs(4096):
            yield from slab.unbind(0)

    def iter_episodes(
        self, columns: Iterable[str] | None = None, *, raw: bool = False
    ) -> Iterator[TensorDict]:
        """Every committed episode in order, as :meth:`episode` returns it."""
        for i in range(self._episodes_n):
            yield self.episode(i, columns, raw=raw)

    def make_env(self, **kwargs: Any):
        """``gymnasium.make(env_id, **kwargs)`` for the environment the store records.

        A store recorded from gymnasium (or imported from Minari) keeps the env's spec,
        constructor kwargs and wrappers included; the env is rebuilt from it, and
        ``kwargs`` override the recorded ones.

        Raises :class:`EnvUnavailableError` when the store records no env id, gymnasium
        is not installed, or gymnasium does not know the id.
        """
        env_id = self._manifest.env_id
        if not env_id:
            raise EnvUnavailableError(
                f"{self.path} records no env id; pass env_id= to TrajectoryStoreWriter when writing it"
            )
        try:
            import gymnasium
        except ImportError as exc:
            raise EnvUnavailableError(
                f"make_env needs gymnasium to build {env_id!r}: pip install gymnasium"
            ) from exc
        spec = _recorded_spec(self._manifest.metadata, env_id)
        try:
            if spec is not None:
                return gymnasium.make(gymnasium.envs.registration.EnvSpec.from_json(spec), **kwargs)
            return gymnasium.make(env_id, **kwargs)
        except (gymnasium.error.Error, ImportError, AttributeError, ValueError, TypeError) as exc:
            raise EnvUnavailableError(
                f"gymnasium cannot make {env_id!r} (recorded in {self.path}): {exc}"
            ) from exc

    def column(self, name: str) -> ColumnSpec:
        for spec in self.columns:
            if spec.name == name:
                return spec
        raise ColumnError(
            f"no column '{name}' in {self.path}; columns are {[c.name for c in self.columns]}"
        )

    def select_columns(self, columns: Iterable[str] | None) -> list[ColumnSpec]:
        """The specs of ``columns`` (names, or nested keys), all columns for ``None``."""
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        return [self.column(name if isinstance(name, str) else "/".join(name)) for name in columns]

    # ----------------------------------------------------------------- reading
    def read_column(self, name: str, start: int, stop: int) -> np.ndarray:
        """One column's rows ``[start, stop)`` in its storage dtype (verified)."""
        return self._ds.columns[self.column(name).name].read(
            start, stop, self._rows, self._latest(0)
        )

    def read_slab(
        self,
        start: int,
        stop: int,
        columns: Iterable[str] | None = None,
        *,
        raw: bool = False,
    ) -> TensorDict:
        """Contiguous rows ``[start, stop)`` as a TensorDict (quantised columns dequantised unless ``raw``)."""
        try:
            start, stop = operator.index(start), operator.index(stop)
        except TypeError as exc:
            raise RowIndexError(f"slab bounds must be ints, got {start!r} and {stop!r}") from exc
        if not 0 <= start <= stop <= self._rows:
            raise RowIndexError(
                f"slab [{start}, {stop}) is outside the rows [0, {self._rows}) of {self.path} "
                "(bounds are absolute and ascending; negative bounds are not accepted)"
            )
        leaves: dict[Any, torch.Tensor] = {}
        for spec in self.select_columns(columns):
            value = torch.from_numpy(self.read_column(spec.name, start, stop))
            if spec.quantize is not None and not raw:
                value = spec.quantize.decode(value, spec.dtype)
            leaves[spec.key] = value
        return TensorDict(leaves, batch_size=[stop - start])

    def iter_slabs(
        self, rows: int = 65536, columns: Iterable[str] | None = None, *, raw: bool = False
    ) -> Iterator[TensorDict]:
        """Stream the whole store as consecutive slabs of ``rows`` rows (the last may be shorter)."""
        if rows < 1:
            raise RowIndexError(f"rows ({rows}) must be >= 1")
        names = [s.name for s in self.select_columns(columns)]
        for start in range(0, self._rows, rows):
            yield self.read_slab(start, min(start + rows, self._rows), names, raw=raw)

    def episode(
        self, index: int, columns: Iterable[str] | None = None, *, raw: bool = False
    ) -> TensorDict:
        """All rows of one episode."""
        start, stop = self._episodes.range(index)
        return self.read_slab(start, stop, columns, raw=raw)

    def episode_metadata(self, index: int) -> dict[str, Any]:
        """The metadata given when the episode was committed (``{}`` if none)."""
        self._episodes.range(index)  # bounds check
        index %= self._episodes_n
        end = int(self._meta_end[index])
        begin = int(self._meta_end[index - 1]) if index else 0
        if begin == end:
            return {}
        raw = self._ds.ep_meta.read(begin, end, self._meta_n, self._latest(2))
        try:
            return json.loads(raw.tobytes())
        except (ValueError, RecursionError) as exc:
            raise IntegrityError(
                f"{self.path}: episode {index} metadata is not valid JSON"
            ) from exc

    # ----------------------------------------------------------------- residency
    def resident(self, columns: Sequence[str] | None = None, device: torch.device | str = "cpu"):
        """Load columns into memory on ``device``; returns a :class:`ResidentStore` for gathers."""
        from torchstore.data.resident import ResidentStore

        return ResidentStore.load(self, columns=columns, device=device)

    def window(
        self, rows: int, columns: Sequence[str] | None = None, device: torch.device | str = "cpu"
    ):
        """A :class:`WindowedStore` of ``rows`` resident rows, refilled by contiguous reads."""
        from torchstore.data.windowed import WindowedStore

        return WindowedStore(self, rows, columns=columns, device=device)

    # ----------------------------------------------------------------- lifetime
    def size_on_disk(self) -> int:
        return self.path.stat().st_size

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TrajectoryStore({str(self.path)!r}, rows={self._rows}, episodes={self._episodes_n})"
        )
