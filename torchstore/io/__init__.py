"""Transport: HDF5 files, checksummed growable datasets. No RL words here."""

from torchstore.io.checksummed import ChecksummedDataset
from torchstore.io.hdf5 import create_atomically, open_for_append, open_for_read

__all__ = ["ChecksummedDataset", "create_atomically", "open_for_append", "open_for_read"]
