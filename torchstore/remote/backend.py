"""Two ways a location holds entries: an ``index.json`` (HTTP/folder/fsspec) or Hub repos.

Both answer the same questions (which entries, which files, fetch one file, publish an
entry); ``pull``, ``push``, ``sync_recording`` and ``RemoteCatalog`` are written once
against this interface.

Publishing keeps readers safe:

- index locations upload every new file first and write ``index.json`` last (a
  conditional write: ``If-Match`` on the ETag read, retried on a conflict), so the index
  never lists a file that is not there yet;
- the Hub gets one commit holding the files and the repo's ``torchstore.json``, which is
  atomic by construction.
"""

from __future__ import annotations

import abc
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from torchstore.errors import StoreFormatError
from torchstore.io.folder import folder_client
from torchstore.io.http import HttpClient, RemoteChangedError
from torchstore.io.hub import HubClient
from torchstore.io.paths import make_dirs_inside
from torchstore.io.transfer import FileClient, Progress, RemoteNotFoundError, TransferError
from torchstore.remote.index import (
    ENTRY_NAME,
    INDEX_NAME,
    MAX_INDEX_BYTES,
    RemoteEntry,
    RemoteFile,
    dump_entry,
    dump_index,
    parse_entry,
    parse_index,
)
from torchstore.remote.location import Location

__all__ = ["Backend", "IndexBackend", "HubBackend", "open_backend", "Published"]

