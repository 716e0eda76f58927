"""Sync a recording that is still being written: upload what is complete, and only what is new.

Each run:

1. walks the recording and asks :func:`~torchstore.remote.is_safe_to_upload` about every
   file (scratch, lock and hidden files are ignored silently; others refused are reported
   in ``SyncResult.skipped``);
2. for a torchstore HDF5 store that a writer still has open (the one refusal it can work
   around), exports a **snapshot of the committed episodes** with a torchstore reader
   (which sees committed episodes only, exactly) into a fresh, closed store and uploads
   that under the store's name, tagged ``source = "torchstore-snapshot episodes=E rows=R"``;
   the next run exports again only if more episodes were committed;
3. copies each new or changed file into a scratch folder and checks the copy again (a
   writer may replace a file between the scan and the upload: the entry must describe
   exactly the bytes sent), uploads the copies, then updates the entry (``index.json``
   last, or one Hub commit). Remote files missing locally are kept.

Once the writer closes the store, its real file is safe and replaces the snapshot. A store
whose writer died (it left its writer lock unheld, see ``torchstore.io.hdf5.writer_lock``) is
snapshotted the same way, and ``SyncResult.notes`` says so and how to finish it.

Sync only ever adds to an entry of kind ``recording``: onto another kind it is refused
(:class:`~torchstore.remote.backend.EntryKindError`), before anything is read or sent.
Each sync that changes the entry makes a new revision; the earlier ones stay pullable as
``NAME@REVISION`` until ``torchstore prune``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from torchstore.io.paths import check_name
from torchstore.io.remote.checksum import sha256_file
from torchstore.io.remote.transfer import progress_bar
from torchstore.remote.backend import EntryKindError, open_backend
from torchstore.remote.index import RemoteEntry, RemoteFile
from torchstore.remote.location import parse_location
from torchstore.remote.safe_upload import DEAD_WRITER_STORE, LIVE_STORE, upload_refusal
from torchstore.remote.upload import scan_folder
from torchstore.validation import positive_int

__all__ = ["sync_recording", "SyncResult", "snapshot_store"]

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "torchstore-snapshot"


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one sync did; ``notes`` are things the user must know (a writer that died)."""

    entry: RemoteEntry | None
    uploaded: tuple[str, ...]
    unchanged: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()


def dead_writer_note(path: Path, episodes: int | None = None) -> str:
    """What to tell a user about a store whose writer died."""
    committed = (
        f"its {episodes} committed episodes" if episodes is not None else "its committed episodes"
    )
    return (
        f"{path}: its writer died before closing it; {committed} are safe (uploaded as a "
        f"snapshot); finish it with TrajectoryStoreWriter.resume({str(path)!r}) and close it"
    )


def _committed(path: Path) -> tuple[int, int]:
    from torchstore.data.store import TrajectoryStore

    with TrajectoryStore(path) as store:
        return store.num_episodes, store.num_rows


