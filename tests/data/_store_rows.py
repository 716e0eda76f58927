"""A map-style dataset over a store, for the spawned ``DataLoader`` worker test (imported there)."""

from __future__ import annotations

import os

from torch.utils.data import Dataset


class StoreRows(Dataset):
    """Row ``i`` of a store as ``{"obs", "action", "pid"}`` (``pid``: the reading process)."""

    def __init__(self, store):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> dict:
        row = self.store[i]
        return {"obs": row["obs"], "action": row["action"], "pid": os.getpid()}
