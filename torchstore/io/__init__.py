"""Transport: HDF5 files, checksummed growable datasets. No RL words here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.checksummed import ChecksummedDataset
    from torchstore.io.hdf5 import (
        create_atomically,
        open_for_append,
        open_for_read,
    )

_EXPORTS = {
    "ChecksummedDataset": "torchstore.io.checksummed",
    "create_atomically": "torchstore.io.hdf5",
    "open_for_append": "torchstore.io.hdf5",
    "open_for_read": "torchstore.io.hdf5",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ChecksummedDataset",
    "create_atomically",
    "open_for_append",
    "open_for_read",
]
