"""Remote datasets: pull and push datasets, recordings, asset packs and policy weights.

Locations are Hub namespaces (``hf://datasets/NS``, via huggingface_hub) or any HTTP(S),
folder or fsspec base that serves an ``index.json`` (format in ``torchstore.remote.index``).
Everything pulled is verified against its sha256 before it becomes visible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.errors import (
        CacheNotWritableError,
        DeadlineError,
        DeviceError,
        EntryExistsError,
        EntryKindError,
        IncompleteFileError,
        IndexConflictError,
        NoSuchEntryError,
        NoSuchLocationError,
        OfflineError,
        RemoteChangedError,
        RemoteNotFoundError,
        TransferError,
        UnknownEntryError,
    )
    from torchstore.remote.cache import (
        default_cache_dir,
        pull,
    )
    from torchstore.remote.catalog import (
        RemoteCatalog,
        format_catalog,
    )
    from torchstore.remote.index import (
        EntryKind,
        RemoteEntry,
        RemoteFile,
    )
    from torchstore.remote.recording import (
        SyncResult,
        sync_recording,
    )
    from torchstore.remote.safe_upload import is_safe_to_upload
    from torchstore.remote.upload import (
        prune,
        push,
        write_index,
    )
    from torchstore.remote.weights import check_safetensors, fetch_policy_weights

_EXPORTS = {
    "RemoteNotFoundError": "torchstore.errors",
    "TransferError": "torchstore.errors",
    "NoSuchLocationError": "torchstore.errors",
    "NoSuchEntryError": "torchstore.errors",
    "DeadlineError": "torchstore.errors",
    "RemoteChangedError": "torchstore.errors",
    "IndexConflictError": "torchstore.errors",
    "UnknownEntryError": "torchstore.errors",
    "EntryExistsError": "torchstore.errors",
    "EntryKindError": "torchstore.errors",
    "CacheNotWritableError": "torchstore.errors",
    "OfflineError": "torchstore.errors",
    "prune": "torchstore.remote.upload",
    "DeviceError": "torchstore.errors",
    "check_safetensors": "torchstore.remote.weights",
    "default_cache_dir": "torchstore.remote.cache",
    "pull": "torchstore.remote.cache",
    "RemoteCatalog": "torchstore.remote.catalog",
    "format_catalog": "torchstore.remote.catalog",
    "EntryKind": "torchstore.remote.index",
    "RemoteEntry": "torchstore.remote.index",
    "RemoteFile": "torchstore.remote.index",
    "SyncResult": "torchstore.remote.recording",
    "sync_recording": "torchstore.remote.recording",
    "is_safe_to_upload": "torchstore.remote.safe_upload",
    "IncompleteFileError": "torchstore.errors",
    "push": "torchstore.remote.upload",
    "write_index": "torchstore.remote.upload",
    "fetch_policy_weights": "torchstore.remote.weights",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "RemoteCatalog",
    "RemoteEntry",
    "RemoteFile",
    "EntryKind",
    "pull",
    "push",
    "sync_recording",
    "SyncResult",
    "is_safe_to_upload",
    "fetch_policy_weights",
    "write_index",
    "format_catalog",
    "default_cache_dir",
    "TransferError",
    "RemoteNotFoundError",
    "IncompleteFileError",
    "NoSuchLocationError",
    "NoSuchEntryError",
    "DeadlineError",
    "EntryExistsError",
    "EntryKindError",
    "CacheNotWritableError",
    "OfflineError",
    "prune",
    "DeviceError",
    "check_safetensors",
    "RemoteChangedError",
    "IndexConflictError",
    "UnknownEntryError",
]
