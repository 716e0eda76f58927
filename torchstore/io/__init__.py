"""Transport: bytes on disk and on the wire, grouped by medium. No RL words here.

One package a medium, each saying in its docstring what it holds and what it must not know:

- :mod:`torchstore.io.hdf5`: the HDF5 file, its checksummed datasets and its writer lock;
- :mod:`torchstore.io.frames`: camera frames: codecs, video containers, encoder threads;
- :mod:`torchstore.io.remote`: remote bytes: HTTP, the Hub, folder URLs, transfers;
- :mod:`torchstore.io.records`: record formats: TFRecord and Parquet.

The modules at this level are what every medium and every integration uses: safe relative
paths (:mod:`.paths`), the rule for output paths (:mod:`.destination`), what a dataset
folder that is not a store holds, by its marker files (:mod:`.dataset_folders`), durable
renames (:mod:`.durable`), environment switches (:mod:`.flags`), the folder caches live
under (:mod:`.cache_root`), the terminal (:mod:`.console`) and progress bars
(:mod:`.progress`). A medium imports these and its own
modules, never another medium's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.hdf5.checksummed import ChecksummedDataset
    from torchstore.io.hdf5.files import (
        create_atomically,
        open_for_append,
        open_for_read,
    )

_EXPORTS = {
    "ChecksummedDataset": "torchstore.io.hdf5.checksummed",
    "create_atomically": "torchstore.io.hdf5.files",
    "open_for_append": "torchstore.io.hdf5.files",
    "open_for_read": "torchstore.io.hdf5.files",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ChecksummedDataset",
    "create_atomically",
    "open_for_append",
    "open_for_read",
]
