"""A read-only torchrl storage over a window of a store larger than memory, and its sampler.

torchrl's offline training loops sample a ``TensorDictReplayBuffer``. Over a store too large
for memory, :class:`WindowStorage` holds a :class:`~torchstore.window.block_window.BlockWindow`
(``K`` resident blocks refilled in the background) and :class:`WindowSampler` draws from
it with the sampling core's refill schedule: uniform over all the store's rows, or
prioritized with priorities for the whole store. Rows are addressed by their *store* row
number (a batch's ``"index"``), so ``rb.update_priority(batch["index"], td_error)`` works
as over a resident store. A row that is not resident cannot be read (``RowIndexError``):
sample through :class:`WindowSampler`, whose rows always are.

Pickled (a spawned process, a ``DataLoader`` worker), the storage and its sampler travel as
their recipe: the store's path, the options, the window's position, the priorities and the
stream's position; the other side opens the store, its window and its refill thread itself.

Like every torchrl storage it takes no batch size: the buffer's ``sample`` call gives it
(``rb.sample()`` with the buffer's ``batch_size``, or ``rb.sample(B)``), and a later call may
ask for another size (see :meth:`WindowStorage.fit_batch_size`).

Examples:
    >>> storage = WindowStorage("big.h5", resident="8GiB")
    >>> rb = TensorDictReplayBuffer(storage=storage, sampler=WindowSampler(storage, seed=0),
    ...                             batch_size=256)
    >>> batch = rb.sample()          # 256 rows of the resident blocks, "index" = store rows
    >>> big = rb.sample(1024)        # another size: the schedule keeps its rows per phase
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import TensorStorage

from torchstore.data.store.store import TrajectoryStore
from torchstore.data.store.store_set import open_store
from torchstore.errors import ReadOnlyStorageError, RowIndexError, UnsupportedError
from torchstore.samplers.philox import PhiloxStream
from torchstore.validation import positive_int
from torchstore.window.block_window import BlockWindow

__all__ = ["WindowStorage", "WindowSampler"]

_STREAM_BLOCK = 1 << 14


class WindowStorage(TensorStorage):
    """Read-only torchrl storage over ``K`` resident blocks of a trajectory store.

    Args:
        store: a store path (opened here and kept open; :meth:`close` closes it) or an
            open :class:`~torchstore.data.TrajectoryStore`.
        resident: the budget: rows (int) or bytes (``"8GiB"``, ``"512MB"``).
        batch_size: optional, kept for callers that pass it (no torchrl storage takes one):
            the size of the first batches. ``None`` (the default) takes the first
            ``sample`` call's size; a later call with another size works too (see
            :meth:`fit_batch_size`).
        columns: columns to hold (all when ``None``).
        resident_blocks: ``K``, blocks sampled from at once.
        device: where the resident rows live and batches land.
        seed: key of the Philox stream of the block order.
        prioritized: keep priorities for every row of the store (they start at 1) and draw
            by them; ``alpha``, ``beta``, ``eps`` as torchrl's ``PrioritizedSampler``. These
            priorities grow with the store and are held beside ``resident``, not in it
            (about 512 MiB for 10 M rows in float64; see
            :class:`~torchstore.window.block_window.BlockWindow`).
        rank, world_size: under data parallelism, rank ``rank`` reads only its disjoint
            share of every epoch's blocks.
        reuse: draws per row per time its block is read (see
            :class:`~torchstore.samplers.refill.RefillSchedule`).
        resize: camera columns held at training resolution, cropped and resized once as
            they are decoded: ``[H, W]`` for every camera column, or ``{column: [H, W]}``
            (see :class:`~torchstore.io.frames.resize.FrameResize`).
        decode_device: where video frames are decoded, ``"cpu"`` or ``"cuda"`` (the GPU's
            decoder where there is one; see :mod:`torchstore.io.frames.decode_device`).
    """

    def __init__(
        self,
        store: str | os.PathLike | TrajectoryStore,
        resident: int | str,
        *,
        batch_size: int | None = None,
        columns: Sequence[str] | None = None,
        resident_blocks: int = 4,
        device: torch.device | str = "cpu",
        seed: int = 0,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        rank: int = 0,
        world_size: int = 1,
        reuse: float = 1.0,
        resize: Any = None,
        decode_device: str = "cpu",
    ):
        #: the batch size the schedule counts its phases in; None until the first sample
        self.batch_size = positive_int("batch_size", batch_size, allow_none=True)
        #: the options that open this storage again in another process (see __reduce__)
        self._recipe = {
            "resident": resident,
            "columns": None if columns is None else list(columns),
            "resident_blocks": resident_blocks,
            "device": str(device),
            "seed": seed,
            "prioritized": prioritized,
            "alpha": alpha,
            "beta": beta,
            "eps": eps,
            "rank": rank,
            "world_size": world_size,
            "reuse": reuse,
            "resize": resize,
            "decode_device": decode_device,
        }
        self._owns_store = not isinstance(store, TrajectoryStore)
        self.source = store if self._owns_store else store.path
        opened = open_store(store) if self._owns_store else store  # a file, a folder or a URL
        episodes = opened.episodes
        n = opened.num_rows
        self.prioritized = None
        if prioritized:
            from torchstore.samplers.prioritized import PrioritizedSampler

            self.prioritized = PrioritizedSampler(
                max(n, 1), alpha=alpha, beta=beta, eps=eps, device=device
            )
            self.prioritized.update_priority(torch.arange(n, device=device), 1.0)
        self.window = BlockWindow(
            opened,
            columns,
            segments=(episodes.offsets, episodes.lengths, torch.arange(len(episodes.lengths))),
            budget=resident,
            resident_blocks=resident_blocks,
            # a placeholder unit until the first sample call gives one (fit_batch_size)
            batch_size=1 if batch_size is None else batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            device=device,
            priorities=None if self.prioritized is None else self.prioritized.tree,
            beta=beta,
            reuse=reuse,
            resize=resize,
            decode_device=decode_device,
        )
        self.store = opened
        super().__init__(storage=None, max_size=max(n, 1), device=self.window.device)

    # ------------------------------------------------------------ batch size
    def fit_batch_size(self, batch_size: int) -> None:
        """Count the refill schedule's phases in batches of ``batch_size``.

        :class:`WindowSampler` calls it when a ``sample`` call asks for a size other than
        the last one. Why the window needs a batch size, and why any size works: the block
        geometry (block rows, the ``K + 1`` slots, the budget) does not depend on it; only
        how long a phase lasts does, counted in batches (its resident rows times ``reuse``
        over ``K`` batch sizes). So the first call's size is taken as it is (torchrl gives
        the size only there; ``batch_size=`` at construction only sets it earlier), and a
        later call with another size converts what the schedule has left, the current
        phase's batches and the carried remainder, into batches of the new size. Each phase
        thus still draws the same number of rows, up to less than one batch carried to the
        next phase as the schedule's own rounding is, and every row keeps the expected
        frequency of uniform (or prioritized) sampling over the whole store whatever mix
        of sizes is asked (an evaluation batch between training batches, say). Refusing
        another size would make ``rb.sample(B)`` fail for a reason no torchrl storage has;
        the conversion is a few float operations, none while the size stays the same.
        """
        n = positive_int("batch_size", batch_size)
        schedule = self.window.schedule
        unit = self.batch_size
        if unit is not None and n != unit:
            left = schedule.left * unit / n  # exact when it is a whole number of batches
            schedule.left = int(left)
            schedule.credit = schedule.credit * unit / n + (left - schedule.left)
        self.batch_size = schedule.batch_size = n

    # ------------------------------------------------------------ reads
    def __len__(self) -> int:
        return self.store.num_rows

    @property
    def shape(self) -> torch.Size:
        """``[rows of the store]``: the rows ``"index"`` numbers, resident or not."""
        return torch.Size([len(self)])

    def get(self, index: Any) -> Any:
        """Resident store rows ``index``: an int64 tensor, numpy array, list, range, slice,
        boolean mask, 1-tuple of those, or an int; negative rows count from the end.

        Raises:
            RowIndexError: for a row out of range, or one not resident now (sample through
                :class:`WindowSampler`, whose rows are).
            UnsupportedError: for a column key or a multi-dimensional index.
        """
        rows, single = _as_rows(index, len(self), self.window.device)
        try:
            packed = self.window.to_packed(rows)
        except RowIndexError:
            packed = self._to_packed_named(rows)
        out = self.window.packed.gather(packed)
        return out[0] if single else out

    def _to_packed_named(self, rows: torch.Tensor) -> torch.Tensor:
        """Packed positions of ``rows``, some not resident as they are: negative rows
        counted from the end, then out-of-range and non-resident ones refused by name."""
        n = len(self)
        outside = (rows < -n) | (rows >= n)
        if bool(outside.any()):
            bad = int(rows[outside][0])
            raise RowIndexError(f"row {bad} is out of range: the store holds {n} rows")
        try:
            return self.window.to_packed(torch.where(rows < 0, rows + n, rows))
        except RowIndexError as error:
            raise RowIndexError(
                f"{error}; a WindowStorage reads only the rows resident now: sample through "
                "WindowSampler(storage), or read rows from the store (storage.store[rows])"
            ) from None

    def contains(self, item: Any) -> Any:
        """Whether store row(s) ``item`` are resident now (readable by :meth:`get`): a
        bool for an int, an element-wise bool tensor for a tensor."""
        rows = torch.as_tensor(item, dtype=torch.int64)
        inside = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        for lo, hi in self.window.active_blocks:
            inside |= (rows >= lo) & (rows < hi)
        return bool(inside) if rows.ndim == 0 else inside

    def _rand_given_ndim(self, batch_size: int) -> Any:
        raise UnsupportedError(
            "a WindowStorage is sampled through its window: torchrl's RandomSampler would "
            "draw rows of the whole store, most of them not resident; pass "
            "sampler=WindowSampler(storage) to the replay buffer"
        )

    # ------------------------------------------------------------ read-only
    def _refuse(self, what: str) -> None:
        raise ReadOnlyStorageError(
            f"{what}: a WindowStorage is a read-only window of {self.source}; to train online "
            "copy rows into a ring with StoreReplay.from_store(store, capacity)"
        )

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        self._refuse("cannot write rows")

    def _empty(self) -> None:
        self._refuse("cannot empty it")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Any) -> None:
        if state_dict:
            self._refuse("cannot load rows into it")

    def dumps(self, path: Any) -> None:
        """Nothing to write: the rows are the store's (the sampler's state holds the window's)."""

    def loads(self, path: Any) -> None:
        """Nothing to read: see :meth:`dumps`."""

    def close(self) -> None:
        """Stop the refill thread and close the store if it was opened here."""
        self.window.close()
        if self._owns_store:
            self.store.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """The recipe: the store (its path), the options, the batch size, the window's
        position and the priorities, pickled here into bytes of their own (nothing of this
        process's memory travels); the other side opens its own store and window."""
        priorities = None if self.prioritized is None else self.prioritized.state_dict()
        state = {"window": self.window.state_dict(), "priorities": priorities}
        recipe = (self.store, {**self._recipe, "batch_size": self.batch_size}, state)
        return (_reopened_storage, (pickle.dumps(recipe),))

    def __repr__(self) -> str:
        return f"WindowStorage({str(self.source)!r}, rows={len(self)}, {self.window!r})"


