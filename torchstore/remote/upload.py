"""Push a local folder (dataset, asset pack, policy weights) as one entry; write a folder's index.

``push`` uploads the files the remote does not already hold byte for byte, then makes
the entry visible (``index.json`` written last, or one Hub commit). The entry then lists
exactly the local files. Pushing onto an existing entry:

- the same content: nothing is sent, the entry is "up to date";
- other content: refused unless ``replace=True``; then the pushed files become the
  entry's new revision and the replaced one stays pullable as ``NAME@REVISION`` until
  ``torchstore prune`` (on the Hub, as the earlier commit);
- another kind (a dataset onto a recording): always refused.

``write_index`` (``torchstore remote index``) agrees with ``push`` on what an entry is: a
sub-folder with at least one file to publish. Entries the existing index lists keep
their revisions; only new sub-folders are added.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from torchstore.errors import IncompleteFileError, StoreFormatError, UnknownEntryError
from torchstore.io.paths import check_name
from torchstore.io.remote.checksum import sha256_file
from torchstore.io.remote.transfer import progress_bar
from torchstore.remote.backend import Pruned, Published, open_backend
from torchstore.remote.index import (
    BLOBS,
    INDEX_NAME,
    EntryKind,
    RemoteEntry,
    RemoteFile,
    dump_index,
    parse_index,
)
from torchstore.remote.location import parse_location
from torchstore.remote.safe_upload import DEAD_WRITER_STORE, is_scratch, upload_refusal

__all__ = ["push", "push_folder", "prune", "write_index", "IncompleteFileError", "scan_folder"]

log = logging.getLogger(__name__)


def _check_kind(kind: str) -> str:
    kinds = [k.value for k in EntryKind]
    if kind not in kinds:
        raise ValueError(f"kind ({kind!r}) must be one of {kinds}")
    return kind


def _refusal_text(local: Path, name: str, refused: list[tuple[str, str]]) -> str:
    listed = "; ".join(f"{rel!r}: {reason}" for rel, reason in refused[:5])
    text = f"push {local} -> {name!r}: {len(refused)} file(s) are not safe to upload ({listed})"
    dead = [rel for rel, reason in refused if reason == DEAD_WRITER_STORE]
    if dead:
        where = local / dead[0] if local.is_dir() else local
        return (
            f"{text}; the writer of {dead[0]!r} died: its committed episodes are safe; finish it "
            f"with TrajectoryStoreWriter.resume({str(where)!r}) and close it, then push again "
            "(or sync it now: sync uploads the committed episodes)"
        )
    return f"{text}; finish or remove them, or use sync_recording for a recording in progress"


def scan_folder(
    root: str | os.PathLike, **rule
) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """``(uploadable, refused)`` below ``root``: ``(rel, path)`` and ``(rel, reason)`` pairs.

    Scratch and hidden files are left out of both lists; symlinked folders are not entered.
    """
    root = Path(root)
    ok, refused = [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(
            filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        ):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if is_scratch(rel):
                continue
            reason = upload_refusal(path, root=root, **rule)
            if reason is None:
                ok.append((rel, path))
            else:
                refused.append((rel, reason))
    return ok, refused


def _describe(rel: str, path: Path) -> tuple[RemoteFile, Path]:
    return RemoteFile(rel, path.stat().st_size, sha256_file(path)), path


def push(
    local_dir: str | os.PathLike,
    location: str | os.PathLike,
    name: str,
    *,
    kind: str = "dataset",
    replace: bool = False,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 5,
) -> RemoteEntry:
    """Upload ``local_dir`` (or a single file) as entry ``name``; returns the published entry.

    Every file must pass :func:`~torchstore.remote.is_safe_to_upload` (scratch, lock and
    hidden files are skipped); for a recording still being written use
    :func:`~torchstore.remote.sync_recording`. A ``policy`` entry must hold at least one
    ``.safetensors`` file, and every one is checked fully (see
    :func:`~torchstore.remote.weights.check_safetensors`).

    Args:
        replace: publish over an existing entry of other content (as its new revision;
            the replaced one stays pullable as ``NAME@REVISION`` until pruned).
        offline: refuse a network location (default: ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE``).

    Raises:
        IncompleteFileError: a file is being written, is a symlink, or is not complete.
        EntryExistsError: ``name`` exists with other content and ``replace`` is False.
        EntryKindError: ``name`` exists as another kind.
        OfflineError: offline mode and a network location.

    Examples:
        >>> push("out/pusht", "http://127.0.0.1:8000/data", "pusht-demo")  # doctest: +SKIP
    """
    return push_folder(
        local_dir,
        location,
        name,
        kind=kind,
        replace=replace,
        offline=offline,
        progress=progress,
        timeout=timeout,
        retries=retries,
    ).entry


def push_folder(
    local_dir: str | os.PathLike,
    location: str | os.PathLike,
    name: str,
    *,
    kind: str = "dataset",
    replace: bool = False,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 5,
) -> Published:
    """:func:`push`, returning what it did (``up_to_date``, the paths uploaded)."""
    check_name(name, subject="entry name")
    _check_kind(kind)
    loc = parse_location(location)
    local = Path(local_dir)
    if local.is_file() and not local.is_symlink():
        found, refused = [(local.name, local)], []
        reason = upload_refusal(local)
        if reason is not None:
            found, refused = [], [(local.name, reason)]
    elif local.is_dir():
        found, refused = scan_folder(local)
    else:
        raise FileNotFoundError(f"nothing to push at {local}: no such file or folder")
    if refused:
        raise IncompleteFileError(_refusal_text(local, name, refused))
    if not found:
        raise IncompleteFileError(f"push {local} -> {name!r}: no files to upload")
    if kind == "policy":
        from torchstore.remote.weights import check_policy_files

        check_policy_files(found, subject=f"push {local} -> {name!r}")
    backend = open_backend(
        loc, timeout=timeout, retries=retries, offline=offline, doing="pushing to"
    )
    files = [_describe(rel, path) for rel, path in found]
    with progress_bar(sum(f.size for f, _ in files), f"push {name}", enabled=progress) as bar:
        published = backend.publish(name, kind, files, replace=replace, progress=bar.update)
    log.info(
        "pushed %r to %s: %d of %d files uploaded",
        name,
        location,
        len(published.uploaded),
        len(files),
    )
    return published


def prune(
    location: str | os.PathLike,
    name: str,
    *,
    keep: int = 1,
    offline: bool | None = None,
    timeout: float = 30.0,
    retries: int = 5,
) -> Pruned:
    """Drop all but the newest ``keep`` revisions of entry ``name`` (``torchstore prune``).

    The index is written first (no reader is ever pointed at a deleted file), then the
    bytes no kept revision uses are deleted where the location can delete (folders,
    fsspec, an HTTP server that allows ``DELETE``); what was not deleted is listed in
    ``Pruned.left`` (no listed revision uses it). Hub repos keep every commit and are
    refused.
    """
    check_name(name, subject="entry name")
    backend = open_backend(
        parse_location(location), timeout=timeout, retries=retries, offline=offline, doing="pruning"
    )
    return backend.prune(name, keep)


def write_index(directory: str | os.PathLike, *, kinds: dict[str, str] | None = None) -> Path:
    """Write ``directory/index.json`` listing every sub-folder as an entry.

    The command line's ``torchstore remote index``.

    An entry is what ``push`` would publish: a sub-folder with at least one file that is
    safe to upload (empty folders are left out, and logged; so are files not safe to
    upload). Entries the existing index lists are kept as listed, with their earlier
    revisions: their files must still be there (a missing or resized one is an error), and
    files in their folder that no listed revision holds are not added (they are logged;
    ``push --replace`` publishes a new revision). Kinds come from ``kinds`` (every name in
    it must be an entry), else the existing index, else ``"policy"`` for folders of
    safetensors only and ``"dataset"`` otherwise.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no folder {directory} to index")
    kinds = dict(kinds or {})
    for kind in kinds.values():
        _check_kind(kind)
    old: dict[str, RemoteEntry] = {}
    if (directory / INDEX_NAME).exists():
        old = parse_index((directory / INDEX_NAME).read_bytes(), source=str(directory / INDEX_NAME))
    entries = []
    notes: list[str] = []  # logged once the index is written: a refusal stays one line
    empty: list[str] = []
    for sub in sorted(
        p
        for p in directory.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    ):
        name = check_name(sub.name, subject=f"folder {sub}")
        if name in old:
            entry = _kept_entry(old[name], sub)
            if name in kinds and kinds[name] != entry.kind:
                entry = _relabelled(entry, kinds[name])
            entries.append(entry)
            continue
        found, refused = scan_folder(sub)
        notes += [f"index {directory}: leaving out {name}/{rel}: {why}" for rel, why in refused]
        if not found:
            notes.append(f"index {directory}: {name}/ has no file to publish; it is not an entry")
            empty.append(f"{name}/")
            continue
        files = tuple(_describe(rel, path)[0] for rel, path in found)
        if name in kinds:
            kind = kinds[name]
        else:
            kind = (
                "policy"
                if files and all(f.path.endswith(".safetensors") for f in files)
                else "dataset"
            )
        entries.append(RemoteEntry(name, kind, files))
    unknown = sorted(set(kinds) - {e.name for e in entries})
    if unknown:
        skipped = f"; not entries, having no file to publish: {', '.join(empty)}" if empty else ""
        raise UnknownEntryError(
            f"--kind names {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} "
            f"not an entry of {directory} (entries: {', '.join(e.name for e in entries) or 'none'}"
            f"{skipped})"
        )
    for note in notes:
        log.warning(note)
    target = directory / INDEX_NAME
    tmp = directory / f".{INDEX_NAME}.tmp-{os.getpid()}"
    tmp.write_bytes(dump_index(entries))
    os.replace(tmp, target)
    return target


