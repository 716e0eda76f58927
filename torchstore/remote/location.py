"""Where entries live: a Hub namespace, an HTTP(S) base URL, or a folder (local or fsspec).

=================================  ==============================================
location                           meaning
=================================  ==============================================
``hf://datasets/NAMESPACE``        dataset repos ``NAMESPACE/<name>`` on the Hub
``hf://NAMESPACE``                 the same (datasets are the default)
``hf://models/NAMESPACE``          model repos (policy weights)
``http(s)://host/base``            ``base/index.json`` + ``base/<name>/...``;
                                   push by ``PUT``
``/path``, ``file:///path``        a local folder laid out like the HTTP base
``s3://bucket/base`` (any fsspec)  the same layout through fsspec
=================================  ==============================================

The Hub endpoint is ``HF_ENDPOINT`` (huggingface.co by default). Credentials never go in
a location: ``http://user:pass@host`` is refused (use ``TORCHSTORE_HTTP_TOKEN``, or
``HF_TOKEN`` for the Hub).

Offline mode (``offline=True``, or ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE`` set) forbids
network locations (the Hub, HTTP(S), fsspec remotes such as ``s3://``) for every
operation: pull answers from the cache, and catalog, push, sync and prune refuse with an
:class:`OfflineError` before any request. Local folders, ``file://`` and ``memory://``
are not network and work the same offline.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from torchstore.errors import OfflineError
from torchstore.io.flags import env_flag
from torchstore.io.paths import check_name

__all__ = ["Location", "parse_location", "is_offline", "check_online", "OfflineError"]

_SLUG_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
#: fsspec protocols that never touch the network
_LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})


def is_offline(offline: bool | None = None) -> bool:
    """``offline`` if given, else whether ``HF_HUB_OFFLINE`` or ``TORCHSTORE_OFFLINE`` is set."""
    if offline is not None:
        return bool(offline)
    return env_flag("HF_HUB_OFFLINE") or env_flag("TORCHSTORE_OFFLINE")


def _offline_reason(offline: bool | None) -> str:
    if offline:
        return "offline=True"
    for var in ("TORCHSTORE_OFFLINE", "HF_HUB_OFFLINE"):
        if env_flag(var):
            return f"{var} is set"
    return "offline"


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed location string."""

    raw: str
    scheme: str  # "hub" | "http" | "folder"
    namespace: str | None = None
    repo_type: str = "dataset"

    def __str__(self) -> str:
        return self.raw

    @property
    def is_network(self) -> bool:
        """True for the Hub, HTTP(S) and fsspec remotes; False for local folders (and memory://)."""
        if self.scheme in ("hub", "http"):
            return True
        protocol, sep, _ = self.raw.partition("://")
        return bool(sep) and protocol.lower() not in _LOCAL_PROTOCOLS

    @property
    def slug(self) -> str:
        """A folder name for this location in the cache (readable, and unique by a hash)."""
        digest = hashlib.sha256(self.raw.encode()).hexdigest()[:10]
        readable = _SLUG_CHARS.sub("_", self.raw.split("://", 1)[-1]).strip("._-")[:60]
        return f"{self.scheme}-{readable or 'root'}-{digest}"


def parse_location(location: str | os.PathLike) -> Location:
    """Parse a location string (see the module table)."""
    if isinstance(location, os.PathLike):
        return Location(str(Path(location).absolute()), "folder")
    if not isinstance(location, str) or not location:
        raise ValueError(f"location ({location!r}) must be a non-empty string or path")
    parts = urlsplit(location)
    if parts.scheme == "hf":
        segments = [s for s in (parts.netloc + parts.path).split("/") if s]
        repo_type = "dataset"
        if segments and segments[0] in ("datasets", "models"):
            repo_type = segments.pop(0)[:-1]
        if len(segments) != 1:
            raise ValueError(
                f"Hub location ({location!r}) must be hf://NAMESPACE, hf://datasets/NAMESPACE "
                "or hf://models/NAMESPACE"
            )
        namespace = check_name(segments[0], subject=f"Hub namespace in {location!r}")
        return Location(f"hf://{repo_type}s/{namespace}", "hub", namespace, repo_type)
    if parts.scheme in ("http", "https"):
        if parts.username or parts.password:
            raise ValueError(
                "an HTTP location must not carry credentials (user:password@); "
                "set TORCHSTORE_HTTP_TOKEN instead"
            )
        if not parts.hostname:
            raise ValueError(f"HTTP location ({location!r}) must name a host")
        return Location(location.rstrip("/"), "http")
    if parts.scheme in ("", "file") or len(parts.scheme) == 1:
        path = parts.path if parts.scheme == "file" else location
        return Location(str(Path(path).absolute()), "folder")
    return Location(location.rstrip("/"), "folder")


def check_online(location: Location, doing: str, offline: bool | None = None) -> None:
    """Raise :class:`OfflineError` if offline mode is on and ``location`` needs the network.

    ``doing`` completes the message: ``"listing"``, ``"pushing to"``, ...
    """
    if location.is_network and is_offline(offline):
        raise OfflineError(
            f"offline mode: {doing} {location} needs the network ({_offline_reason(offline)}); "
            "local folders and file:// work offline"
        )
