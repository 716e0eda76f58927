"""torchstore: the data layer under PyTorch RL and robot learning.

Trajectory stores on disk (HDF5, crash-safe streaming writes), resident views for fast
gathers, replay buffers and samplers that plug into torchrl.

Public names are imported on first use (:mod:`torchstore._lazy`): ``import torchstore``
does not import torch, tensordict or torchrl until a name that needs them is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import alias_moved_modules, lazy_exports
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
    from torchstore.data.replay.ring import StoreReplay
    from torchstore.data.store.verify import verify_store
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
    from torchstore.window import WindowSampler, WindowStorage

_EXPORTS = {
    "ColumnSpec": "torchstore.data.columns",
    "EpisodeIndex": "torchstore.data.episodes",
    "Manifest": "torchstore.data.file.manifest",
    "Quantize": "torchstore.data.quantize",
    "ResidentStore": "torchstore.data.residency.resident",
    "ResidentStorage": "torchstore.data.residency.resident_storage",
    "TrajectoryStore": "torchstore.data.store.store",
    "StoreSet": "torchstore.data.store.store_set",
    "TrajectoryStoreWriter": "torchstore.data.file.writer",
    "WindowedStore": "torchstore.data.residency.windowed",
    "StoreReplay": "torchstore.data.replay.ring",
    "WindowStorage": "torchstore.window.window_storage",
    "WindowSampler": "torchstore.window.window_storage",
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
    "verify_store": "torchstore.data.store.verify",
    "load": "torchstore.datasets",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

# modules the docs named at their old places before data/, samplers/ and io/ got rooms of
# their own
alias_moved_modules(
    {
        "torchstore.data.writer": "torchstore.data.file.writer",
        "torchstore.data.resident": "torchstore.data.residency.resident",
        "torchstore.data.resident_storage": "torchstore.data.residency.resident_storage",
        "torchstore.data.windowed": "torchstore.data.residency.windowed",
        "torchstore.data.verify": "torchstore.data.store.verify",
        "torchstore.data.buffer_checkpoint": "torchstore.data.replay.buffer_dump",
        "torchstore.samplers.window_storage": "torchstore.window.window_storage",
        # io/ grouped by medium (hdf5/, frames/, remote/, records/)
        "torchstore.io.checksummed": "torchstore.io.hdf5.checksummed",
        "torchstore.io.xxh3_rows": "torchstore.io.hdf5.xxh3_rows",
        "torchstore.io.writer_lock": "torchstore.io.hdf5.writer_lock",
        "torchstore.io.reproducible": "torchstore.io.hdf5.reproducible",
        "torchstore.io.video": "torchstore.io.frames.video",
        "torchstore.io.video_encode": "torchstore.io.frames.video_encode",
        "torchstore.io.video_container": "torchstore.io.frames.video_container",
        "torchstore.io.background_encoder": "torchstore.io.frames.background_encoder",
        "torchstore.io.frame_codec": "torchstore.io.frames.codec",
        "torchstore.io.frame_codec_images": "torchstore.io.frames.codec_images",
        "torchstore.io.frame_codec_mp4": "torchstore.io.frames.codec_mp4",
        "torchstore.io.frame_codec_types": "torchstore.io.frames.codec_types",
        "torchstore.io.frame_codec_video": "torchstore.io.frames.codec_video",
        "torchstore.io.scheduling": "torchstore.io.frames.scheduling",
        "torchstore.io.http": "torchstore.io.remote.http",
        "torchstore.io.hub": "torchstore.io.remote.hub",
        "torchstore.io.transfer": "torchstore.io.remote.transfer",
        "torchstore.io.folder": "torchstore.io.remote.folder",
        "torchstore.io.checksum": "torchstore.io.remote.checksum",
        "torchstore.io.tfrecord": "torchstore.io.records.tfrecord",
        "torchstore.io.parquet": "torchstore.io.records.parquet",
    }
)

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
    "WindowSampler",
    "WindowStorage",
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
