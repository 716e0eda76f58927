"""Pull an entry into a local cache: resumable, verified file by file, atomic, offline-capable.

Cache layout (``cache_dir`` defaults to ``$TORCHSTORE_CACHE``, else
``$XDG_CACHE_HOME/torchstore``, else ``~/.cache/torchstore``)::

    <cache_dir>/<location slug>/<name>/...            the entry's files, only verified ones
    <cache_dir>/<location slug>/.partial/<name>/      downloads in progress (by sha256)
    <cache_dir>/<location slug>/.records/<name>.json  what was pulled and verified
    <cache_dir>/<location slug>/.locks/<name>         one puller per entry at a time

A file is downloaded to ``.partial/<name>/<sha256>`` (an interrupted download resumes from
there with an HTTP ``Range`` request, in the same call or a later one), checked against
its declared size and sha256, and only then renamed to its place: the entry folder never
holds a file that failed verification. Files already in place whose size and mtime match
the record (or, without a record, whose sha256 matches) are not fetched again.

An update that turns a file into a folder (or back) replaces the old one; files an
earlier pull placed that the entry no longer lists are deleted.

Offline (``offline=True``, or ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE`` set): no network;
for a network location the answer comes from the record and the files in the cache, or a
clear :class:`~torchstore.io.remote.transfer.TransferError` says what is missing. Local folders
are not network: they are pulled from as usual.

A read-only cache works: an entry that is in it complete and verified is answered
without writing anything (no lock, no record). When a pull must write and cannot, a
:class:`CacheNotWritableError` names the folder and how to choose another
(``--cache-dir``, ``TORCHSTORE_CACHE``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from torchstore.errors import CacheNotWritableError, IntegrityError
from torchstore.io.cache_root import cache_root
from torchstore.io.paths import check_name, make_dirs_inside, resolve_inside
from torchstore.io.remote.checksum import verify_file
from torchstore.io.remote.transfer import DeadlineError, TransferError, progress_bar
from torchstore.remote.backend import open_backend
from torchstore.remote.index import RemoteEntry, RemoteFile
from torchstore.remote.location import Location, is_offline, parse_location
from torchstore.validation import positive_number

__all__ = [
    "pull",
    "pull_entry",
    "default_cache_dir",
    "is_offline",
    "split_revision",
    "CacheNotWritableError",
    "DeadlineError",
]

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600.0


def default_cache_dir() -> Path:
    """``$TORCHSTORE_CACHE``, else ``$XDG_CACHE_HOME/torchstore``, else ``~/.cache/torchstore``
    (:func:`torchstore.io.cache_root.cache_root`)."""
    return cache_root()


_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def _writing(cache_dir: Path, doing: str) -> Iterator[None]:
    """Turn "cannot write here" into one clear :class:`CacheNotWritableError`."""
    try:
        yield
    except OSError as exc:
        # the cache folder, a folder inside it, or a parent that creating it needed
        inside = exc.filename is None or _related(os.fsdecode(exc.filename), cache_dir)
        if exc.errno not in _NOT_WRITABLE or not inside:
            raise
        raise CacheNotWritableError(
            f"the cache {cache_dir} is not writable ({doing}: {exc.strerror}); choose another "
            "with --cache-dir DIR or TORCHSTORE_CACHE=DIR"
        ) from None


def _related(path: str, folder: Path) -> bool:
    a, b = os.path.abspath(path), os.path.abspath(folder)
    try:
        return os.path.commonpath([a, b]) in (a, b)
    except ValueError:
        return False


def split_revision(name: str, revision: str | None) -> tuple[str, str | None]:
    """``"name@rev"`` -> ``("name", "rev")``; a revision both ways must agree."""
    if not isinstance(name, str) or "@" not in name:
        return name, revision
    base, _, rev = name.partition("@")
    if not rev:
        raise ValueError(f"entry {name!r}: nothing after '@' (NAME@REVISION)")
    if revision is not None and revision != rev:
        raise ValueError(f"entry {name!r} names revision {rev!r}, but revision={revision!r}")
    return base, rev


def _file_to_json(f: RemoteFile) -> dict:
    return {
        "path": f.path,
        "size": f.size,
        "sha256": f.sha256,
        "blob_sha1": f.blob_sha1,
        "source": f.source,
    }


class _Cache:
    """One entry's folder, partial downloads and record inside the cache."""

    def __init__(self, cache_dir: str | os.PathLike | None, location: Location, name: str):
        check_name(name, subject="entry name")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.location, self.name = location, name
        # nothing is created here: reading a complete entry must work on a read-only cache
        self.base = resolve_inside(self.cache_dir, location.slug, subject="cache folder")
        self.root = resolve_inside(self.base, name, subject="entry folder")
        self.partial = resolve_inside(self.base, f".partial/{name}", subject="partial folder")
        self.record_path = resolve_inside(
            self.base, f".records/{name}.json", subject="cache record"
        )

    def prepare(self) -> None:
        """Create the folders a pull writes to (:class:`CacheNotWritableError` if it cannot)."""
        with _writing(self.cache_dir, "creating its folders"):
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            make_dirs_inside(self.cache_dir, self.location.slug, subject="cache folder")
            for rel in (self.name, f".partial/{self.name}", ".records", ".locks"):
                make_dirs_inside(self.base, rel, subject="cache folder")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One puller per entry at a time (two would append to the same partial file)."""
        with _writing(self.cache_dir, "taking the pull lock"):
            fd = os.open(self.base / ".locks" / self.name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransferError(
                            f"another process has been pulling {self.name!r} into {self.root} for "
                            f"{LOCK_TIMEOUT_S:g} s"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    # ----------------------------------------------------------------- record
    def load(self) -> dict:
        try:
            record = json.loads(self.record_path.read_text())
        except (FileNotFoundError, ValueError):
            return {"verified": {}}
        if not isinstance(record, dict) or record.get("location") != self.location.raw:
            return {"verified": {}}
        record.setdefault("verified", {})
        return record

    def save(self, record: dict) -> None:
        tmp = self.record_path.with_name(f".{self.record_path.name}.tmp-{os.getpid()}")
        with _writing(self.cache_dir, "saving its record"):
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, self.record_path)

    # ----------------------------------------------------------------- files
    def target(self, f: RemoteFile) -> Path:
        return resolve_inside(self.root, f.path, subject=f"file of entry {self.name!r}")

    def state(self, f: RemoteFile, record: dict) -> str:
        """``"ok"``, ``"missing"`` or ``"stale"`` (present but not the declared bytes)."""
        path = self.target(f)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file where a folder goes
            return "missing"
        if not stat.S_ISREG(st.st_mode):
            return "stale"
        digest = f.sha256 or f.blob_sha1
        if record["verified"].get(f.path) == [st.st_size, st.st_mtime_ns, digest]:
            return "ok"
        try:
            verify_file(path, size=f.size, sha256=f.sha256, blob_sha1=f.blob_sha1, subject=f.path)
        except IntegrityError:
            return "stale"
        record["verified"][f.path] = [st.st_size, st.st_mtime_ns, digest]
        return "ok"

    def place(self, f: RemoteFile, candidate: Path, record: dict) -> None:
        """Verify ``candidate`` and rename it into the entry folder (or delete it and raise)."""
        subject = f"{f.path!r} of {self.name!r} from {self.location}"
        try:
            verify_file(
                candidate, size=f.size, sha256=f.sha256, blob_sha1=f.blob_sha1, subject=subject
            )
        except IntegrityError:
            candidate.unlink(missing_ok=True)
            raise
        self._clear_the_way(f.path, record)
        parent = f.path.rpartition("/")[0]
        if parent:
            make_dirs_inside(self.root, parent, subject=f"file of entry {self.name!r}")
        target = self.target(f)  # checked again right before the rename
        os.replace(candidate, target)
        st = os.lstat(target)
        record["verified"][f.path] = [st.st_size, st.st_mtime_ns, f.sha256 or f.blob_sha1]

    def _clear_the_way(self, path: str, record: dict) -> None:
        """Remove what an earlier revision left where ``path`` goes: a file where a folder
        must be, or a folder where the file must be (the entry lists neither)."""
        current = self.root
        parts = path.split("/")
        for i, segment in enumerate(parts):
            current = current / segment
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                return
            last = i == len(parts) - 1
            if not last and stat.S_ISREG(mode):  # an old file named like a folder we need
                current.unlink()
                record["verified"].pop("/".join(parts[: i + 1]), None)
                return
            if last and stat.S_ISDIR(mode):  # an old folder named like our file
                resolve_inside(self.root, path)  # no symlink on the way
                shutil.rmtree(current)
                prefix = path + "/"
                for stale in [p for p in record["verified"] if p.startswith(prefix)]:
                    del record["verified"][stale]
                return

    def clear_partials(self) -> None:
        for leftover in self.partial.iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def drop_stale(self, entry: RemoteEntry, record: dict) -> None:
        """Delete files an earlier pull placed that the entry no longer lists (and the
        folders that leaves empty)."""
        for path in [p for p in record["verified"] if entry.file(p) is None]:
            with contextlib.suppress(OSError, ValueError):
                resolve_inside(self.root, path).unlink()
            del record["verified"][path]
            parts = path.split("/")[:-1]
            while parts:  # an emptied folder may be where a file of the entry goes
                with contextlib.suppress(OSError, ValueError):
                    resolve_inside(self.root, "/".join(parts)).rmdir()
                parts.pop()


def _recorded_entry(cache: _Cache, record: dict) -> RemoteEntry:
    raw = record["entry"]
    return RemoteEntry(
        raw["name"],
        raw["kind"],
        tuple(
            RemoteFile(f["path"], f["size"], f["sha256"], f["blob_sha1"], f.get("source"))
            for f in raw["files"]
        ),
        commit=raw.get("commit"),
    )


def _offline(
    cache: _Cache, revision: str | None, select: Callable[[str], bool] | None
) -> tuple[Path, RemoteEntry]:
    """The cached entry, checked without any network and without writing anything."""
    record = cache.load()
    if "entry" not in record:
        raise TransferError(
            f"offline mode: {cache.name!r} from {cache.location} is not in the cache "
            f"({cache.root}); "
            "pull it once with the network on (unset HF_HUB_OFFLINE/TORCHSTORE_OFFLINE, "
            "offline=False)"
        )
    try:
        entry = _recorded_entry(cache, record)
    except (KeyError, TypeError, ValueError) as exc:  # StoreFormatError/UnsafePathError too
        raise TransferError(
            f"offline mode: the cache record {cache.record_path} is unreadable ({exc}); pull it "
            "online"
        ) from exc
    if (
        revision is not None
        and revision not in (record.get("revision"), entry.commit)
        and not (
            len(revision) >= 7
            and (entry.revision.startswith(revision) or (entry.commit or "").startswith(revision))
        )
    ):
        raise TransferError(
            f"offline mode: the cache holds {cache.name!r} at revision "
            f"{record.get('revision') or entry.revision[:12]!r}, "
            f"not {revision!r}"
        )
    for f in entry.files:
        if select is not None and not select(f.path):
            continue
        state = cache.state(f, record)
        if state == "stale":
            raise IntegrityError(
                f"offline mode: cached {f.path!r} of {cache.name!r} does not match its sha256; "
                "pull it online"
            )
        if state == "missing":
            raise TransferError(
                f"offline mode: {f.path!r} of {cache.name!r} was never pulled into {cache.root}"
            )
    return cache.root, entry


def _entry_record(loc: Location, name: str, revision: str | None, entry: RemoteEntry) -> dict:
    return {
        "location": loc.raw,
        "name": name,
        "revision": revision,
        "entry": {
            "name": entry.name,
            "kind": entry.kind,
            "commit": entry.commit,
            "files": [_file_to_json(f) for f in entry.files],
        },
    }


def _already_complete(
    cache: _Cache, record: dict, wanted: list[RemoteFile], fresh: dict, full: bool
) -> bool:
    """True if the cache holds every wanted file verified and its record says this entry,
    so the pull needs to write nothing (it works on a read-only cache)."""
    if record.get("entry") != fresh["entry"] or record.get("revision") != fresh["revision"]:
        return False
    if full and set(record["verified"]) - {f.path for f in wanted}:
        return False  # files of an older revision to drop
    try:
        return all(cache.state(f, record) == "ok" for f in wanted)
    except OSError:
        return False


def _partial_bytes(cache: _Cache, files: list[RemoteFile]) -> int:
    """Bytes already downloaded (by an interrupted pull) towards ``files``."""
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += min(f.size, (cache.partial / (f.sha256 or f.blob_sha1 or "-")).stat().st_size)
    return total


def pull_entry(
    location: str | os.PathLike,
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 5,
    deadline_s: float | None = None,
    select: Callable[[str], bool] | None = None,
) -> tuple[Path, RemoteEntry]:
    """:func:`pull`, also returning the entry; ``select`` limits it to some file paths."""
    name, revision = split_revision(name, revision)
    if deadline_s is not None:
        positive_number("deadline_s", deadline_s, finite=False, hint=" (seconds)")
    deadline = time.monotonic() + deadline_s if deadline_s is not None else None
    loc = parse_location(location)
    cache = _Cache(cache_dir, loc, name)
    if is_offline(offline) and loc.is_network:
        return _offline(cache, revision, select)
    backend = open_backend(loc, timeout=timeout, retries=retries, offline=False)
    if deadline is not None and hasattr(backend, "client"):
        backend.client.deadline = deadline
    entry = backend.entry(name, revision)
    wanted = [f for f in entry.files if select is None or select(f.path)]
    fresh = _entry_record(loc, name, revision, entry)
    record = cache.load()
    if _already_complete(cache, record, wanted, fresh, select is None):
        return cache.root, entry
    cache.prepare()
    with cache.locked():
        record = cache.load()
        todo = [f for f in wanted if cache.state(f, record) != "ok"]
        record.update(fresh)
        if select is None:
            cache.drop_stale(entry, record)
        cache.save(record)
        total = sum(f.size for f in todo)
        initial = _partial_bytes(cache, todo) if entry.commit is None else 0
        with progress_bar(total, f"pull {name}", enabled=progress, initial=initial) as bar:
            for f in todo:
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineError(
                        f"pull {name!r} from {loc}: past its deadline of {deadline_s:g} s with "
                        f"{len(todo)} file(s) to go; what it fetched is kept, pull again to resume"
                    )
                log.info("fetching %s/%s (%d bytes)", name, f.path, f.size)
                with _writing(cache.cache_dir, f"downloading {f.path!r}"):
                    candidate = backend.fetch(entry, f, cache.partial, progress=bar.update)
                    cache.place(f, candidate, record)
                cache.save(record)
        if select is None:
            cache.clear_partials()  # everything is in place: what is left is from older revisions
    return cache.root, entry


def pull(
    location: str | os.PathLike,
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 5,
    deadline_s: float | None = None,
) -> Path:
    """Download entry ``name`` from ``location`` into the cache; returns its folder.

    Args:
        location: ``hf://datasets/NS``, ``http(s)://...``, a folder or an fsspec URL.
        name: the entry (a Hub repo name under the namespace); ``NAME@REVISION`` pulls an
            earlier revision (same as ``revision=``).
        cache_dir: the cache root (see the module docstring for the default).
        revision: a Hub branch, tag or commit; for an index location, a prefix (>= 7
            characters) of one of the entry's listed revisions (``torchstore catalog
            --files`` shows them).
        offline: answer from the cache only (default: ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE``);
            local folders are read as usual.
        progress: show a progress bar (bytes and rate).
        timeout: seconds without progress before an HTTP attempt fails.
        retries: further attempts per file after a dropped connection or a timeout.
        deadline_s: give up once the whole pull has taken this many seconds (a server
            sending bytes just fast enough to beat ``timeout`` can otherwise hold a pull
            for ever); checked between reads, so it may overrun by up to ``timeout``.
            What was fetched is kept and a later pull resumes it.

    Raises:
        IntegrityError: a file does not match its declared size or sha256 (it is deleted).
        UnsafePathError: the remote named a path outside the entry folder.
        NoSuchLocationError / NoSuchEntryError: a mistyped location or entry name.
        CacheNotWritableError: the pull must write to the cache and cannot.
        DeadlineError: ``deadline_s`` passed.
        TransferError: the network failed, or offline mode lacks what was asked for.

    Examples:
        >>> path = pull("http://127.0.0.1:8000/data", "pusht-demo")  # doctest: +SKIP
    """
    return pull_entry(
        location,
        name,
        cache_dir=cache_dir,
        revision=revision,
        offline=offline,
        progress=progress,
        timeout=timeout,
        retries=retries,
        deadline_s=deadline_s,
    )[0]
