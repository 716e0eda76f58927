"""torchstore: the data layer under PyTorch RL and robot learning.

Trajectory stores on disk (HDF5, crash-safe streaming writes), resident views for fast
gathers, replay buffers and samplers that plug into torchrl.
"""

from torchstore._version import __version__
from torchstore.data import (
    ColumnSpec,
    EpisodeIndex,
    Manifest,
    Quantize,
    ResidentStore,
    TrajectoryStore,
    TrajectoryStoreWriter,
    WindowedStore,
)
from torchstore.errors import (
    ColumnError,
    EpisodeError,
    IntegrityError,
    StoreFormatError,
    TorchstoreError,
)

__all__ = [
    "__version__",
    "ColumnSpec",
    "EpisodeIndex",
    "Manifest",
    "Quantize",
    "ResidentStore",
    "TrajectoryStore",
    "TrajectoryStoreWriter",
    "WindowedStore",
    "TorchstoreError",
    "ColumnError",
    "EpisodeError",
    "IntegrityError",
    "StoreFormatError",
]
