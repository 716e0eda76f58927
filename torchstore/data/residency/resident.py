"""A store's columns loaded into memory on a device: the packed rows and the episode index.

:class:`ResidentStore` is the data a sampler reads: every column of a row side by side in
one packed block and the store's episode index, on one device. It knows nothing of
torchrl; :class:`~torchstore.data.residency.resident_storage.ResidentStorage` is the read-only
torchrl ``Storage`` over it, which is what ``TrajectoryStore.resident()`` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.episodes import EpisodeIndex
from torchstore.data.file.reader import StoreReader
from torchstore.data.rows.packed import PackedColumns, PackedRows
from torchstore.errors import RowIndexError
from torchstore.io.frames.resize import frame_resizes

__all__ = ["ResidentStore"]

#: Rows read from the store per slab while loading.
_SLAB_ROWS = 65536
#: full-size frame bytes read at once for a resized camera column
_RESIZE_BYTES = 64 << 20


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
        resize: Any = None,
        decode_device: str = "cpu",
    ) -> ResidentStore:
        """Read ``columns`` (all when ``None``) of every committed row of ``store`` onto
        ``device``, in contiguous slabs (checksums verified). ``resize``: camera columns
        kept at training resolution (see :func:`~torchstore.io.frames.resize.frame_resizes`),
        cropped and resized as they are decoded or read. ``decode_device``: where video is
        decoded (``"cuda"``: the GPU's decoder where there is one)."""
        specs = store.select_columns(columns)
        resizes = frame_resizes(resize, {spec.name: spec.shape for spec in specs})
        full = {spec.name: spec for spec in specs}
        specs = [
            dataclasses.replace(spec, shape=resizes[spec.name].shape(spec.shape))
            if spec.name in resizes
            else spec
            for spec in specs
        ]
        rows = store.num_rows
        packed = PackedColumns(specs, max(rows, 1), device)
        # read column by column: resized cameras, and video decoded on the GPU
        apart: dict[str, Any] = dict(resizes)
        if decode_device != "cpu":
            for spec in specs:
                if spec.codec is not None and spec.codec.is_video:
                    apart.setdefault(spec.name, None)
        plain = [spec for spec in specs if spec.name not in apart]
        for start in range(0, rows, _SLAB_ROWS):
            stop = min(start + _SLAB_ROWS, rows)
            if plain:
                slab = store.read_slab(start, stop, [spec.name for spec in plain], raw=True)
                packed.write(slice(start, stop), {spec.name: slab.get(spec.key) for spec in plain})
        for name, frame_resize in apart.items():
            # in parts of at most _RESIZE_BYTES of full-size frames (a raw column is read
            # whole before it is resized)
            step = max(1, _RESIZE_BYTES // max(full[name].row_nbytes, 1))
            for start in range(0, rows, step):
                stop = min(start + step, rows)
                value = store.read_column(
                    name, start, stop, resize=frame_resize, decode_device=decode_device
                )
                packed.write(slice(start, stop), {name: torch.from_numpy(value)})
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
