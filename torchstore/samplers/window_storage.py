"""A read-only torchrl storage over a window of a store larger than memory, and its sampler.

torchrl's offline training loops sample a ``TensorDictReplayBuffer``. Over a store too large
for memory, :class:`WindowStorage` holds a :class:`~torchstore.samplers.block_window.BlockWindow`
(``K`` resident blocks refilled in the background) and :class:`WindowSampler` draws from
it with the sampling core's refill schedule: uniform over all the store's rows, or
prioritized with priorities for the whole store. Rows are addressed by their *store* row
number (a batch's ``"index"``), so ``rb.update_priority(batch["index"], td_error)`` works
as over a resident store. A row that is not resident cannot be read (``RowIndexError``):
sample through :class:`WindowSampler`, whose rows always are.

Examples:
    >>> storage = WindowStorage("big.h5", resident="8GiB", batch_size=256)
    >>> rb = TensorDictReplayBuffer(storage=storage, sampler=WindowSampler(storage, seed=0),
    ...                             batch_size=256)
    >>> batch = rb.sample()          # 256 rows of the resident blocks, "index" = store rows
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import TensorStorage

from torchstore.data.store import TrajectoryStore
from torchstore.errors import ReadOnlyStorageError
from torchstore.samplers.block_window import BlockWindow
from torchstore.samplers.philox import PhiloxStream

__all__ = ["WindowStorage", "WindowSampler"]

_STREAM_BLOCK = 1 << 14


class WindowStorage(TensorStorage):
    """Read-only torchrl storage over ``K`` resident blocks of a trajectory store.

    Args:
        store: a store path (opened here and kept open; :meth:`close` closes it) or an
            open :class:`~torchstore.data.TrajectoryStore`.
        resident: the budget: rows (int) or bytes (``"8GiB"``, ``"512MB"``).
        batch_size: rows per sample (the schedule sizes its phases in these batches).
        columns: columns to hold (all when ``None``).
        resident_blocks: ``K``, blocks sampled from at once.
        device: where the resident rows live and batches land.
        seed: key of the Philox stream of the block order.
        prioritized: keep priorities for every row of the store (they start at 1) and draw
            by them; ``alpha``, ``beta``, ``eps`` as torchrl's ``PrioritizedSampler``. These
            priorities grow with the store and are held beside ``resident``, not in it
            (about 512 MiB for 10 M rows in float64; see
            :class:`~torchstore.samplers.block_window.BlockWindow`).
        rank, world_size: under data parallelism, rank ``rank`` reads only its disjoint
            share of every epoch's blocks.
        reuse: draws per row per time its block is read (see
            :class:`~torchstore.samplers.refill.RefillSchedule`).
    """

    def __init__(
        self,
        store: str | os.PathLike | TrajectoryStore,
        resident: int | str,
        *,
        batch_size: int,
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
    ):
        self._owns_store = not isinstance(store, TrajectoryStore)
        self.source = store if self._owns_store else store.path
        opened = TrajectoryStore(store) if self._owns_store else store
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
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            device=device,
            priorities=None if self.prioritized is None else self.prioritized.tree,
            beta=beta,
            reuse=reuse,
        )
        self.store = opened
        super().__init__(storage=None, max_size=max(n, 1), device=self.window.device)

    # ------------------------------------------------------------ reads
    def __len__(self) -> int:
        return self.store.num_rows

    def get(self, index: Any) -> Any:
        """Resident store rows ``index`` (int64 tensor, numpy array, list, 1-tuple, int)."""
        if type(index) is tuple and len(index) == 1:
            index = index[0]
        single = isinstance(index, (int, np.integer))
        rows = torch.as_tensor(np.asarray(index) if not torch.is_tensor(index) else index)
        rows = rows.reshape(-1).to(device=self.window.device, dtype=torch.int64)
        out = self.window.packed.gather(self.window.to_packed(rows))
        return out[0] if single else out

    def contains(self, item: Any) -> bool:
        rows = torch.as_tensor(item, dtype=torch.int64).reshape(-1)
        try:
            self.window.to_packed(rows)
        except IndexError:
            return False
        return True

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
        self.storage.window.load_state_dict(state_dict["window"])

    def dumps(self, path: Any) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "window_sampler.pt")

    def loads(self, path: Any) -> None:
        from pathlib import Path

        self.load_state_dict(torch.load(Path(path) / "window_sampler.pt", weights_only=True))

    def __repr__(self) -> str:
        return f"WindowSampler(seed={self.philox.seed}, stream={self.philox.stream})"
