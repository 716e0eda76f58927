"""A resident store as a read-only torchrl ``Storage``: what ``TrajectoryStore.resident()`` returns.

:class:`ResidentStorage` is a :class:`~torchstore.data.replay.ring.StoreReplay` whose rows are
a :class:`~torchstore.data.residency.resident.ResidentStore`'s packed columns (shared, not copied)
and whose episodes are the store's; every write is refused. So an offline dataset is
sampled through torchrl's buffers and torchstore's samplers, the device path included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.episodes import EpisodeIndex
from torchstore.data.replay.ring import StoreReplay
from torchstore.data.residency.resident import ResidentStore
from torchstore.errors import ReadOnlyStorageError

__all__ = ["ResidentStorage"]


class ResidentStorage(StoreReplay):
    """A :class:`ResidentStore` as a read-only torchrl ``Storage``: a full ring refusing writes.

    Built by
    :meth:`TrajectoryStore.resident() <torchstore.data.store.store.TrajectoryStore.resident>`;
    ``gather``, ``episodes``, ``source`` and ``num_rows`` are the resident store's, and
    :attr:`resident` is the store itself.

    Examples:
        >>> view = TrajectoryStore("demo.h5").resident(device="cpu")
        >>> view.gather(torch.tensor([0, 5, 9]))["obs"].shape
        torch.Size([3, 3])
        >>> rb = TensorDictReplayBuffer(storage=view, batch_size=256)  # sample an offline dataset
    """

    _read_only = False

    def __init__(self, resident: ResidentStore):
        super().__init__(resident.packed.capacity, device=resident.device)
        self.resident = resident
        self.adopt_columns(resident.packed)
        episodes = resident.episodes
        rows = episodes.num_rows
        self.restore_ring(
            episodes.lengths,
            {
                "rows": rows,
                "cursor": rows % self.max_size,
                "open": False,
                "next_episode_id": episodes.num_episodes,
                "episode_ids": list(range(episodes.num_episodes)),
                "last_cursor_index": rows - 1 if rows else None,
            },
        )
        self._read_only = True

    @property
    def episodes(self) -> EpisodeIndex:
        """The store's episode index, on this view's device."""
        return self.resident.episodes

    @property
    def source(self) -> Path | str | None:
        """The store the rows were read from."""
        return self.resident.source

    @property
    def num_rows(self) -> int:
        return self.resident.num_rows

    def gather(self, index: torch.Tensor, *, raw: bool = False) -> TensorDict:
        """Rows at ``index``: see :meth:`ResidentStore.gather`."""
        return self.resident.gather(index, raw=raw)

    # ------------------------------------------------------------ read-only
    def _refuse(self, what: str) -> None:
        if self._read_only:
            raise ReadOnlyStorageError(
                f"{what}: a resident store is a read-only view of {self.source}; to train "
                "online from it, copy it into a ring with StoreReplay.from_store(store, capacity)"
            )

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        self._refuse("cannot write rows")
        super().set(cursor, data, set_cursor=set_cursor)

    def _empty(self) -> None:
        self._refuse("cannot empty it")
        super()._empty()

    def load_state_dict(self, state_dict: Any) -> None:
        self._refuse("cannot load a state into it")
        super().load_state_dict(state_dict)

    def restore_ring(self, lengths: torch.Tensor, state: Any) -> None:
        self._refuse("cannot restore a ring into it")
        super().restore_ring(lengths, state)

    def _load(self, path: Any) -> None:
        self._refuse("cannot load a checkpoint into it")
        super()._load(path)

    def __repr__(self) -> str:
        resident = getattr(self, "resident", None)
        inner = "?" if resident is None else repr(resident)
        return f"ResidentStorage({inner})"
