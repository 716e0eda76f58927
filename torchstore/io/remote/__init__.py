"""Remote bytes: HTTP(S), the Hugging Face Hub and folder URLs, and what every transfer shares.

:mod:`.transfer` holds the transports' errors, their ``FileClient`` protocol, progress and
secret redaction; :mod:`.http` is resumable HTTP over the standard library; :mod:`.hub` goes
through ``huggingface_hub``; :mod:`.folder` is a local folder or any fsspec URL; and
:mod:`.checksum` checks a fetched file against the SHA-256 or git blob id a remote declares;
:mod:`.ranged` reads a remote object in place by byte range (a seekable file object), through
:mod:`.chunk_cache`, the bounded local cache of the ranges fetched.

It knows URLs, requests, tokens and files in transit; it must not know stores, columns or
datasets' layouts (``torchstore.remote`` builds pull and push on top), nor HDF5 internals,
frames or record formats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.remote.chunk_cache import ChunkCache
    from torchstore.io.remote.folder import folder_client
    from torchstore.io.remote.http import HttpClient, RemoteChangedError
    from torchstore.io.remote.hub import HubClient
    from torchstore.io.remote.ranged import RangedFile, open_url
    from torchstore.io.remote.transfer import FileClient, RemoteNotFoundError, TransferError

_EXPORTS = {
    "FileClient": ".transfer",
    "RemoteNotFoundError": ".transfer",
    "TransferError": ".transfer",
    "HttpClient": ".http",
    "RemoteChangedError": ".http",
    "HubClient": ".hub",
    "folder_client": ".folder",
    "RangedFile": ".ranged",
    "open_url": ".ranged",
    "ChunkCache": ".chunk_cache",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "FileClient",
    "RemoteNotFoundError",
    "TransferError",
    "HttpClient",
    "RemoteChangedError",
    "HubClient",
    "folder_client",
    "RangedFile",
    "open_url",
    "ChunkCache",
]
