"""The small error hierarchy every torchstore raise comes from.

Each leaf also inherits the builtin a user would already catch, so ``except ValueError``
keeps working around torchstore calls.
"""

from __future__ import annotations

__all__ = [
    "TorchstoreError",
    "ColumnError",
    "StoreFormatError",
    "IntegrityError",
    "UnsafePathError",
    "EmptyStorageError",
    "ReadOnlyStorageError",
    "EpisodeError",
    "LeRobotFormatError",
    "VideoError",
    "StoreLockedError",
    "DestinationError",
    "DestinationExistsError",
    "RowIndexError",
    "StorageFullError",
    "EnvUnavailableError",
    "DatasetFormatError",
    "ResidencyError",
    "UnsupportedError",
    "ArgumentError",
    "ArgumentTypeError",
]


class TorchstoreError(Exception):
    """Base class of every error torchstore raises on purpose."""


class ColumnError(TorchstoreError, ValueError):
    """A column spec, or rows given for columns, break the declared schema."""


class StoreFormatError(TorchstoreError, ValueError):
    """A file is not a torchstore store, or one this version cannot read."""


class IntegrityError(TorchstoreError, ValueError):
    """Committed bytes no longer match their checksum (corruption or truncation)."""


class UnsafePathError(TorchstoreError, ValueError):
    """A path from an untrusted source would land outside its destination folder."""


class EmptyStorageError(TorchstoreError, RuntimeError):
    """Sampling was asked of a storage that holds no sampleable rows."""


class ReadOnlyStorageError(TorchstoreError, RuntimeError):
    """A write was attempted on a read-only view."""


class EpisodeError(TorchstoreError, ValueError):
    """An episode operation that makes no sense (committing no rows, an episode out of range)."""


class LeRobotFormatError(StoreFormatError):
    """A LeRobot dataset on disk breaks its format (info.json, Parquet, episode tables)."""


class VideoError(TorchstoreError, ValueError):
    """A video file cannot be encoded, decoded or appended (truncated, wrong codec, missing frames)."""


class StoreLockedError(TorchstoreError, RuntimeError):
    """Another live process holds the writer lock of a store (one writer per file)."""


class DestinationError(TorchstoreError, ValueError):
    """An output path cannot be written: it is a source, a directory, or not ours to replace."""


class DestinationExistsError(TorchstoreError, FileExistsError):
    """An output path already exists and replacing it was not asked for."""


class RowIndexError(TorchstoreError, IndexError):
    """A row index or row range outside what a store or view holds."""


class StorageFullError(TorchstoreError, OSError):
    """The disk (or a file-size limit) refused a write; committed episodes are intact."""


class EnvUnavailableError(TorchstoreError, RuntimeError):
    """A store's environment cannot be built: no env id recorded, or gymnasium is missing."""


class DatasetFormatError(StoreFormatError):
    """A Minari dataset or a D4RL-style HDF5 file breaks its format (missing keys, wrong shapes)."""


class ResidencyError(TorchstoreError, ValueError):
    """A resident budget is malformed or cannot hold what sampling needs resident."""


class UnsupportedError(TorchstoreError, NotImplementedError):
    """A valid request this version does not support (the message names what to use instead)."""


class ArgumentError(TorchstoreError, ValueError):
    """An argument out of its range: a count below 1, a fraction above 1, a NaN rate."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a float or a bool where an int count belongs)."""
