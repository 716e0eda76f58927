"""Lightning DataModules over trajectory stores: offline RL and behaviour cloning.

Both make the store resident on the training device once, draw every batch on that
device from a Philox stream (the DDP rank is its sub-stream), hand Lightning a sized
iterable of ``steps_per_epoch`` batches (no ``DataLoader``, no worker processes), and
checkpoint their sampler state so a resumed run draws exactly the batches an
uninterrupted one would have.
"""

from torchstore.lightning.base import Output, StoreDataModule
from torchstore.lightning.demonstration import DemonstrationDataModule
from torchstore.lightning.normalizer import ColumnStats, Normalization, Normalizer, stats_path
from torchstore.lightning.offline import TORCHRL_KEYS, Layout, OfflineDataModule, SamplerKind

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
    "stats_path",
]