class WindowSampler(Sampler):
    """Draws from a :class:`WindowStorage` by its refill schedule (uniform or prioritized).

    Args:
        storage: the window storage.
        seed: key of the Philox stream of the rows; ``stream`` (a rank) its sub-stream.

    Prioritized storages add ``"priority_weight"`` (importance weights over the whole
    store) to each sample's info; :meth:`update_priority` takes store rows.
    """

    def __init__(self, storage: WindowStorage, *, seed: int = 0, stream: int = 0):
        super().__init__()
        if not isinstance(storage, WindowStorage):
            raise TypeError(f"WindowSampler samples a WindowStorage, got {type(storage).__name__}")
        self.storage = storage
        self.philox = PhiloxStream(seed, stream, storage.window.device, block=_STREAM_BLOCK)

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        """``batch_size`` store rows resident now (the size of torchrl's ``rb.sample`` call:
        any size, see :meth:`WindowStorage.fit_batch_size`) and their info."""
        if batch_size != self.storage.batch_size:
            self.storage.fit_batch_size(batch_size)
        _, rows, _, weight = self.storage.window.draw_rows(self.philox, batch_size, segments=False)
        info: dict[str, Any] = {}
        if weight is not None:
            info["priority_weight"] = weight
        return rows, info

    def update_priority(self, index: Any, priority: Any, *, storage: Any = None) -> None:
        """Set raw priorities of store rows ``index`` (a prioritized storage only)."""
        prioritized = self.storage.prioritized
        if prioritized is None:
            raise RuntimeError("update_priority needs WindowStorage(prioritized=True)")
        index = torch.as_tensor(index, dtype=torch.int64, device=prioritized.device).reshape(-1)
        prioritized.update_priority(index, priority)
        self.storage.window.refresh_priorities(index)

    def _empty(self) -> None:
        pass

    def extend(self, index: Any) -> None:
        pass

    def add(self, index: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "position": int(self.philox.position),
            "window": self.storage.window.state_dict(),
            # the unit of the window's batch counts (None: no batch drawn yet)
            "batch_size": self.storage.batch_size,
        }
        if self.storage.prioritized is not None:
            priorities = self.storage.prioritized.state_dict()
            priorities.pop("philox", None)
            state["priorities"] = priorities
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.storage.prioritized is not None:
            self.storage.prioritized.load_state_dict(state_dict["priorities"])
        self.philox.seek(int(state_dict["position"]))
        unit = state_dict.get("batch_size")  # absent from older checkpoints: the storage's
        if unit is not None:
            self.storage.batch_size = self.storage.window.schedule.batch_size = int(unit)
        self.storage.window.load_state_dict(state_dict["window"])

    def dumps(self, path: Any) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "window_sampler.pt")

    def loads(self, path: Any) -> None:
        from pathlib import Path

        self.load_state_dict(torch.load(Path(path) / "window_sampler.pt", weights_only=True))

    def __reduce__(self) -> tuple[Any, ...]:
        """The sampler's recipe: its storage (which pickles as its own), seed, sub-stream
        and position; the other side computes its own stream blocks."""
        philox = self.philox
        where = (int(philox.seed), int(philox.stream), int(philox.position))
        return (_reopened_sampler, (self.storage, *where))

    def __repr__(self) -> str:
        return f"WindowSampler(seed={self.philox.seed}, stream={self.philox.stream})"


