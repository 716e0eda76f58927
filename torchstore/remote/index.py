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
             "source": "...",                   # optional opaque tag (recording snapshots)
             "at": ".blobs/<64 hex>-<16 hex>"}  # optional (version 2): where the bytes are
          ],
          "history": [                          # optional (version 2): earlier revisions,
            {"revision": "<64 hex>", "size": 9000,          # newest first, each pullable
             "updated": "...", "files": [...]}              # as NAME@REVISION until pruned
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
- A file's bytes are at ``<base>/NAME/<at>`` (``at`` defaults to ``path``). Only an
  entry's first revision puts bytes at their own paths, and only by exclusive create (a
  path another pusher of the same new entry holds goes to a fresh ``.blobs/`` path, so
  racing first pushes never overwrite each other's bytes); once the entry exists, a new
  revision reuses the bytes a listed revision already stores, and uploads any other
  bytes to a storage path never used before, ``.blobs/<sha256>-<16 random hex>`` (older
  writers used ``.blobs/<sha256>``; any ``at`` is read). So no upload ever changes a file
  a listed revision points at, nor writes where a revision ever stored bytes: readers of
  any listed revision never see a half-replaced entry, and a prune (which writes the
  index first, then deletes the paths only its dropped revisions use) never deletes
  bytes a concurrent push uploads, even a push that read the pruned index.
  One storage path holds one content across all revisions of an entry.
- ``history`` lists earlier revisions newest first (``torchstore prune`` drops them); its
  items have no ``name``, ``kind`` or ``history`` of their own.
- Version 1 (no ``at``, no ``history``) is still read; an index is written as version 2
  only when it uses ``at`` (a version-1 reader would fetch the wrong bytes), else as 1.
- JSON nested deeper than Python can parse is refused as malformed, like any other.
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
from torchstore.io.paths import check_name, check_relpath
from torchstore.io.remote.checksum import is_sha1, is_sha256
from torchstore.validation import positive_int

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
    "BLOBS",
]

INDEX_NAME = "index.json"
ENTRY_NAME = "torchstore.json"
INDEX_FORMAT = "torchstore-index"
ENTRY_FORMAT = "torchstore-entry"
INDEX_VERSION = 2
_PLAIN_VERSION = 1  # what an index without "at" is written as (readable by every version)
BLOBS = ".blobs"
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
    at: str | None = None

    def __post_init__(self):
        check_relpath(self.path, subject="file path")
        if self.at is not None:
            check_relpath(self.at, subject=f"file {self.path!r}: storage path")
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
                f"file {self.path!r}: blob sha1 ({self.blob_sha1!r}) must be 40 lowercase hex "
                "characters"
            )
        if self.sha256 is None and self.blob_sha1 is None:
            raise StoreFormatError(
                f"file {self.path!r} has no sha256 (nor git blob sha1) to verify it with"
            )

    @property
    def stored_at(self) -> str:
        """Where the bytes are, relative to the entry's folder."""
        return self.at or self.path

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.source is not None:
            out["source"] = self.source
        if self.at is not None and self.at != self.path:
            out["at"] = self.at
        return out


