"""Where things live inside a store file, and how a file's datasets are built and opened.

```
/                     attribute torchstore_manifest (JSON, static schema)
/commit               int64[3]: committed rows, episodes, episode-metadata bytes
/columns/<name>       [rows, *shape] per column ('/' in a name nests groups)
/episodes/ep_len      int64[episodes]
/episodes/ep_offset   int64[episodes]
/episodes/meta        uint8[bytes]: per-episode JSON, concatenated
/episodes/meta_end    int64[episodes]: end of each episode's JSON in meta
/checksums/...        the per-block hash table of every dataset above
```
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

from torchstore.data.columns import numpy_dtype
from torchstore.data.manifest import Manifest
from torchstore.io.checksummed import ChecksummedDataset, create_checksummed

__all__ = ["MANIFEST_ATTR", "COMMIT", "build_store_file", "StoreDatasets"]

MANIFEST_ATTR = "torchstore_manifest"
COMMIT = "commit"
COLUMNS = "columns"
EPISODES = "episodes"
CHECKSUMS = "checksums"
EP_LEN = "ep_len"
EP_OFFSET = "ep_offset"
EP_META = "meta"
EP_META_END = "meta_end"
_EPISODE_TABLES = ((EP_LEN, np.int64), (EP_OFFSET, np.int64), (EP_META_END, np.int64), (EP_META, np.uint8))


def build_store_file(f: h5py.File, manifest: Manifest) -> None:
    """Create every dataset and attribute of an empty store (SWMR allows no new objects later)."""
    f.attrs[MANIFEST_ATTR] = manifest.to_json()
    f.create_dataset(COMMIT, data=np.zeros(3, dtype=np.int64))
    sums = f.create_group(CHECKSUMS)
    for spec in manifest.columns:
        create_checksummed(
            f.require_group(COLUMNS), spec.name, numpy_dtype(spec.storage_dtype), spec.shape,
            sums.require_group(COLUMNS),
        )
    for name, dtype in _EPISODE_TABLES:
        create_checksummed(f.require_group(EPISODES), name, np.dtype(dtype), (), sums.require_group(EPISODES))


@dataclass
class StoreDatasets:
    """The open datasets of a store file."""

    commit: h5py.Dataset
    columns: dict[str, ChecksummedDataset]
    ep_len: ChecksummedDataset
    ep_offset: ChecksummedDataset
    ep_meta: ChecksummedDataset
    ep_meta_end: ChecksummedDataset

    @classmethod
    def open(cls, f: h5py.File, manifest: Manifest) -> StoreDatasets:
        def table(group: str, name: str, label: str) -> ChecksummedDataset:
            return ChecksummedDataset(f[f"{group}/{name}"], f[f"{CHECKSUMS}/{group}/{name}"], label)

        return cls(
            commit=f[COMMIT],
            columns={
                spec.name: table(COLUMNS, spec.name, f"column '{spec.name}'") for spec in manifest.columns
            },
            ep_len=table(EPISODES, EP_LEN, "episode table 'ep_len'"),
            ep_offset=table(EPISODES, EP_OFFSET, "episode table 'ep_offset'"),
            ep_meta=table(EPISODES, EP_META, "episode metadata"),
            ep_meta_end=table(EPISODES, EP_META_END, "episode table 'meta_end'"),
        )

    def all(self) -> list[ChecksummedDataset]:
        return [*self.columns.values(), self.ep_len, self.ep_offset, self.ep_meta, self.ep_meta_end]

    def episode_tables(self) -> list[ChecksummedDataset]:
        return [self.ep_len, self.ep_offset, self.ep_meta_end]

    def read_commit(self) -> tuple[int, int, int]:
        self.commit.refresh()
        rows, episodes, meta = (int(v) for v in self.commit[...])
        return rows, episodes, meta