def _reopened_storage(recipe: bytes) -> WindowStorage:
    """A :class:`WindowStorage` made from its recipe (see :meth:`WindowStorage.__reduce__`)."""
    store, options, state = pickle.loads(recipe)
    storage = WindowStorage(store, **options)
    storage._owns_store = True  # opened from its path here
    if state["priorities"] is not None:
        storage.prioritized.load_state_dict(state["priorities"])
    storage.window._resume_at(state["window"])
    return storage


def _reopened_sampler(
    storage: WindowStorage, seed: int, stream: int, position: int
) -> WindowSampler:
    sampler = WindowSampler(storage, seed=seed, stream=stream)
    sampler.philox.seek(int(position))
    return sampler


def _as_rows(index: Any, n: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """``index`` (see :meth:`WindowStorage.get`) as flat int64 store rows on ``device``,
    and whether it named one row."""
    if type(index) is tuple and len(index) == 1:
        index = index[0]
    if isinstance(index, slice):
        index = range(n)[index]
    if isinstance(index, (str, tuple)):
        raise UnsupportedError(
            f"a WindowStorage reads rows by their store row number (one dim), not {index!r}; "
            "columns and whole-store reads come from the store (storage.store)"
        )
    if torch.is_tensor(index):
        rows = index
    else:
        array = np.asarray(index)
        rows = torch.as_tensor(array if array.size else array.astype(np.int64))
    if rows.dtype == torch.bool:
        rows = torch.arange(n, device=rows.device)[rows]
    elif rows.is_floating_point() or rows.is_complex():
        raise RowIndexError(f"store rows are integers, not {rows.dtype}")
    return rows.reshape(-1).to(device=device, dtype=torch.int64), rows.ndim == 0
