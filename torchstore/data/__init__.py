"""The store: declared columns, the manifest, the episode index, residency and replay."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.data.buffer_checkpoint import dump_buffer, load_buffer
    from torchstore.data.columns import ColumnSpec
    from torchstore.data.episodes import EpisodeIndex
    from torchstore.data.manifest import Manifest
    from torchstore.data.packed import PackedColumns
    from torchstore.data.quantize import Quantize
    from torchstore.data.resident import ResidentStore
    from torchstore.data.resident_storage import ResidentStorage
    from torchstore.data.store import TrajectoryStore
    from torchstore.data.store_set import StoreSet
    from torchstore.data.windowed import WindowedStore
    from torchstore.data.writer import TrajectoryStoreWriter

_EXPORTS = {
    "ColumnSpec": "torchstore.data.columns",
    "EpisodeIndex": "torchstore.data.episodes",
    "Manifest": "torchstore.data.manifest",
    "PackedColumns": "torchstore.data.packed",
    "Quantize": "torchstore.data.quantize",
    "ResidentStore": "torchstore.data.resident",
    "ResidentStorage": "torchstore.data.resident_storage",
    "TrajectoryStore": "torchstore.data.store",
    "StoreSet": "torchstore.data.store_set",
    "WindowedStore": "torchstore.data.windowed",
    "TrajectoryStoreWriter": "torchstore.data.writer",
    "dump_buffer": "torchstore.data.buffer_checkpoint",
    "load_buffer": "torchstore.data.buffer_checkpoint",
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
