"""The ``index.json`` format: what an HTTP/folder/fsspec location holds, file by file.

A location is a base URL (or folder). It holds one ``index.json`` and one folder per
entry; the files of entry ``NAME`` live at ``<base>/NAME/<path>``::

    {
      "format": "torchstore-index",
      "version": 1,
      "entries": [
        {
          "name": "pusht-demo",                 # [A-Za-z0-9][A-Za-z0-9._-]{0,127}
          "kind": "dataset",                    # dataset | recording | assets | policy
          "revision": "<64 hex>",               # sha256 of the file list (see below)
          "size": 10262,                        # sum of the file sizes
          "updated": "2026-01-02T03:04:05Z",    # optional, informative
          "files": [
            {"path": "meta/info.json", "size": 12, "sha256": "<64 hex>"},
            {"path": "data/chunk-000/file-000.parquet", "size": 10250, "sha256": "<64 hex>",
             "source": "..."}                   # optional opaque tag (recording snapshots)
          ]
        }
      ]
    }

Rules (everything from a remote is untrusted and checked before use):

- ``path`` is relative POSIX: no leading ``/``, no ``..``, ``.`` or empty segments, no
  backslash or control character; no path may be both a file and a folder of another.
- ``size`` is an int >= 0; ``sha256`` is 64 lowercase hex of the file's bytes.
- ``revision`` is the sha256 of the lines ``"<path>\\0<size>\\0<sha256>\\n"`` over the files
  sorted by path; ``revision`` and ``size`` may be omitted (then computed) but when present
  must match.
- Unknown keys are ignored; a higher ``version`` is refused (upgrade torchstore).

On the Hub the same entry object (plus ``"format": "torchstore-entry"``) is stored in the
repo as ``torchstore.json``, committed in the same commit as the files it lists.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from torchstore.errors import StoreFormatError
from torchstore.io.checksum import is_sha1, is_sha256
from torchstore.io.paths import check_name, check_relpath

__all__ = [
    "EntryKind",
    "RemoteFile",
    "RemoteEntry",
    "INDEX_NAME",
    "ENTRY_NAME",
    "INDEX_FORMAT",
    "INDEX_VERSION",
    "MAX_INDEX_BYTES",
    "parse_index",
    "dump_index",
    "parse_entry",
    "dump_entry",
    "entry_revision",
]

INDEX_NAME = "index.json"
ENTRY_NAME = "torchstore.json"
INDEX_FORMAT = "torchstore-index"
ENTRY_FORMAT = "torchstore-entry"
INDEX_VERSION = 1
MAX_INDEX_BYTES = 64 << 20
_MAX_FILE_BYTES = 1 << 50


class EntryKind(StrEnum):
    """What an entry holds."""

    DATASET = "dataset"
    RECORDING = "recording"
    ASSETS = "assets"
    POLICY = "policy"


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One file of an entry: where it goes, how big it is, and how to verify it.

    ``sha256`` is always set for index locations; Hub files pushed by other tools may have
    only ``blob_sha1`` (their git blob id), which is then what a pull verifies.
    """

    path: str
    size: int
    sha256: str | None
    blob_sha1: str | None = None
    source: str | None = None

    def __post_init__(self):
        check_relpath(self.path, subject="file path")
        if (
            isinstance(self.size, bool)
            or not isinstance(self.size, int)
            or not 0 <= self.size <= _MAX_FILE_BYTES
        ):
            raise StoreFormatError(
                f"file {self.path!r}: size ({self.size!r}) must be an int in [0, 2**50]"
            )
        if self.sha256 is not None and not is_sha256(self.sha256):
            raise StoreFormatError(
                f"file {self.path!r}: sha256 ({self.sha256!r}) must be 64 lowercase hex characters"
            )
        if self.blob_sha1 is not None and not is_sha1(self.blob_sha1):
            raise StoreFormatError(
                f"file {self.path!r}: blob sha1 ({self.blob_sha1!r}) must be 40 lowercase hex characters"
            )
        if self.sha256 is None and self.blob_sha1 is None:
            raise StoreFormatError(
                f"file {self.path!r} has no sha256 (nor git blob sha1) to verify it with"
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.source is not None:
            out["source"] = self.source
        return out


def entry_revision(files: Iterable[RemoteFile]) -> str:
    """The content revision of a file list (sha256 over the sorted path/size/sha256 lines)."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.size}\0{f.sha256 or f.blob_sha1}\n".encode())
    return h.hexdigest()


def _check_layout(name: str, files: Iterable[RemoteFile]) -> None:
    paths = set()
    for f in files:
        if f.path in paths:
            raise StoreFormatError(f"entry {name!r} lists file {f.path!r} twice")
        paths.add(f.path)
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                raise StoreFormatError(
                    f"entry {name!r}: {'/'.join(parts[:i])!r} is both a file and the folder of {p!r}"
                )


@dataclass(frozen=True, slots=True)
class RemoteEntry:
    """A named dataset, recording, asset pack or policy at a location."""

    name: str
    kind: str
    files: tuple[RemoteFile, ...]
    revision: str = ""
    updated: str | None = field(default=None, compare=False)
    commit: str | None = field(default=None, compare=False)

    def __post_init__(self):
        check_name(self.name, subject="entry name")
        if self.kind not in {k.value for k in EntryKind}:
            raise StoreFormatError(
                f"entry {self.name!r}: kind ({self.kind!r}) must be one of {[k.value for k in EntryKind]}"
            )
        files = tuple(sorted(self.files, key=lambda f: f.path))
        object.__setattr__(self, "files", files)
        _check_layout(self.name, files)
        if not self.revision:
            object.__setattr__(self, "revision", entry_revision(files))

    @property
    def size(self) -> int:
        """Total bytes of the entry's files."""
        return sum(f.size for f in self.files)

    def file(self, path: str) -> RemoteFile | None:
        for f in self.files:
            if f.path == path:
                return f
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "revision": self.revision,
            "size": self.size,
            "updated": self.updated or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "files": [f.to_dict() for f in self.files],
        }