log = logging.getLogger(__name__)
_INDEX_WRITE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish did: the entry now visible, and the paths whose bytes were sent."""

    entry: RemoteEntry
    uploaded: tuple[str, ...]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _changed(
    local: Sequence[tuple[RemoteFile, Path]], current: RemoteEntry | None
) -> list[tuple[RemoteFile, Path]]:
    """The local files the remote does not already hold byte for byte."""
    out = []
    for f, path in local:
        have = current.file(f.path) if current is not None else None
        if have is None or have.size != f.size or have.sha256 != f.sha256:
            out.append((f, path))
    return out


def _merged(
    name: str,
    kind: str,
    local: Sequence[tuple[RemoteFile, Path]],
    current: RemoteEntry | None,
    replace: bool,
) -> RemoteEntry:
    files = {f.path: f for f, _ in local}
    if not replace and current is not None:
        files = {**{f.path: f for f in current.files}, **files}
    return RemoteEntry(name, kind, tuple(files.values()), updated=_now())


class Backend(abc.ABC):
    """The interface (see the module docstring)."""

    location: Location

    @abc.abstractmethod
    def entries(self) -> dict[str, RemoteEntry]:
        """Implemented by each backend."""

    @abc.abstractmethod
    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        """Implemented by each backend."""

    def find(self, name: str) -> RemoteEntry | None:
        """The entry, or ``None`` if the location does not have it."""
        try:
            return self.entry(name)
        except RemoteNotFoundError:
            return None

    @abc.abstractmethod
    def fetch(
        self,
        entry: RemoteEntry,
        file: RemoteFile,
        staging: Path,
        *,
        progress: Progress | None = None,
    ) -> Path:
        """Implemented by each backend."""

    @abc.abstractmethod
    def publish(
        self,
        name: str,
        kind: str,
        local: Sequence[tuple[RemoteFile, Path]],
        *,
        replace: bool,
        progress: Progress | None = None,
    ) -> Published:
        """Implemented by each backend."""


class IndexBackend(Backend):
    """Entries listed in ``<base>/index.json``; files at ``<base>/<name>/<path>``."""

    def __init__(self, location: Location, client: FileClient):
        self.location = location
        self.client = client

    def __repr__(self) -> str:
        return f"IndexBackend({self.location.raw!r})"

    def _read_index(self) -> tuple[dict[str, RemoteEntry], str | None, bool]:
        got = self.client.read_bytes(INDEX_NAME, limit=MAX_INDEX_BYTES)
        if got is None:
            return {}, None, False
        data, etag = got
        return parse_index(data, source=f"{self.location}/{INDEX_NAME}"), etag, True

    def entries(self) -> dict[str, RemoteEntry]:
        return self._read_index()[0]

    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        entries = self.entries()
        if name not in entries:
            raise RemoteNotFoundError(
                f"{self.location} has no entry {name!r}; it has {sorted(entries)}"
            )
        entry = entries[name]
        if revision is not None and (len(revision) < 7 or not entry.revision.startswith(revision)):
            raise RemoteNotFoundError(
                f"{self.location} has revision {entry.revision[:12]} of {name!r}, not {revision!r}; "
                "an index location serves only the latest revision of an entry"
            )
        return entry

    def fetch(
        self,
        entry: RemoteEntry,
        file: RemoteFile,
        staging: Path,
        *,
        progress: Progress | None = None,
    ) -> Path:
        partial = staging / (file.sha256 or file.blob_sha1 or "")
        self.client.download(
            f"{entry.name}/{file.path}", partial, size=file.size, progress=progress
        )
        return partial

    def publish(
        self,
        name: str,
        kind: str,
        local: Sequence[tuple[RemoteFile, Path]],
        *,
        replace: bool,
        progress: Progress | None = None,
    ) -> Published:
        entries, _, _ = self._read_index()
        todo = _changed(local, entries.get(name))
        for f, path in todo:
            log.info("uploading %s/%s (%d bytes)", name, f.path, f.size)
            self.client.upload(path, f"{name}/{f.path}", progress=progress)
        for _attempt in range(_INDEX_WRITE_ATTEMPTS):
            entries, etag, exists = self._read_index()  # re-read: another pusher may have written
            entry = _merged(name, kind, local, entries.get(name), replace)
            entries[name] = entry
            try:
                self.client.write_bytes(
                    INDEX_NAME, dump_index(entries.values()), if_match=etag, if_absent=not exists
                )
            except RemoteChangedError:
                log.info(
                    "%s/%s changed while publishing %r; merging again",
                    self.location,
                    INDEX_NAME,
                    name,
                )
                continue
            return Published(entry, tuple(f.path for f, _ in todo))
        raise TransferError(
            f"{self.location}/{INDEX_NAME} kept changing; gave up after {_INDEX_WRITE_ATTEMPTS} attempts"
        )


class HubBackend(Backend):
    """Entries are repos ``NAMESPACE/<name>``.

    A repo torchstore pushed holds a ``torchstore.json`` listing its files with their
    sha256; that list is the entry (other files, such as ``.gitattributes``, are not part
    of it). Any other repo's entry is its whole file tree.
    """

    def __init__(self, location: Location, client: HubClient):
        self.location = location
        self.client = client

    def __repr__(self) -> str:
        return f"HubBackend({self.location.raw!r}, endpoint={self.client.endpoint!r})"

    def entries(self) -> dict[str, RemoteEntry]:
        return {name: self.entry(name) for name in self.client.list_repos()}

    def _read_manifest(self, name: str, commit: str) -> RemoteEntry:
        with tempfile.TemporaryDirectory(prefix="torchstore-hub-") as tmp:
            path = self.client.download(name, ENTRY_NAME, commit, Path(tmp))
            if path.stat().st_size > MAX_INDEX_BYTES:
                raise TransferError(
                    f"{ENTRY_NAME} of {self.client.repo_id(name)!r} is larger than {MAX_INDEX_BYTES} bytes"
                )
            return parse_entry(
                path.read_bytes(), source=f"{ENTRY_NAME} of {self.client.repo_id(name)!r}"
            )

    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        commit = self.client.resolve(name, revision)
        listed = {f.path: f for f in self.client.list_files(name, commit)}
        default_kind = "dataset" if self.client.repo_type == "dataset" else "policy"
        kind, files = default_kind, {}
        if ENTRY_NAME in listed:
            manifest = self._read_manifest(name, commit)
            kind = manifest.kind
            for f in manifest.files:
                hub = listed.get(f.path)
                if hub is None:
                    raise StoreFormatError(
                        f"{ENTRY_NAME} of {self.client.repo_id(name)!r} lists {f.path!r}, which the repo lacks"
                    )
                if hub.size != f.size:
                    raise StoreFormatError(
                        f"{ENTRY_NAME} of {self.client.repo_id(name)!r} says {f.path!r} has {f.size} bytes, the repo {hub.size}"
                    )
                files[f.path] = RemoteFile(f.path, f.size, f.sha256, hub.blob_sha1, f.source)
        else:  # a repo torchstore did not push: every file, verified by LFS sha256 or git blob id
            for path, hub in listed.items():
                files[path] = RemoteFile(
                    path, hub.size, hub.lfs_sha256, None if hub.lfs_sha256 else hub.blob_sha1
                )
        return RemoteEntry(name, kind, tuple(files.values()), commit=commit)

    def fetch(
        self,
        entry: RemoteEntry,
        file: RemoteFile,
        staging: Path,
        *,
        progress: Progress | None = None,
    ) -> Path:
        hub_staging = make_dirs_inside(staging, "hub")
        return self.client.download(
            entry.name, file.path, entry.commit or "main", hub_staging, progress=progress
        )

    def publish(
        self,
        name: str,
        kind: str,
        local: Sequence[tuple[RemoteFile, Path]],
        *,
        replace: bool,
        progress: Progress | None = None,
    ) -> Published:
        try:
            current = self.entry(name)
        except RemoteNotFoundError:
            current = None
        todo = _changed(local, current)
        entry = _merged(name, kind, local, current, replace)
        deletes = []
        if replace and current is not None:
            deletes = [f.path for f in current.files if entry.file(f.path) is None]
        if (
            not todo
            and not deletes
            and current is not None
            and current.kind == kind
            and current.revision == entry.revision
        ):
            return Published(current, ())
        adds: dict[str, Path | bytes] = {f.path: path for f, path in todo}
        adds[ENTRY_NAME] = dump_entry(entry)
        commit = self.client.commit(
            name, adds, deletes, message=f"torchstore: {kind} {name} ({len(todo)} files)"
        )
        if progress is not None:
            progress(sum(f.size for f, _ in todo))
        return Published(
            RemoteEntry(entry.name, entry.kind, entry.files, entry.revision, entry.updated, commit),
            tuple(f.path for f, _ in todo),
        )


def open_backend(location: Location, *, timeout: float = 30.0, retries: int = 5) -> Backend:
    """The backend for a parsed location."""
    if location.scheme == "hub":
        return HubBackend(
            location, HubClient(location.namespace or "", repo_type=location.repo_type)
        )
    if location.scheme == "http":
        return IndexBackend(location, HttpClient(location.raw, timeout=timeout, retries=retries))
    return IndexBackend(location, folder_client(location.raw))
