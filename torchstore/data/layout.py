"""Where things live inside a store file, and how a file's datasets are built and opened.

```
/                     attribute torchstore_manifest (JSON, static schema)
/commit               int64[3]: committed rows, episodes, episode-metadata bytes
/columns/<name>       [rows, *shape] per column ('/' in a name nests groups)
/episodes/index       int64[episodes, 3]: ep_len, ep_offset, meta_end (one table, so a
                      commit appends one row to one dataset)
/episodes/meta        uint8[bytes]: per-episode JSON, concatenated; episode i's JSON ends
                      at meta_end[i]
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
EP_INDEX = "index"
EP_INDEX_FIELDS = ("ep_len", "ep_offset", "meta_end")
EP_META = "meta"
# Episode tables grow by one row a commit and every flush rewrites their last chunk:
# small chunks keep that rewrite cheap.
_EPISODE_TABLES = ((EP_INDEX, np.int64, (3,), 8192), (EP_META, np.uint8, (), 16384))


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
    for name, dtype, shape, chunk_bytes in _EPISODE_TABLES:
        create_checksummed(
            f.require_group(EPISODES), name, np.dtype(dtype), shape, sums.require_group(EPISODES),
            chunk_bytes=chunk_bytes,
        )
    f[EPISODES][EP_INDEX].attrs["fields"] = ",".join(EP_INDEX_FIELDS)


@dataclass
class StoreDatasets:
    """The open datasets of a store file."""

    commit: h5py.Dataset
    columns: dict[str, ChecksummedDataset]
    ep_index: ChecksummedDataset
    ep_meta: ChecksummedDataset

    @classmethod
    def open(cls, f: h5py.File, manifest: Manifest) -> StoreDatasets:
        def table(group: str, name: str, label: str) -> ChecksummedDataset:
            return ChecksummedDataset(f[f"{group}/{name}"], f[f"{CHECKSUMS}/{group}/{name}"], label)

        return cls(
            commit=f[COMMIT],
            columns={
                spec.name: table(COLUMNS, spec.name, f"column '{spec.name}'") for spec in manifest.columns
            },
            ep_index=table(EPISODES, EP_INDEX, "episode index"),
            ep_meta=table(EPISODES, EP_META, "episode metadata"),
        )

    def all(self) -> list[ChecksummedDataset]:
        return [*self.columns.values(), self.ep_index, self.ep_meta]

    def read_commit(self) -> tuple[int, int, int]:
        self.commit.refresh()
        rows, episodes, meta = (int(v) for v in self.commit[...])
        return rows, episodes, meta