def _kept_entry(entry: RemoteEntry, folder: Path) -> RemoteEntry:
    """A listed entry as listed, after checking its folder still holds every listed file."""
    for old in entry.revisions:
        for f in old.files:
            path = folder / f.stored_at
            try:
                size = path.stat().st_size
            except (FileNotFoundError, NotADirectoryError):
                raise StoreFormatError(
                    f"entry {entry.name!r} (revision {old.revision[:12]}) lists {f.path!r}, but "
                    f"{path} is missing; restore it, or push the entry again with --replace"
                ) from None
            if size != f.size:
                raise StoreFormatError(
                    f"entry {entry.name!r} (revision {old.revision[:12]}) lists {f.path!r} with "
                    f"{f.size} bytes, but {path} has {size}; push the entry again with --replace"
                )
    stored = {f.stored_at for old in entry.revisions for f in old.files}
    extra = [
        rel
        for rel, _ in scan_folder(folder)[0]
        if rel not in stored and not rel.startswith(BLOBS + "/")
    ]
    if extra:
        log.warning(
            "index %s: %d file(s) in %s/ are in no listed revision and are left out (%s); "
            "push with --replace to publish them",
            folder.parent,
            len(extra),
            entry.name,
            ", ".join(extra[:5]),
        )
    return entry


def _relabelled(entry: RemoteEntry, kind: str) -> RemoteEntry:
    history = tuple(
        RemoteEntry(h.name, kind, h.files, h.revision, h.updated) for h in entry.history
    )
    return RemoteEntry(
        entry.name, kind, entry.files, entry.revision, entry.updated, history=history
    )