def _file_from(raw: Any, where: str) -> RemoteFile:
    if not isinstance(raw, Mapping):
        raise StoreFormatError(f"{where} must be an object, got {type(raw).__name__}")
    missing = [k for k in ("path", "size", "sha256") if k not in raw]
    if missing:
        raise StoreFormatError(f"{where} lacks {missing}")
    source = raw.get("source")
    if source is not None and not isinstance(source, str):
        raise StoreFormatError(f"{where}: source must be a string")
    check_relpath(raw["path"], subject=f"{where} path")
    return RemoteFile(raw["path"], raw["size"], raw["sha256"], source=source)


def _entry_from(raw: Any, where: str) -> RemoteEntry:
    if not isinstance(raw, Mapping):
        raise StoreFormatError(f"{where} must be an object, got {type(raw).__name__}")
    name = raw.get("name")
    check_name(name, subject=f"{where} name")
    where = f"{where} ({name!r})"
    raw_files = raw.get("files")
    if not isinstance(raw_files, list):
        raise StoreFormatError(f"{where}: files must be a list")
    files = tuple(_file_from(f, f"{where} file {i}") for i, f in enumerate(raw_files))
    entry = RemoteEntry(name, raw.get("kind", "dataset"), files, updated=raw.get("updated"))
    if raw.get("revision") not in (None, entry.revision):
        raise StoreFormatError(
            f"{where}: revision {raw['revision']!r} does not match its file list ({entry.revision})"
        )
    if raw.get("size") not in (None, entry.size):
        raise StoreFormatError(
            f"{where}: size {raw['size']!r} is not the sum of its file sizes ({entry.size})"
        )
    return entry


def _load(data: bytes | str, source: str, fmt: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreFormatError(f"{source} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise StoreFormatError(f"{source} must have format {fmt!r}, got {got!r}")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreFormatError(f"{source}: version ({version!r}) must be a positive int")
    if version > INDEX_VERSION:
        raise StoreFormatError(
            f"{source} has version {version}; this torchstore reads up to {INDEX_VERSION}: upgrade torchstore"
        )
    return doc


def parse_index(data: bytes | str, *, source: str = INDEX_NAME) -> dict[str, RemoteEntry]:
    """Check an ``index.json`` and return its entries by name."""
    doc = _load(data, source, INDEX_FORMAT)
    raw_entries = doc.get("entries")
    if not isinstance(raw_entries, list):
        raise StoreFormatError(f"{source}: entries must be a list")
    entries: dict[str, RemoteEntry] = {}
    for i, raw in enumerate(raw_entries):
        entry = _entry_from(raw, f"{source} entry {i}")
        if entry.name in entries:
            raise StoreFormatError(f"{source} lists entry {entry.name!r} twice")
        entries[entry.name] = entry
    return entries


def dump_index(entries: Iterable[RemoteEntry]) -> bytes:
    """Serialise entries (sorted by name) as ``index.json`` bytes."""
    doc = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "entries": [e.to_dict() for e in sorted(entries, key=lambda e: e.name)],
    }
    return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()


def parse_entry(data: bytes | str, *, source: str = ENTRY_NAME) -> RemoteEntry:
    """Check a Hub repo's ``torchstore.json``."""
    return _entry_from(_load(data, source, ENTRY_FORMAT), source)


def dump_entry(entry: RemoteEntry) -> bytes:
    doc = {"format": ENTRY_FORMAT, "version": INDEX_VERSION, **entry.to_dict()}
    return (json.dumps(doc, indent=1) + "\n").encode()
