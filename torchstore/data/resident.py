"""A store's columns loaded into memory on a device, for gathers of scattered rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from torchstore.data.columns import ColumnSpec
from torchstore.data.episodes import EpisodeIndex
from torchstore.data.packed import PackedColumns

if TYPE_CHECKING:
    from torchstore.data.store import TrajectoryStore

__all__ = ["ResidentStore"]

_LOAD_SLAB_ROWS = 1 << 18


class ResidentStore:
    """Columns of a trajectory store held in memory; rows are gathered by index.

    Built by :meth:`TrajectoryStore.resident`. Each gather is one ``index_select`` per
    dtype block (see :class:`PackedColumns`); quantised columns are dequantised on the
    device the batch lands on.

    Examples:
        >>> view = TrajectoryStore("demo.h5").resident(device="cpu")
        >>> view.gather(torch.tensor([0, 5, 9]))["obs"].shape
        torch.Size([3, 3])
    """

    def __init__(self, packed: PackedColumns, episodes: EpisodeIndex, num_rows: int):
        self.packed = packed
        self.episodes = episodes
        self.num_rows = int(num_rows)
        self.fill_level = torch.tensor(self.num_rows, dtype=torch.int64, device=packed.device)
        self.cursor_tensor = torch.tensor(0, dtype=torch.int64, device=packed.device)

    @classmethod
    def load(
        cls,
        store: TrajectoryStore,
        columns: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
    ) -> ResidentStore:
        specs = store._select(columns)
        packed = PackedColumns(specs, store.num_rows, device)
        for start in range(0, store.num_rows, _LOAD_SLAB_ROWS):
            stop = min(start + _LOAD_SLAB_ROWS, store.num_rows)
            packed.write(
                slice(start, stop),
                {s.name: torch.from_numpy(store.read_column(s.name, start, stop)) for s in specs},
            )
        return cls(packed, store.episodes.to(device), store.num_rows)

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        return self.packed.columns

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def capacity(self) -> int:
        return self.num_rows

    @property
    def cursor(self) -> int:
        """Where a ring would write next: a full read-only store wraps to row 0."""
        return 0

    def __len__(self) -> int:
        return self.num_rows

    def gather(self, index: torch.Tensor, *, raw: bool = False) -> TensorDict:
        """Rows at ``index`` (int64 on this view's device) as a TensorDict ``[len(index)]``.

        ``raw=True`` returns quantised columns as their uint8 codes.
        """
        return self.packed.gather(index, raw=raw)

    def episode_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start, length, episode_id)`` of every episode, on this view's device."""
        ids = torch.arange(self.episodes.num_episodes, device=self.device)
        return self.episodes.offsets, self.episodes.lengths, ids

    def __repr__(self) -> str:
        return (
            f"ResidentStore(rows={self.num_rows}, episodes={self.episodes.num_episodes}, "
            f"columns={[c.name for c in self.columns]}, device={self.device}, "
            f"{self.packed.nbytes / 2**20:.1f} MiB)"
        )
