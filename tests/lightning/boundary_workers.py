"""What spawned ``DataLoader`` workers run in the process-boundary tests (imported there)."""

from __future__ import annotations

from torch.utils.data import IterableDataset


class NextBatches(IterableDataset):
    """The next ``n`` training batches of a DataModule, drawn in the process iterating it."""

    def __init__(self, datamodule, n: int):
        self.datamodule, self.n = datamodule, n

    def __iter__(self):
        batches = iter(self.datamodule.train_dataloader())
        for _ in range(self.n):
            yield next(batches)
