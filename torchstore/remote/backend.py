"""Two ways a location holds entries: an ``index.json`` (HTTP/folder/fsspec) or Hub repos.

Both answer the same questions (which entries, which files, fetch one file, publish an
entry); ``pull``, ``push``, ``sync_recording`` and ``RemoteCatalog`` are written once
against this interface.

Publishing keeps readers safe and replaces nothing silently:

- an entry that exists is only changed on purpose: a push of different content needs
  ``replace=True`` (the same content is "up to date" and sends nothing), a sync merges
  only into a recording, and an entry never changes kind;
- index locations upload every new file first and write ``index.json`` last (a
  conditional write: ``If-Match`` on the ETag read, retried on a conflict), so the index
  never lists a file that is not there yet; no upload overwrites bytes a listed revision
  points at (see ``torchstore.remote.index``), and the replaced revision stays listed in
  the entry's ``history`` (pullable as ``NAME@REVISION``) until :meth:`Backend.prune`;
- concurrent pushers: the index write is a compare-and-swap (HTTP ``If-Match`` /
  ``If-None-Match: *``; a local folder compares and replaces under a ``flock``), so of
  two pushers that read the same index one wins and the other re-reads and re-plans: a
  push of other content onto the entry the winner just created is refused
  (:class:`EntryExistsError`), a ``replace`` push lands on top as a newer revision (the
  winner's stays in ``history``), the same content is "up to date". A new entry's files
  go to their own paths by exclusive create only (``If-None-Match: *``, a hard link);
  a path another pusher holds is never replaced, the bytes go to a fresh
  ``.blobs/...`` path instead. Collisions back off with jitter; after
  ``_INDEX_WRITE_ATTEMPTS`` lost races in a row the push raises
  :class:`IndexConflictError` with nothing of it listed;
- the Hub gets one commit holding the files and the repo's ``torchstore.json``, which is
  atomic by construction; the Hub keeps earlier revisions as commits.
"""

from __future__ import annotations

