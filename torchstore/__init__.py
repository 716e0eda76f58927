"""torchstore: the data layer under PyTorch RL and robot learning.

Trajectory stores on disk (HDF5, crash-safe streaming writes), resident views for fast
gathers, replay buffers and samplers that plug into torchrl.

Public names are imported on first use (:mod:`torchstore._lazy`): ``import torchstore``
does not import torch, tensordict or torchrl until a name that needs them is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports
from torchstore._version import __version__
from torchstore.errors import (
    AmbiguousDatasetError,
    ArgumentError,
    ArgumentTypeError,
    ColumnError,
    EpisodeError,
    IntegrityError,
    StoreFormatError,
    TorchstoreError,
)

if TYPE_CHECKING:
    from torchstore.data import (
        ColumnSpec,
        EpisodeIndex,
        Manifest,
        Quantize,
        ResidentStorage,
        ResidentStore,
        StoreSet,
        TrajectoryStore,
        TrajectoryStoreWriter,
        WindowedStore,
    )
    from torchstore.data.replay import StoreReplay
    from torchstore.data.verify import verify_store
    from torchstore.datasets import load
    from torchstore.formats import (
        export_robomimic,
        export_zarr,
        import_rlds,
        import_robomimic,
        import_zarr,
        sniff_format,
    )
    from torchstore.gym import RecordEpisodes, record
    from torchstore.minari import export_minari, import_d4rl, import_minari
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

_EXPORTS = {
    "ColumnSpec": "torchstore.data.columns",
    "EpisodeIndex": "torchstore.data.episodes",
    "Manifest": "torchstore.data.manifest",
    "Quantize": "torchstore.data.quantize",
    "ResidentStore": "torchstore.data.resident",
    "ResidentStorage": "torchstore.data.resident_storage",
    "TrajectoryStore": "torchstore.data.store",
    "StoreSet": "torchstore.data.store_set",
    "TrajectoryStoreWriter": "torchstore.data.writer",
    "WindowedStore": "torchstore.data.windowed",
    "StoreReplay": "torchstore.data.replay",
    "ERE": "torchstore.samplers.ere",
    "PhiloxSampler": "torchstore.samplers.device",
    "PhiloxStream": "torchstore.samplers.philox",
    "PrioritizedSampler": "torchstore.samplers.prioritized",
    "SequenceWindowSampler": "torchstore.samplers.sequence",
    "UniformSampler": "torchstore.samplers.uniform",
    "empty_batch": "torchstore.samplers.device",
    "sample_into": "torchstore.samplers.device",
    "update_priority_": "torchstore.samplers.device",
    "RecordEpisodes": "torchstore.gym.recorder",
    "record": "torchstore.gym.recorder",
    "import_minari": "torchstore.minari.importer",
    "export_minari": "torchstore.minari.exporter",
    "import_d4rl": "torchstore.minari.d4rl",
    # the demonstration formats: names resolved by torchstore.formats' own lazy table
    "import_robomimic": "torchstore.formats",
    "export_robomimic": "torchstore.formats",
    "import_zarr": "torchstore.formats",
    "export_zarr": "torchstore.formats",
    "import_rlds": "torchstore.formats",
    "sniff_format": "torchstore.formats",
    "verify_store": "torchstore.data.verify",
    "load": "torchstore.datasets",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "__version__",
    "ColumnSpec",
    "EpisodeIndex",
    "Manifest",
    "Quantize",
    "ResidentStore",
    "ResidentStorage",
    "StoreSet",
    "TrajectoryStore",
    "TrajectoryStoreWriter",
    "WindowedStore",
    "StoreReplay",
    "ERE",
    "PhiloxSampler",
    "PhiloxStream",
    "PrioritizedSampler",
    "SequenceWindowSampler",
    "UniformSampler",
    "empty_batch",
    "sample_into",
    "update_priority_",
    "RecordEpisodes",
    "record",
    "import_minari",
    "export_minari",
    "import_d4rl",
    "import_robomimic",
    "export_robomimic",
    "import_zarr",
    "export_zarr",
    "import_rlds",
    "sniff_format",
    "verify_store",
    "load",
    "TorchstoreError",
    "ColumnError",
    "EpisodeError",
    "IntegrityError",
    "StoreFormatError",
    "ArgumentError",
    "ArgumentTypeError",
    "AmbiguousDatasetError",
]
