"""Lightning DataModules over trajectory stores: offline RL and behaviour cloning.

Both make the store resident on the training device once, draw every batch on that
device from a Philox stream (the DDP rank is its sub-stream), hand Lightning a sized
iterable of ``steps_per_epoch`` batches (no ``DataLoader``, no worker processes), and
checkpoint their sampler state so a resumed run draws exactly the batches an
uninterrupted one would have.

Beside them, :mod:`torchstore.lightning.progress`: callbacks copying a run's metrics into a
file and writing its progress as plain lines when stdout is not a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.lightning.base import (
        Output,
        StoreDataModule,
    )
    from torchstore.lightning.demonstration import DemonstrationDataModule
    from torchstore.lightning.normalizer import (
        ColumnStats,
        Normalization,
        Normalizer,
        stats_cache_dir,
        stats_path,
    )
    from torchstore.lightning.offline import (
        TORCHRL_KEYS,
        Layout,
        OfflineDataModule,
        SamplerKind,
    )
    from torchstore.lightning.progress import (
        MetricsRecorder,
        ProgressLines,
        plain_progress_off_a_terminal,
    )

_EXPORTS = {
    "Output": "torchstore.lightning.base",
    "StoreDataModule": "torchstore.lightning.base",
    "DemonstrationDataModule": "torchstore.lightning.demonstration",
    "ColumnStats": "torchstore.lightning.normalizer",
    "Normalization": "torchstore.lightning.normalizer",
    "Normalizer": "torchstore.lightning.normalizer",
    "stats_cache_dir": "torchstore.lightning.normalizer",
    "stats_path": "torchstore.lightning.normalizer",
    "TORCHRL_KEYS": "torchstore.lightning.offline",
    "Layout": "torchstore.lightning.offline",
    "OfflineDataModule": "torchstore.lightning.offline",
    "SamplerKind": "torchstore.lightning.offline",
    "MetricsRecorder": "torchstore.lightning.progress",
    "ProgressLines": "torchstore.lightning.progress",
    "plain_progress_off_a_terminal": "torchstore.lightning.progress",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "OfflineDataModule",
    "DemonstrationDataModule",
    "StoreDataModule",
    "Normalizer",
    "ColumnStats",
    "Normalization",
    "Layout",
    "Output",
    "SamplerKind",
    "TORCHRL_KEYS",
    "stats_cache_dir",
    "stats_path",
    "MetricsRecorder",
    "ProgressLines",
    "plain_progress_off_a_terminal",
]
