"""Reading a trajectory store: contiguous slabs, episodes, and the step into residency.

A store is a sequence of rows, as a torchrl storage or a LeRobot dataset is: ``len(store)``
is the committed row count, ``store[i]`` one row, ``store[a:b]`` a slab, and iterating
yields rows (read in slabs underneath); ``store.episode(i)`` and ``iter_episodes()`` walk
episodes. Scattered rows read from disk cost about 4500x a gather from memory, so
sampling reads a resident view (``resident``) or a window refilled by contiguous reads
(``window``); ``store[index_tensor]`` works but reads the runs of rows it touches.
A store pickles as the path it was opened from and opens the file again on the other side.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from torchstore.data.file.reader import StoreReader
from torchstore.data.residency.resident import ResidentStore
from torchstore.data.residency.windowed import WindowedStore
from torchstore.errors import EnvUnavailableError, RowIndexError

if TYPE_CHECKING:
    from torchstore.data.residency.resident_storage import ResidentStorage

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


class TrajectoryStore(StoreReader):
    """A store file opened for reading (a live writer may keep appending).

    What the store shows is a snapshot of the committed episodes taken at open; call
    :meth:`refresh` to see episodes committed since.

    Examples:
        >>> store = TrajectoryStore("demo.h5")
        >>> store.read_slab(0, 100)["obs"].shape
        torch.Size([100, 3])
    """

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
                f"row indices must be a 1-D integer sequence, got {rows.dtype} of shape "
                f"{list(rows.shape)}"
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
                f"{self.path} records no env id; pass env_id= to TrajectoryStoreWriter when "
                "writing it"
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

    # ----------------------------------------------------------------- residency
    def resident(
        self,
        columns: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        resize: Any = None,
        decode_device: str = "cpu",
    ) -> ResidentStorage:
        """Load columns into memory on ``device`` (checksums verified), for gathers and sampling.
        ``resize``: camera columns kept at training resolution, ``[H, W]`` for every camera
        or ``{column: [H, W]}`` (see :class:`~torchstore.io.frames.resize.FrameResize`);
        ``decode_device="cuda"`` decodes video on the GPU's decoder where there is one.

        Returns a :class:`~torchstore.data.residency.resident_storage.ResidentStorage`: the
        :class:`ResidentStore` of those rows (``gather``, ``packed``, ``episodes``) as a
        read-only torchrl ``Storage``, so ``TensorDictReplayBuffer(storage=store.resident())``
        samples the offline dataset.
        """
        # the torchrl face loads torchrl, so it is imported on first use, not with the store
        from torchstore.data.residency.resident_storage import ResidentStorage

        return ResidentStorage(
            ResidentStore.load(
                self, columns=columns, device=device, resize=resize, decode_device=decode_device
            )
        )

    def window(
        self, rows: int, columns: Sequence[str] | None = None, device: torch.device | str = "cpu"
    ) -> WindowedStore:
        """A :class:`WindowedStore` of ``rows`` resident rows, refilled by contiguous reads."""
        return WindowedStore(self, rows, columns=columns, device=device)

    # ----------------------------------------------------------------- processes
    def _open_args(self) -> tuple[Any, ...]:
        """The arguments that open this store again (what it pickles as)."""
        return (self.path,)

    def _open_kwargs(self) -> dict[str, Any]:
        """The options that open this store again: the ``cache`` a URL is read through,
        when one other than the default was given (a budget, a folder, or none)."""
        cache = getattr(self, "_cache", True)
        return {} if cache is True else {"cache": cache}

    def __reduce__(self) -> tuple[Any, ...]:
        """A store crosses a process boundary as its recipe, the path it was opened from
        (and the cache a URL reads through): the other side opens the file itself (a
        handle, its decoders and its snapshot of its own, the episodes committed by then),
        so a spawned ``DataLoader`` worker or a ``multiprocessing`` child reads the same
        rows without sharing an HDF5 handle."""
        kwargs = self._open_kwargs()
        if not kwargs:
            return (type(self), self._open_args())
        return (_reopen, (type(self), self._open_args(), kwargs))

    def __repr__(self) -> str:
        return (
            f"TrajectoryStore({str(self.path)!r}, rows={self._rows}, episodes={self._episodes_n})"
        )


def _reopen(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TrajectoryStore:
    """A store opened again from its recipe (see :meth:`TrajectoryStore.__reduce__`)."""
    return cls(*args, **kwargs)
