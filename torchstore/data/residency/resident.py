"""A store's columns loaded into memory on a device: the packed rows and the episode index.

:class:`ResidentStore` is the data a sampler reads: every column of a row side by side in
one packed block and the store's episode index, on one device. It knows nothing of
torchrl; :class:`~torchstore.data.residency.resident_storage.ResidentStorage` is the read-only
torchrl ``Storage`` over it, which is what ``TrajectoryStore.resident()`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tensordict import TensorDict

from torchstore.data.episodes import EpisodeIndex
from torchstore.data.file.reader import StoreReader
from torchstore.data.rows.packed import PackedColumns, PackedRows
from torchstore.errors import RowIndexError

__all__ = ["ResidentStore"]

#: Rows read from the store per slab while loading.
_SLAB_ROWS = 65536


class ResidentStore(PackedRows):
    """Columns of a trajectory store held in memory; rows are gathered by index.

    All of a row's columns sit side by side in one packed block (see
    :class:`~torchstore.data.rows.packed.PackedColumns`), so a gather is one ``index_select``;
    quantised columns are held as their uint8 codes and dequantised on the device the
    batch lands on.

    Args:
        packed: the rows (``len`` is ``episodes.num_rows``; the blocks may hold more).
        episodes: the episode index over those rows, on the same device.
        source: the store the rows were read from, for messages.

    Examples:
        >>> view = ResidentStore.load(TrajectoryStore("demo.h5"), device="cpu")
        >>> view.gather(torch.tensor([0, 5, 9]))["obs"].shape
        torch.Size([3, 3])
    """

    def __init__(
        self, packed: PackedColumns, episodes: EpisodeIndex, source: Path | str | None = None
    ):
        if episodes.num_rows > packed.capacity:
            raise ValueError(
                f"the episode index covers {episodes.num_rows} rows but the packed columns "
                f"hold {packed.capacity}"
            )
        self.packed = packed
        self.episodes = episodes
        self.source = source

    @classmethod
    def load(
        cls,
        store: StoreReader,
        columns: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
    ) -> ResidentStore:
        """Read ``columns`` (all when ``None``) of every committed row of ``store`` onto
        ``device``, in contiguous slabs (checksums verified)."""
        specs = store.select_columns(columns)
        rows = store.num_rows
        packed = PackedColumns(specs, max(rows, 1), device)
        names = [spec.name for spec in specs]
        for start in range(0, rows, _SLAB_ROWS):
            stop = min(start + _SLAB_ROWS, rows)
            slab = store.read_slab(start, stop, names, raw=True)
            packed.write(slice(start, stop), {spec.name: slab.get(spec.key) for spec in specs})
        return cls(packed, store.episodes.to(packed.device), store.path)

    @property
    def num_rows(self) -> int:
        return self.episodes.num_rows

    def __len__(self) -> int:
        return self.episodes.num_rows

    def episode_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start, length, episode_id)`` of every episode, int64 on the device, in order."""
        episodes = self.episodes
        ids = torch.arange(episodes.num_episodes, dtype=torch.int64, device=episodes.device)
        return episodes.offsets, episodes.lengths, ids

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
                    f"gather index {bad} is out of range for {self!r}: it holds {n} rows "
                    f"(indices 0..{n - 1})"
                )
        return self.packed.gather(index, raw=raw)

    def __repr__(self) -> str:
        return (
            f"ResidentStore({str(self.source)!r}, rows={len(self)}, "
            f"episodes={self.episodes.num_episodes}, "
            f"columns={[c.name for c in self.columns]}, device={self.device}, "
            f"{self.packed.nbytes / 2**20:.1f} MiB)"
        )