def snapshot_store(path: str | os.PathLike, dest: str | os.PathLike) -> tuple[int, int]:
    """Copy the committed episodes of a (possibly live) store into a new closed store ``dest``.

    Returns ``(episodes, rows)`` copied. Quantised columns are copied as their codes, and
    the manifest (env id, seed, metadata) and episode metadata are kept.
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.data.store import TrajectoryStore

    with TrajectoryStore(path) as store:
        manifest = store.manifest
        with TrajectoryStoreWriter(
            dest,
            manifest.columns,
            env_id=manifest.env_id,
            seed=manifest.seed,
            metadata=manifest.metadata,
        ) as writer:
            for i in range(store.num_episodes):
                writer.add_episode(
                    store.episode(i, raw=True), store.episode_metadata(i) or None, raw=True
                )
        return store.num_episodes, store.num_rows


def sync_recording(
    local_recording: str | os.PathLike,
    location: str | os.PathLike,
    name: str,
    *,
    snapshot_live_stores: bool = True,
    min_age_s: float = 0.0,
    keep: int | None = None,
    offline: bool | None = None,
    progress: bool = False,
    timeout: float = 30.0,
    retries: int = 5,
) -> SyncResult:
    """Upload the complete, new files of a recording in progress as entry ``name``.

    The entry's kind is ``recording``.

    Args:
        local_recording: the recording folder a writer is filling.
        location: where to upload (see :func:`~torchstore.remote.cache`).
        name: the entry name.
        snapshot_live_stores: upload a snapshot of the committed episodes of an HDF5 store
            a writer holds (otherwise it is skipped until the writer closes it).
        min_age_s: passed to :func:`~torchstore.remote.is_safe_to_upload`.
        keep: after a sync that made a new revision, prune all but the newest ``keep``
            (each sync of a growing store adds a snapshot; index locations only).
        offline: refuse a network location (default: ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE``).
        progress: show a progress bar.

    Raises:
        EntryKindError: ``name`` exists and is not a recording.
        OfflineError: offline mode and a network location.

    Examples:
        >>> sync_recording("runs/today", "http://127.0.0.1:8000/data", "today")  # doctest: +SKIP
    """
    check_name(name, subject="entry name")
    keep = positive_int("keep", keep, allow_none=True, hint=" (the latest revision is always kept)")
    root = Path(local_recording)
    if not root.is_dir():
        raise FileNotFoundError(f"no recording folder at {root}")
    loc = parse_location(location)
    backend = open_backend(
        loc, timeout=timeout, retries=retries, offline=offline, doing="syncing to"
    )
    current = backend.find(name)
    if current is not None and current.kind != "recording":
        raise EntryKindError(
            f"{loc} has entry {name!r} as a {current.kind}; syncing a recording onto it is "
            "refused (an entry never changes kind): choose another name"
        )
    found, refused = scan_folder(root, min_age_s=min_age_s)
    skipped: list[tuple[str, str]] = []
    notes: list[str] = []
    local: list[tuple[RemoteFile, Path]] = []
    with tempfile.TemporaryDirectory(prefix="torchstore-sync-") as scratch:
        for rel, path in found:
            got = _frozen_copy(path, rel, current, Path(scratch))
            if isinstance(got, str):
                skipped.append((rel, got))
            else:
                local.append(got)
        for rel, reason in refused:
            if reason not in (LIVE_STORE, DEAD_WRITER_STORE) or not snapshot_live_stores:
                skipped.append((rel, reason))
                continue
            got = _snapshot_for(root / rel, rel, current, Path(scratch), reason)
            if isinstance(got, str):
                skipped.append((rel, got))
            else:
                local.append(got)
                if reason == DEAD_WRITER_STORE:
                    notes.append(dead_writer_note(root / rel, _episodes_of(got[0])))
        if not local:
            return SyncResult(current, (), (), tuple(skipped), tuple(notes))
        with progress_bar(sum(f.size for f, _ in local), f"sync {name}", enabled=progress) as bar:
            published = backend.publish(name, "recording", local, merge=True, progress=bar.update)
    entry = published.entry
    if keep is not None and not published.up_to_date and loc.scheme != "hub":
        entry = backend.prune(name, keep).entry
    uploaded = set(published.uploaded)
    unchanged = tuple(f.path for f, _ in local if f.path not in uploaded)
    log.info(
        "synced %r: %d uploaded, %d unchanged, %d skipped",
        name,
        len(uploaded),
        len(unchanged),
        len(skipped),
    )
    return SyncResult(entry, published.uploaded, unchanged, tuple(skipped), tuple(notes))


def _episodes_of(f: RemoteFile) -> int | None:
    for word in (f.source or "").split():
        key, _, value = word.partition("=")
        if key == "episodes" and value.isdigit():
            return int(value)
    return None


def _frozen_copy(
    path: Path, rel: str, current: RemoteEntry | None, scratch: Path
) -> tuple[RemoteFile, Path] | str:
    """``(descriptor, bytes to send)`` for a complete file, or why it cannot be sent now.

    A file the remote already holds byte for byte is described in place. A new or changed
    one is first copied into ``scratch`` and checked again there: a writer may replace or
    extend it after the scan, and the index must describe exactly the bytes uploaded.
    """
    have = current.file(rel) if current is not None else None
    try:
        size = path.stat().st_size
        if have is not None and have.size == size and have.sha256 == sha256_file(path):
            if have.source is not None:
                # a snapshot of a store that has since closed with the very same bytes
                # (snapshots are deterministic): the file is now the real one
                return RemoteFile(rel, have.size, have.sha256), path
            return have, path
        copy = scratch / f"copy-{len(list(scratch.iterdir()))}" / path.name
        copy.parent.mkdir()
        shutil.copyfile(path, copy, follow_symlinks=False)
    except FileNotFoundError:
        return "it does not exist (any more)"
    reason = upload_refusal(copy)
    if reason is not None:
        return f"{reason} (changed while it was read)"
    return RemoteFile(rel, copy.stat().st_size, sha256_file(copy)), copy


def _snapshot_for(
    path: Path, rel: str, current: RemoteEntry | None, scratch: Path, reason: str = LIVE_STORE
) -> tuple[RemoteFile, Path] | str:
    """The snapshot to publish for a live store (the remote one if up to date), or why not."""
    from torchstore.errors import TorchstoreError

    try:
        episodes, rows = _committed(path)
        tag = f"{SNAPSHOT_PREFIX} episodes={episodes} rows={rows}"
        have = current.file(rel) if current is not None else None
        if have is not None and have.source == tag:
            return have, path  # unchanged: publish compares bytes and sends nothing
        if episodes == 0:
            return f"{reason}, with no committed episode yet"
        dest = scratch / f"snapshot-{len(list(scratch.iterdir()))}.h5"
        episodes, rows = snapshot_store(path, dest)
    except (OSError, TorchstoreError) as exc:
        return f"{reason}, and a snapshot of it failed: {exc}"
    tag = f"{SNAPSHOT_PREFIX} episodes={episodes} rows={rows}"
    return RemoteFile(rel, dest.stat().st_size, sha256_file(dest), source=tag), dest
