"""The data layer: the store on disk, rows in memory, the replay ring and residency.

Its top level holds the vocabulary every room below uses: column declarations
(:mod:`~torchstore.data.columns`), the episode index (:mod:`~torchstore.data.episodes`) and
uint8 quantisation (:mod:`~torchstore.data.quantize`). The rooms, each importing only those
below it: :mod:`~torchstore.data.file` (the HDF5 file: layout, manifest, reads, the writer),
:mod:`~torchstore.data.rows` (packed rows in memory and their compiled copies),
:mod:`~torchstore.data.replay` (the replay ring, torchrl's ``Storage``),
:mod:`~torchstore.data.residency` (a store's rows moved into memory by contiguous reads) and
:mod:`~torchstore.data.store` (:class:`TrajectoryStore`, shard sets, verification). The data
layer imports :mod:`torchstore.io`, never the samplers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.data.columns import ColumnSpec
    from torchstore.data.episodes import EpisodeIndex
    from torchstore.data.file.manifest import Manifest
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.data.quantize import Quantize
    from torchstore.data.replay.buffer_dump import dump_buffer, load_buffer
    from torchstore.data.residency.resident import ResidentStore
    from torchstore.data.residency.resident_storage import ResidentStorage
    from torchstore.data.residency.windowed import WindowedStore
    from torchstore.data.rows.packed import PackedColumns
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.data.store.store_set import StoreSet

_EXPORTS = {
    "ColumnSpec": "torchstore.data.columns",
    "EpisodeIndex": "torchstore.data.episodes",
    "Manifest": "torchstore.data.file.manifest",
    "PackedColumns": "torchstore.data.rows.packed",
    "Quantize": "torchstore.data.quantize",
    "ResidentStore": "torchstore.data.residency.resident",
    "ResidentStorage": "torchstore.data.residency.resident_storage",
    "TrajectoryStore": "torchstore.data.store.store",
    "StoreSet": "torchstore.data.store.store_set",
    "WindowedStore": "torchstore.data.residency.windowed",
    "TrajectoryStoreWriter": "torchstore.data.file.writer",
    "dump_buffer": "torchstore.data.replay.buffer_dump",
    "load_buffer": "torchstore.data.replay.buffer_dump",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ColumnSpec",
    "EpisodeIndex",
    "Manifest",
    "PackedColumns",
    "Quantize",
    "ResidentStore",
    "ResidentStorage",
    "StoreSet",
    "TrajectoryStore",
    "TrajectoryStoreWriter",
    "WindowedStore",
    "dump_buffer",
    "load_buffer",
]