import abc
import logging
import random
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from torchstore.errors import (
    EntryExistsError,
    EntryKindError,
    IndexConflictError,
    StoreFormatError,
    TorchstoreError,
)
from torchstore.io.paths import make_dirs_inside
from torchstore.io.remote.folder import FsspecClient, LocalFolderClient, folder_client
from torchstore.io.remote.http import HttpClient, RemoteChangedError
from torchstore.io.remote.hub import HubClient
from torchstore.io.remote.transfer import (
    FileClient,
    NoSuchEntryError,
    NoSuchLocationError,
    Progress,
    RemoteNotFoundError,
    TransferError,
)
from torchstore.remote.index import (
    BLOBS,
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
from torchstore.remote.location import Location, check_online
from torchstore.validation import positive_int

__all__ = [
    "Backend",
    "IndexBackend",
    "HubBackend",
    "open_backend",
    "Published",
    "Pruned",
    "EntryExistsError",
    "EntryKindError",
]

log = logging.getLogger(__name__)
_INDEX_WRITE_ATTEMPTS = 16  # lost index races in a row before a push or prune gives up
_BACKOFF_S = (0.01, 0.5)  # first and largest wait between them (jittered, doubling)
_KEEP_HINT = " (the latest revision is always kept)"


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish did: the entry now visible, and the paths whose bytes were sent.

    ``up_to_date`` is True when the location already held exactly this content (nothing
    was sent or written).
    """

    entry: RemoteEntry
    uploaded: tuple[str, ...]
    up_to_date: bool = False


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune did: revisions dropped, storage paths deleted, and those left in place."""

    entry: RemoteEntry
    dropped: tuple[str, ...]
    deleted: tuple[str, ...]
    left: tuple[str, ...]


def _backoff(attempt: int) -> None:
    """Wait after a lost index race; random, so the pushers that collided spread out."""
    first, largest = _BACKOFF_S
    time.sleep(random.uniform(0.0, min(largest, first * 2**attempt)))


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


def _short(entry: RemoteEntry) -> str:
    return (entry.commit or entry.revision)[:12]


@dataclass(frozen=True, slots=True)
class _Publish:
    """One :meth:`Backend.publish`: make ``local`` (each file with the path its bytes are
    read from) entry ``name`` of ``kind``."""

    name: str
    kind: str
    local: tuple[tuple[RemoteFile, Path], ...]
    replace: bool
    merge: bool
    progress: Progress | None


def _plan(location: Location, request: _Publish, current: RemoteEntry | None) -> RemoteEntry | None:
    """The entry to publish (its files without storage paths), or None if up to date.

    ``merge`` (sync): the local files are added to the current ones. Otherwise (push) the
    local files are the entry, and different content needs ``replace``.
    """
    name, kind, merge, replace = request.name, request.kind, request.merge, request.replace
    files = {f.path: f for f, _ in request.local}
    if current is None:
        return RemoteEntry(name, kind, tuple(files.values()), updated=_now())
    verb = "syncing" if merge else "pushing"
    if current.kind != kind:
        raise EntryKindError(
            f"{location} has entry {name!r} as a {current.kind}; {verb} a {kind} onto it is "
            f"refused (an entry never changes kind): choose another name"
        )
    if merge:
        files = {**{f.path: f for f in current.files}, **files}
    entry = RemoteEntry(name, kind, tuple(files.values()), updated=_now())
    if entry.revision == current.revision:
        return None
    if not merge and not replace:
        raise EntryExistsError(
            f"{location} already has entry {name!r} ({current.kind}, revision {_short(current)}, "
            f"{len(current.files)} files) with other content; pass --replace (replace=True) to "
            f"publish this as its new revision (the old one stays pullable as "
            f"{name}@{current.commit or current.revision[:12]}"
            f"{'' if current.commit else ' until pruned'})"
        )
    return entry


def _place(
    entry: RemoteEntry, current: RemoteEntry | None, fresh: dict[tuple[str | None, int], str]
) -> tuple[RemoteEntry, list[RemoteFile]]:
    """``entry`` with storage paths, keeping ``current``'s revisions; and the files to upload.

    Bytes any listed revision already stores are reused. New bytes of a new entry go to
    the file's own path; once the entry exists, to a storage path no one ever used,
    ``.blobs/<sha256>-<random>`` (chosen once per content in ``fresh``, so a retry reuses
    what this publish already sent): a revision a concurrent prune dropped may have used
    any other place, and prune deletes those (see ``torchstore.remote.index``).
    """
    listed = current.revisions if current is not None else ()
    stored: dict[tuple[str | None, int], str] = {}
    for old in listed:
        for f in old.files:
            stored.setdefault((f.sha256, f.size), f.stored_at)
    placed, todo = [], []
    for f in entry.files:
        key = (f.sha256, f.size)
        at = stored.get(key)
        if at is None:
            if current is None:  # own path, unless this publish had to put it elsewhere
                at = fresh.get(key, f.path)
            else:
                at = fresh.setdefault(key, f"{BLOBS}/{f.sha256}-{secrets.token_hex(8)}")
            stored[key] = at
            todo.append(RemoteFile(f.path, f.size, f.sha256, f.blob_sha1, f.source, at))
        placed.append(RemoteFile(f.path, f.size, f.sha256, f.blob_sha1, f.source, at))
    history: tuple[RemoteEntry, ...] = ()
    if current is not None:  # an earlier revision pushed again becomes the latest again
        history = tuple(
            e for e in (current.without_history(), *current.history) if e.revision != entry.revision
        )
    published = RemoteEntry(
        entry.name, entry.kind, tuple(placed), updated=entry.updated, history=history
    )
    return published, todo


class Backend(abc.ABC):
    """The interface (see the module docstring)."""

    location: Location

    @abc.abstractmethod
    def entries(self) -> dict[str, RemoteEntry]:
        """Every entry by name (:class:`NoSuchLocationError` for a location that is not one)."""

    @abc.abstractmethod
    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        """One entry at ``revision`` (default: its latest); :class:`NoSuchEntryError` if absent."""

    @abc.abstractmethod
    def find(self, name: str) -> RemoteEntry | None:
        """The entry (latest revision, with its history), or ``None``; for publishing."""

    @abc.abstractmethod
    def fetch(
        self,
        entry: RemoteEntry,
        file: RemoteFile,
        staging: Path,
        *,
        progress: Progress | None = None,
    ) -> Path:
        """Download one file of ``entry`` into ``staging``; returns where it is."""

    def publish(
        self,
        name: str,
        kind: str,
        local: Sequence[tuple[RemoteFile, Path]],
        *,
        replace: bool = False,
        merge: bool = False,
        progress: Progress | None = None,
    ) -> Published:
        """Make ``local`` entry ``name`` (see the module docstring for the rules)."""
        return self._publish(_Publish(name, kind, tuple(local), replace, merge, progress))

    @abc.abstractmethod
    def _publish(self, request: _Publish) -> Published:
        """:meth:`publish`, as this kind of location does it."""

    def prune(self, name: str, keep: int) -> Pruned:
        """Drop all but the newest ``keep`` revisions of ``name`` (index locations only)."""
        raise TorchstoreError(
            f"{self.location} keeps every revision as a commit; prune works on index locations "
            "(HTTP, folders, fsspec)"
        )


def _no_entry(location: Location, name: str, entries: dict[str, RemoteEntry]) -> NoSuchEntryError:
    have = ", ".join(sorted(entries)[:20]) or "none"
    return NoSuchEntryError(
        f"{location} has no entry {name!r} (its entries: "
        f"{have}{', ...' if len(entries) > 20 else ''})"
    )


class IndexBackend(Backend):
    """Entries listed in ``<base>/index.json``; files at ``<base>/<name>/<storage path>``."""

    def __init__(self, location: Location, client: FileClient):
        self.location = location
        self.client = client
        self._warned_no_etag = False

    def __repr__(self) -> str:
        return f"IndexBackend({self.location.raw!r})"

    def _missing_location(self) -> NoSuchLocationError:
        client = self.client
        if isinstance(client, LocalFolderClient):
            root = client.root
            if not root.exists():
                why = "no such folder"
            elif not root.is_dir():
                why = "a file, not a folder"
            else:
                why = f"a folder without {INDEX_NAME}"
        elif isinstance(client, FsspecClient):
            why = f"no {INDEX_NAME} there"
        else:
            why = f"{INDEX_NAME} is not there (HTTP 404)"
        return NoSuchLocationError(
            f"no such location: {self.location} ({why}); a location is made by pushing an "
            f"entry to it, or by `torchstore remote index DIR` on a folder of entries"
        )

    def _read_index(self, *, must_exist: bool) -> tuple[dict[str, RemoteEntry], str | None, bool]:
        got = self.client.read_bytes(INDEX_NAME, limit=MAX_INDEX_BYTES)
        if got is None:
            if must_exist:
                raise self._missing_location()
            return {}, None, False
        data, etag = got
        return parse_index(data, source=f"{self.location}/{INDEX_NAME}"), etag, True

    def entries(self) -> dict[str, RemoteEntry]:
        return self._read_index(must_exist=True)[0]

    def find(self, name: str) -> RemoteEntry | None:
        return self._read_index(must_exist=False)[0].get(name)

    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        entries = self.entries()
        if name not in entries:
            raise _no_entry(self.location, name, entries)
        entry = entries[name]
        if revision is None:
            return entry
        found = entry.at_revision(revision)
        if found is None:
            listed = ", ".join(e.revision[:12] for e in entry.revisions)
            raise NoSuchEntryError(
                f"{self.location} has no revision {revision!r} of {name!r} (a prefix of at least "
                f"7 characters of one of: {listed})"
            )
        return found

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
            f"{entry.name}/{file.stored_at}", partial, size=file.size, progress=progress
        )
        return partial

    def _write_index(self, entries: dict[str, RemoteEntry], etag: str | None, exists: bool) -> bool:
        """Write the index if unchanged since read; False if someone else wrote it meanwhile."""
        if exists and etag is None and not self._warned_no_etag:
            self._warned_no_etag = True
            log.warning(
                "%s sent no ETag for %s: this write cannot be conditional, so a push made "
                "at the same time may be lost",
                self.location,
                INDEX_NAME,
            )
        try:
            self.client.write_bytes(
                INDEX_NAME, dump_index(entries.values()), if_match=etag, if_absent=not exists
            )
        except RemoteChangedError:
            log.info("%s/%s changed while writing it; reading it again", self.location, INDEX_NAME)
            return False
        return True

    def _publish(self, request: _Publish) -> Published:
        name, progress = request.name, request.progress
        sources = {f.path: path for f, path in request.local}
        sent: dict[str, str | None] = {}  # storage path -> sha256 of what this call uploaded
        fresh: dict[tuple[str | None, int], str] = {}  # content -> where this call put it
        for attempt in range(_INDEX_WRITE_ATTEMPTS):
            entries, etag, exists = self._read_index(must_exist=False)
            current = entries.get(name)
            entry = _plan(self.location, request, current)
            if entry is None:  # someone published this content while this call uploaded
                shas = set(sent.values())  # uploaded names file paths, as below
                paths = sorted(f.path for f, _ in request.local if f.sha256 in shas)
                return Published(current, tuple(paths), up_to_date=not sent)
            todo = _place(entry, current, fresh)[1]
            self._send(name, todo, sources, sent, fresh, new=current is None, progress=progress)
            published, todo = _place(entry, current, fresh)  # where the bytes went
            entries[name] = published
            if self._write_index(entries, etag, exists):
                uploaded = {f.stored_at for f in todo}
                return Published(
                    published, tuple(f.path for f in published.files if f.stored_at in uploaded)
                )
            _backoff(attempt)
        raise self._conflict(f"pushing {name!r}", "nothing of this push is listed")

    def _send(
        self,
        name: str,
        todo: Sequence[RemoteFile],
        sources: dict[str, Path],
        sent: dict[str, str | None],
        fresh: dict[tuple[str | None, int], str],
        *,
        new: bool,
        progress: Progress | None,
    ) -> None:
        """Upload ``todo``, noting where each content went in ``fresh`` and ``sent``.

        A new entry's file goes to its own path by exclusive create only: a concurrent
        pusher of the same new entry (or an unlisted leftover) may hold that path, and
        replacing it would change bytes the other pusher's index lists.
        """
        for f in todo:
            at = f.stored_at
            if sent.get(at) == f.sha256:
                continue
            log.info("uploading %s/%s (%d bytes)", name, f.path, f.size)
            try:
                self.client.upload(
                    sources[f.path], f"{name}/{at}", progress=progress, exclusive=new
                )
            except RemoteChangedError:  # the path is taken: a never-used one instead
                at = f"{BLOBS}/{f.sha256}-{secrets.token_hex(8)}"
                self.client.upload(sources[f.path], f"{name}/{at}", progress=progress)
            fresh[(f.sha256, f.size)] = at
            sent[at] = f.sha256

    def _conflict(self, doing: str, outcome: str) -> IndexConflictError:
        return IndexConflictError(
            f"{self.location}/{INDEX_NAME} was changed by other writers {_INDEX_WRITE_ATTEMPTS} "
            f"times in a row while {doing}; {outcome}: run it again (`torchstore catalog "
            f"{self.location}` shows what is there now)"
        )

    def prune(self, name: str, keep: int) -> Pruned:
        keep = positive_int("keep", keep, hint=_KEEP_HINT)
        for attempt in range(_INDEX_WRITE_ATTEMPTS):
            entries, etag, exists = self._read_index(must_exist=True)
            if name not in entries:
                raise _no_entry(self.location, name, entries)
            entry = entries[name]
            kept, dropped = entry.revisions[:keep], entry.revisions[keep:]
            if not dropped:
                return Pruned(entry, (), (), ())
            pruned = RemoteEntry(
                name, entry.kind, entry.files, entry.revision, entry.updated, history=kept[1:]
            )
            entries[name] = pruned
            if self._write_index(entries, etag, exists):  # the index first: readers stay safe
                break
            _backoff(attempt)
        else:
            raise self._conflict(f"pruning {name!r}", "nothing was pruned")
        # Safe to delete: a push that read the index before this prune wrote it fails its
        # conditional write and re-plans; one that read it after reuses only paths a kept
        # revision lists and uploads only to never-used paths (_place), so none of these.
        still = {f.stored_at for e in kept for f in e.files}
        unused = sorted({f.stored_at for e in dropped for f in e.files} - still)
        deleted, left = self._delete_unused(name, unused)
        return Pruned(pruned, tuple(e.revision for e in dropped), deleted, left)

    def _delete_unused(
        self, name: str, unused: list[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Delete ``name/<at>`` for each storage path; ``(deleted, left in place)``."""
        delete = getattr(self.client, "delete", None)
        if delete is None:
            return (), tuple(unused)
        deleted, left, why = [], [], ""
        for at in unused:
            try:
                delete(f"{name}/{at}")
                deleted.append(at)
            except OSError as exc:  # TransferError is one: a server refusing DELETE
                why = why or str(exc)
                left.append(at)
        if left:
            log.warning(
                "prune %s: left %d unused file(s) of %s in place (first reason: %s)",
                self.location,
                len(left),
                name,
                why,
            )
        return tuple(deleted), tuple(left)


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

    def find(self, name: str) -> RemoteEntry | None:
        try:
            return self.entry(name)
        except RemoteNotFoundError:
            return None

    def _read_manifest(self, name: str, commit: str) -> RemoteEntry:
        with tempfile.TemporaryDirectory(prefix="torchstore-hub-") as tmp:
            path = self.client.download(name, ENTRY_NAME, commit, Path(tmp))
            if path.stat().st_size > MAX_INDEX_BYTES:
                raise TransferError(
                    f"{ENTRY_NAME} of {self.client.repo_id(name)!r} is larger than "
                    f"{MAX_INDEX_BYTES} bytes"
                )
            return parse_entry(
                path.read_bytes(), source=f"{ENTRY_NAME} of {self.client.repo_id(name)!r}"
            )

    def entry(self, name: str, revision: str | None = None) -> RemoteEntry:
        try:
            commit = self.client.resolve(name, revision)
        except RemoteNotFoundError as exc:
            raise NoSuchEntryError(str(exc)) from None
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
                        f"{ENTRY_NAME} of {self.client.repo_id(name)!r} lists {f.path!r}, which "
                        "the repo lacks"
                    )
                if hub.size != f.size:
                    raise StoreFormatError(
                        f"{ENTRY_NAME} of {self.client.repo_id(name)!r} says {f.path!r} has "
                        f"{f.size} bytes, the repo {hub.size}"
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

    def _publish(self, request: _Publish) -> Published:
        name = request.name
        current = self.find(name)
        entry = _plan(self.location, request, current)
        if entry is None:
            return Published(current, (), up_to_date=True)
        todo = _changed(request.local, current)
        if request.merge:
            todo = [(f, p) for f, p in todo if entry.file(f.path) == f]
        deletes = []
        if current is not None:
            deletes = [f.path for f in current.files if entry.file(f.path) is None]
        adds: dict[str, Path | bytes] = {f.path: path for f, path in todo}
        adds[ENTRY_NAME] = dump_entry(entry)
        commit = self.client.commit(
            name, adds, deletes, message=f"torchstore: {entry.kind} {name} ({len(todo)} files)"
        )
        if request.progress is not None:
            request.progress(sum(f.size for f, _ in todo))
        return Published(
            RemoteEntry(entry.name, entry.kind, entry.files, entry.revision, entry.updated, commit),
            tuple(f.path for f, _ in todo),
        )


def open_backend(
    location: Location,
    *,
    timeout: float = 30.0,
    retries: int = 5,
    offline: bool | None = None,
    doing: str = "reaching",
) -> Backend:
    """The backend for a parsed location; refuses a network location in offline mode."""
    check_online(location, doing, offline)
    if location.scheme == "hub":
        return HubBackend(
            location, HubClient(location.namespace or "", repo_type=location.repo_type)
        )
    if location.scheme == "http":
        return IndexBackend(location, HttpClient(location.raw, timeout=timeout, retries=retries))
    return IndexBackend(location, folder_client(location.raw))