def entry_revision(files: Iterable[RemoteFile]) -> str:
    """The content revision of a file list (sha256 over the sorted path/size/sha256 lines)."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.size}\0{f.sha256 or f.blob_sha1}\n".encode())
    return h.hexdigest()


def _check_tree(name: str, paths: Iterable[str], what: str) -> None:
    """No path is both a file and the folder of another."""
    paths = set(paths)
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                raise StoreFormatError(
                    f"entry {name!r}: {what} {'/'.join(parts[:i])!r} is both a file and the folder "
                    f"of {p!r}"
                )


def _check_layout(name: str, files: Iterable[RemoteFile]) -> None:
    paths = set()
    for f in files:
        if f.path in paths:
            raise StoreFormatError(f"entry {name!r} lists file {f.path!r} twice")
        paths.add(f.path)
    _check_tree(name, paths, "path")


def _check_storage(name: str, revisions: Iterable[tuple[RemoteFile, ...]]) -> None:
    """One storage path holds one content across every listed revision."""
    held: dict[str, str | None] = {}
    for files in revisions:
        for f in files:
            digest = f.sha256 or f.blob_sha1
            if held.setdefault(f.stored_at, digest) != digest:
                raise StoreFormatError(
                    f"entry {name!r}: storage path {f.stored_at!r} is listed with two different "
                    "contents"
                )
    _check_tree(name, held, "storage path")


@dataclass(frozen=True, slots=True)
class RemoteEntry:
    """A named dataset, recording, asset pack or policy at a location."""

    name: str
    kind: str
    files: tuple[RemoteFile, ...]
    revision: str = ""
    updated: str | None = field(default=None, compare=False)
    commit: str | None = field(default=None, compare=False)
    history: tuple[RemoteEntry, ...] = field(default=(), compare=False)

    def __post_init__(self):
        check_name(self.name, subject="entry name")
        if self.kind not in {k.value for k in EntryKind}:
            raise StoreFormatError(
                f"entry {self.name!r}: kind ({self.kind!r}) must be one of "
                f"{[k.value for k in EntryKind]}"
            )
        files = tuple(sorted(self.files, key=lambda f: f.path))
        object.__setattr__(self, "files", files)
        _check_layout(self.name, files)
        if not self.revision:
            object.__setattr__(self, "revision", entry_revision(files))
        if self.history:
            seen = {self.revision}
            for old in self.history:
                if old.revision in seen:
                    raise StoreFormatError(
                        f"entry {self.name!r} lists revision {old.revision[:12]} twice"
                    )
                seen.add(old.revision)
            _check_storage(self.name, [e.files for e in self.revisions])

    @property
    def revisions(self) -> tuple[RemoteEntry, ...]:
        """This revision, then the earlier ones still listed (newest first)."""
        return (self, *self.history)

    def at_revision(self, revision: str) -> RemoteEntry | None:
        """The listed revision ``revision`` names (its full id or a prefix of >= 7 characters)."""
        if len(revision) < 7:
            return None
        hits = [e for e in self.revisions if e.revision.startswith(revision)]
        return hits[0] if len(hits) == 1 else None

    def without_history(self) -> RemoteEntry:
        return RemoteEntry(
            self.name, self.kind, self.files, self.revision, self.updated, self.commit
        )

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
        out = {
            "name": self.name,
            "kind": self.kind,
            **self._revision_dict(),
        }
        if self.history:
            out["history"] = [old._revision_dict() for old in self.history]
        return out

    def _revision_dict(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "size": self.size,
            "updated": self.updated or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "files": [f.to_dict() for f in self.files],
        }

    @property
    def uses_storage_paths(self) -> bool:
        """True if a file of any listed revision is stored somewhere other than its path."""
        return any(f.stored_at != f.path for e in self.revisions for f in e.files)


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
    at = raw.get("at")
    if at is not None:
        check_relpath(at, subject=f"{where} storage path")
    return RemoteFile(raw["path"], raw["size"], raw["sha256"], source=source, at=at)


def _revision_from(raw: Any, name: str, kind: Any, where: str) -> RemoteEntry:
    if not isinstance(raw, Mapping):
        raise StoreFormatError(f"{where} must be an object, got {type(raw).__name__}")
    raw_files = raw.get("files")
    if not isinstance(raw_files, list):
        raise StoreFormatError(f"{where}: files must be a list")
    files = tuple(_file_from(f, f"{where} file {i}") for i, f in enumerate(raw_files))
    updated = raw.get("updated")
    entry = RemoteEntry(name, kind, files, updated=updated if isinstance(updated, str) else None)
    if raw.get("revision") not in (None, entry.revision):
        raise StoreFormatError(
            f"{where}: revision {raw['revision']!r} does not match its file list ({entry.revision})"
        )
    if raw.get("size") not in (None, entry.size):
        raise StoreFormatError(
            f"{where}: size {raw['size']!r} is not the sum of its file sizes ({entry.size})"
        )
    return entry


def _entry_from(raw: Any, where: str) -> RemoteEntry:
    if not isinstance(raw, Mapping):
        raise StoreFormatError(f"{where} must be an object, got {type(raw).__name__}")
    name = raw.get("name")
    check_name(name, subject=f"{where} name")
    where = f"{where} ({name!r})"
    kind = raw.get("kind", "dataset")
    latest = _revision_from(raw, name, kind, where)
    raw_history = raw.get("history", [])
    if not isinstance(raw_history, list):
        raise StoreFormatError(f"{where}: history must be a list")
    history = tuple(
        _revision_from(old, name, kind, f"{where} history {i}") for i, old in enumerate(raw_history)
    )
    if not history:
        return latest
    return RemoteEntry(name, kind, latest.files, updated=latest.updated, history=history)


def _load(data: bytes | str, source: str, fmt: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreFormatError(f"{source} is not valid JSON ({exc})") from exc
    except RecursionError:
        raise StoreFormatError(f"{source} is nested too deeply to be an index") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise StoreFormatError(f"{source} must have format {fmt!r}, got {got!r}")
    version = doc.get("version")
    version = positive_int(f"{source}: version", version, error=StoreFormatError)
    if version > INDEX_VERSION:
        raise StoreFormatError(
            f"{source} has version {version}; this torchstore reads up to {INDEX_VERSION}: upgrade "
            "torchstore"
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
    entries = sorted(entries, key=lambda e: e.name)
    doc = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION if any(e.uses_storage_paths for e in entries) else _PLAIN_VERSION,
        "entries": [e.to_dict() for e in entries],
    }
    return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()


def parse_entry(data: bytes | str, *, source: str = ENTRY_NAME) -> RemoteEntry:
    """Check a Hub repo's ``torchstore.json``."""
    return _entry_from(_load(data, source, ENTRY_FORMAT), source)


def dump_entry(entry: RemoteEntry) -> bytes:
    """A Hub repo's ``torchstore.json`` (the Hub keeps earlier revisions as commits)."""
    doc = {"format": ENTRY_FORMAT, "version": _PLAIN_VERSION, **entry.without_history().to_dict()}
    return (json.dumps(doc, indent=1) + "\n").encode()
