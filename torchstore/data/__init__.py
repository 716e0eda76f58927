"""The store: declared columns, the manifest, the episode index, residency and replay."""

from torchstore.data.columns import ColumnSpec
from torchstore.data.episodes import EpisodeIndex
from torchstore.data.manifest import Manifest
from torchstore.data.packed import PackedColumns
from torchstore.data.quantize import Quantize
from torchstore.data.resident import ResidentStore
from torchstore.data.store import TrajectoryStore
from torchstore.data.windowed import WindowedStore
from torchstore.data.writer import TrajectoryStoreWriter

__all__ = [
    "ColumnSpec",
    "EpisodeIndex",
    "Manifest",
    "PackedColumns",
    "Quantize",
    "ResidentStore",
    "TrajectoryStore",
    "TrajectoryStoreWriter",
    "WindowedStore",
]
