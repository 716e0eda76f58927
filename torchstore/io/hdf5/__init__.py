"""The HDF5 file: atomic creation, SWMR opens, recovery, checksummed datasets and the writer lock.

What a store file is made of at the byte level: :mod:`.files` opens, creates and recovers
HDF5 files (h5py); :mod:`.checksummed` keeps growable datasets with an xxh3 hash per block of
rows and checks them on read (:mod:`.xxh3_rows` is the compiled hash); :mod:`.writer_lock` is
the OS lock that keeps one writer per file; :mod:`.reproducible` makes byte-identical files.

It knows files, datasets, rows of bytes and hashes; it must not know columns, episodes or
manifests' meaning (that is ``torchstore.data``), nor frames, HTTP or record formats (the
other media beside it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.hdf5.checksummed import ChecksummedDataset
    from torchstore.io.hdf5.files import (
        MANIFEST_ATTR,
        abandon,
        create_atomically,
        create_for_append,
        fsync_file,
        open_for_append,
        open_for_read,
        require_hdf5,
    )
    from torchstore.io.hdf5.writer_lock import WriterLock

_EXPORTS = {
    "MANIFEST_ATTR": ".files",
    "abandon": ".files",
    "create_atomically": ".files",
    "create_for_append": ".files",
    "fsync_file": ".files",
    "open_for_append": ".files",
    "open_for_read": ".files",
    "require_hdf5": ".files",
    "ChecksummedDataset": ".checksummed",
    "WriterLock": ".writer_lock",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "MANIFEST_ATTR",
    "abandon",
    "create_atomically",
    "create_for_append",
    "fsync_file",
    "open_for_append",
    "open_for_read",
    "require_hdf5",
    "ChecksummedDataset",
    "WriterLock",
]
