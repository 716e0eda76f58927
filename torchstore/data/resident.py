"""A store's columns loaded into memory on a device: gathers, and a read-only torchrl Storage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from torchstore.data.episodes import EpisodeIndex
from torchstore.data.replay import StoreReplay
from torchstore.errors import ReadOnlyStorageError, RowIndexError

if TYPE_CHECKING:
    from torchstore.data.store import TrajectoryStore

__all__ = ["ResidentStore"]


class ResidentStore(StoreReplay):
    """Columns of a trajectory store held in memory; rows are gathered by index.

    Built by :meth:`TrajectoryStore.resident`. All of a row's columns sit side by side in
    one packed block (see :class:`~torchstore.data.packed.PackedColumns`), so a gather is
    one ``index_select``; quantised columns are dequantised on the device the batch lands on.

    It is also a read-only torchrl ``Storage`` (a full :class:`StoreReplay` that refuses
    writes), so an offline dataset can be sampled through torchrl's buffers and torchstore's
    samplers, the device path included.

    Examples:
        >>> view = TrajectoryStore("demo.h5").resident(device="cpu")
        >>> view.gather(torch.tensor([0, 5, 9]))["obs"].shape
        torch.Size([3, 3])
        >>> rb = TensorDictReplayBuffer(storage=view, batch_size=256)  # sample an offline dataset
    """

    _read_only = False

    @classmethod
    def load(
        cls,
        store: TrajectoryStore,
        columns: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
    ) -> ResidentStore:
        view = cls.from_store(store, max(store.num_rows, 1), device=device, columns=columns)
        view.episodes = store.episodes.to(device)
        view.source = store.path
        view._read_only = True
        return view

    @property
    def num_rows(self) -> int:
        return len(self)

    def gather(self, index: torch.Tensor, *, raw: bool = False) -> TensorDict:
        """Rows at ``index`` (int64 on this view's device) as a TensorDict ``[len(index)]``.

        ``raw=True`` returns quantised columns as their uint8 codes. Indices must lie in
        ``[0, len(self))``; one outside is a :class:`RowIndexError` naming it (checking
        costs one reduction, and on a GPU one synchronisation: samplers that draw valid
        rows by construction gather through ``packed.gather`` directly).
        """
        index = torch.as_tensor(index)
        if index.dtype != torch.int64 or index.device != self.device:
            index = index.to(device=self.device, dtype=torch.int64)
        if index.numel():
            lo, hi = torch.aminmax(index)
            lo, hi = int(lo), int(hi)
            n = len(self)
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                raise RowIndexError(
                    f"gather index {bad} is out of range for {self!r}: it holds {n} rows (indices 0..{n - 1})"
                )
        return self.packed.gather(index, raw=raw)

    # ------------------------------------------------------------ read-only
    def _refuse(self, what: str) -> None:
        if self._read_only:
            raise ReadOnlyStorageError(
                f"{what}: a ResidentStore is a read-only view of {self.source}; to train online "
                "from it, copy it into a ring with StoreReplay.from_store(store, capacity)"
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

    def _load(self, path: Any) -> None:
        self._refuse("cannot load a checkpoint into it")
        super()._load(path)

    def __repr__(self) -> str:
        return (
            f"ResidentStore({str(getattr(self, 'source', '?'))!r}, rows={len(self)}, "
            f"episodes={getattr(self, 'episodes', EpisodeIndex(torch.zeros(0))).num_episodes}, "
            f"columns={[c.name for c in self.columns or ()]}, device={self.device}, "
            f"{self.packed.nbytes / 2**20:.1f} MiB)"
        )
