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
from torchstore.samplers import (
    ERE,
    PhiloxSampler,
    PhiloxStream,
    PrioritizedSampler,
    SequenceWindowSampler,
    UniformSampler,
    empty_batch,
    sample_into,
    update_priority_,
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
    "ERE",
    "PhiloxSampler",
    "PhiloxStream",
    "PrioritizedSampler",
    "SequenceWindowSampler",
    "UniformSampler",
    "empty_batch",
    "sample_into",
    "update_priority_",
    "TorchstoreError",
    "ColumnError",
    "EpisodeError",
    "IntegrityError",
    "StoreFormatError",
]
