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
    "ParquetFormatError",
    "VideoError",
    "FrameCodecError",
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
    "TransferError",
    "RemoteNotFoundError",
    "NoSuchLocationError",
    "NoSuchEntryError",
    "DeadlineError",
    "RemoteChangedError",
    "IndexConflictError",
    "OfflineError",
    "IncompleteFileError",
    "UnknownEntryError",
    "EntryExistsError",
    "EntryKindError",
    "DeviceError",
    "CacheNotWritableError",
    "RayUnavailableError",
    "ProjectError",
    "AmbiguousDatasetError",
    "CheckpointNotFoundError",
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


class ParquetFormatError(TorchstoreError, ValueError):
    """A Parquet file is missing, not Parquet, or has no footer (its writer never finished)."""


class VideoError(TorchstoreError, ValueError):
    """A video cannot be encoded, decoded or appended (truncated, wrong codec, missing frames)."""


class FrameCodecError(VideoError):
    """Camera frames kept as codec packets (video, JPEG, PNG) cannot be encoded or decoded:
    a corrupt or truncated packet, a frame count or size mismatch, an unsupported codec,
    pixel format or setting. ``frame`` is the index of the frame named in the message
    (None when no one frame is at fault); the caller adds the column and episode."""

    def __init__(self, message: str, frame: int | None = None) -> None:
        super().__init__(message)
        self.frame = frame

    def __reduce__(self):  # keep ``frame`` across processes (refill workers, DataLoader)
        return (type(self), (str(self), self.frame))


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


class TransferError(TorchstoreError, OSError):
    """Moving bytes to or from a remote failed (network, timeout, HTTP status, offline mode)."""


class RemoteNotFoundError(TransferError, FileNotFoundError):
    """The remote has no such file, entry or revision."""


class NoSuchLocationError(RemoteNotFoundError):
    """A location that does not exist (a mistyped folder or URL): nothing was published there."""


class NoSuchEntryError(RemoteNotFoundError, KeyError):
    """A location has no entry (or revision) of that name; also a ``KeyError``, as a mapping's."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return OSError.__str__(self)


class DeadlineError(TransferError, TimeoutError):
    """A transfer ran past its overall deadline; what it fetched is kept for a resume."""


class RemoteChangedError(TransferError):
    """A conditional write found the remote changed since it was read (HTTP 412)."""


class IndexConflictError(RemoteChangedError):
    """Other writers kept changing a location's index while a push or prune tried to write it."""


class OfflineError(TransferError):
    """Offline mode is on and an operation needed a network location."""


class IncompleteFileError(TorchstoreError, ValueError):
    """A file that is meant to be uploaded is not complete (or not a regular file)."""


class UnknownEntryError(TorchstoreError, ValueError):
    """``write_index`` was told the kind of a folder that is not an entry there."""


class EntryExistsError(TorchstoreError, FileExistsError):
    """A push would replace an existing entry's different content without ``replace=True``."""


class EntryKindError(TorchstoreError, ValueError):
    """A push or sync would change an existing entry's kind (a dataset into a recording...)."""


class DeviceError(TorchstoreError, RuntimeError):
    """The device asked for cannot be used here (no CUDA in this torch build, no GPU, ...)."""


class CacheNotWritableError(TorchstoreError, PermissionError):
    """The cache folder cannot be written (read-only, or no permission)."""


class RayUnavailableError(TorchstoreError, ImportError):
    """Ray is not installed (it comes with the optional extra ``ray``:
    ``pip install -e ".[ray]"`` in a checkout)."""


class ProjectError(TorchstoreError, ValueError):
    """A project folder or bundle breaks a rule (see :mod:`torchstore.project.bundle`)."""


class AmbiguousDatasetError(TorchstoreError, ValueError):
    """An entry holds several stores and ``file=`` did not say which one to open."""


class CheckpointNotFoundError(TorchstoreError, FileNotFoundError):
    """No replay buffer checkpoint at a folder, nor a complete one a killed dump left beside it."""
