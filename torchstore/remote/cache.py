"""Pull an entry into a local cache: resumable, verified file by file, atomic, offline-capable.

Cache layout (``cache_dir`` defaults to ``$TORCHSTORE_CACHE``, else
``$XDG_CACHE_HOME/torchstore``, else ``~/.cache/torchstore``)::

    <cache_dir>/<location slug>/<name>/...            the entry's files, only verified ones
    <cache_dir>/<location slug>/.partial/<name>/      downloads in progress (by sha256)
    <cache_dir>/<location slug>/.records/<name>.json  what was pulled and verified

A file is downloaded to ``.partial/<name>/<sha256>`` (an interrupted download resumes from
there with an HTTP ``Range`` request, in the same call or a later one), checked against
its declared size and sha256, and only then renamed to its place: the entry folder never
holds a file that failed verification. Files already in place whose size and mtime match
the record (or, without a record, whose sha256 matches) are not fetched again.

Offline (``offline=True``, or ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE`` set): no network;
the answer comes from the record and the files in the cache, or a clear
:class:`~torchstore.io.transfer.TransferError` says what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from torchstore.errors import IntegrityError
from torchstore.io.checksum import verify_file
from torchstore.io.paths import check_name, make_dirs_inside, resolve_inside
from torchstore.io.transfer import TransferError, env_flag, progress_bar
from torchstore.remote.backend import open_backend
from torchstore.remote.index import RemoteEntry, RemoteFile
from torchstore.remote.location import Location, parse_location

__all__ = ["pull", "default_cache_dir", "is_offline"]

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600.0


def default_cache_dir() -> Path:
    """``$TORCHSTORE_CACHE``, else ``$XDG_CACHE_HOME/torchstore``, else ``~/.cache/torchstore``."""
    if os.environ.get("TORCHSTORE_CACHE"):
        return Path(os.environ["TORCHSTORE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchstore"


def is_offline(offline: bool | None = None) -> bool:
    """``offline`` if given, else whether ``HF_HUB_OFFLINE`` or ``TORCHSTORE_OFFLINE`` is set."""
    if offline is not None:
        return bool(offline)
    return env_flag("HF_HUB_OFFLINE") or env_flag("TORCHSTORE_OFFLINE")


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
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.location, self.name = location, name
        self.base = make_dirs_inside(cache_dir, location.slug, subject="cache folder")
        self.root = make_dirs_inside(self.base, name, subject="entry folder")
        self.partial = make_dirs_inside(self.base, f".partial/{name}", subject="partial folder")
        self.record_path = (
            make_dirs_inside(self.base, ".records", subject="records folder") / f"{name}.json"
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One puller per entry at a time (two would append to the same partial file)."""
        fd = os.open(self.base / ".partial" / f"{self.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransferError(
                            f"another process has been pulling {self.name!r} into {self.root} for {LOCK_TIMEOUT_S:g} s"
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
        except FileNotFoundError:
            return "missing"
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
        parent = f.path.rpartition("/")[0]
        if parent:
            make_dirs_inside(self.root, parent, subject=f"file of entry {self.name!r}")
        target = self.target(f)  # checked again right before the rename
        os.replace(candidate, target)
        st = os.lstat(target)
        record["verified"][f.path] = [st.st_size, st.st_mtime_ns, f.sha256 or f.blob_sha1]

    def clear_partials(self) -> None:
        for leftover in self.partial.iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def drop_stale(self, entry: RemoteEntry, record: dict) -> None:
        """Delete files an earlier pull placed that the entry no longer lists."""
        for path in [p for p in record["verified"] if entry.file(p) is None]:
            with contextlib.suppress(OSError, ValueError):
                resolve_inside(self.root, path).unlink()
            del record["verified"][path]


def _offline(
    cache: _Cache, revision: str | None, select: Callable[[str], bool] | None
) -> tuple[Path, RemoteEntry]:
    record = cache.load()
    if "entry" not in record:
        raise TransferError(
            f"offline mode: {cache.name!r} from {cache.location} is not in the cache ({cache.root}); "
            "pull it once with the network on (unset HF_HUB_OFFLINE/TORCHSTORE_OFFLINE, offline=False)"
        )
    try:
        raw = record["entry"]
        entry = RemoteEntry(
            raw["name"],
            raw["kind"],
            tuple(
                RemoteFile(f["path"], f["size"], f["sha256"], f["blob_sha1"], f.get("source"))
                for f in raw["files"]
            ),
            commit=raw.get("commit"),
        )
    except (KeyError, TypeError, ValueError) as exc:  # StoreFormatError/UnsafePathError too
        raise TransferError(
            f"offline mode: the cache record {cache.record_path} is unreadable ({exc}); pull it online"
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
            f"offline mode: the cache holds {cache.name!r} at revision {record.get('revision') or entry.revision[:12]!r}, "
            f"not {revision!r}"
        )
    for f in entry.files:
        if select is not None and not select(f.path):
            continue
        state = cache.state(f, record)
        if state == "stale":
            raise IntegrityError(
                f"offline mode: cached {f.path!r} of {cache.name!r} does not match its sha256; pull it online"
            )
        if state == "missing":
            raise TransferError(
                f"offline mode: {f.path!r} of {cache.name!r} was never pulled into {cache.root}"
            )
    return cache.root, entry


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
    select: Callable[[str], bool] | None = None,
) -> tuple[Path, RemoteEntry]:
    """:func:`pull`, also returning the entry; ``select`` limits it to some file paths."""
    loc = parse_location(location)
    cache = _Cache(cache_dir, loc, name)
    if is_offline(offline):
        with cache.locked():
            return _offline(cache, revision, select)
    backend = open_backend(loc, timeout=timeout, retries=retries)
    entry = backend.entry(name, revision)
    with cache.locked():
        record = cache.load()
        wanted = [f for f in entry.files if select is None or select(f.path)]
        todo = [f for f in wanted if cache.state(f, record) != "ok"]
        record.update(
            location=loc.raw,
            name=name,
            revision=revision,
            entry={
                "name": entry.name,
                "kind": entry.kind,
                "commit": entry.commit,
                "files": [_file_to_json(f) for f in entry.files],
            },
        )
        if select is None:
            cache.drop_stale(entry, record)
        cache.save(record)
        with progress_bar(sum(f.size for f in todo), f"pull {name}", enabled=progress) as bar:
            for f in todo:
                log.info("fetching %s/%s (%d bytes)", name, f.path, f.size)
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
) -> Path:
    """Download entry ``name`` from ``location`` into the cache; returns its folder.

    Args:
        location: ``hf://datasets/NS``, ``http(s)://...``, a folder or an fsspec URL.
        name: the entry (a Hub repo name under the namespace).
        cache_dir: the cache root (see the module docstring for the default).
        revision: a Hub branch, tag or commit; for an index location, a prefix (>= 7
            characters) of the entry's revision.
        offline: answer from the cache only (default: ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE``).
        progress: show a progress bar (bytes and rate).
        timeout: seconds without progress before an HTTP attempt fails.
        retries: further attempts per file after a dropped connection or a timeout.

    Raises:
        IntegrityError: a file does not match its declared size or sha256 (it is deleted).
        UnsafePathError: the remote named a path outside the entry folder.
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
    )[0]
