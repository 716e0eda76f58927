"""Push a local folder (dataset, asset pack, policy weights) as one entry; write a folder's index.

``push`` uploads the files the remote does not already hold byte for byte, then makes
the entry visible (``index.json`` written last, or one Hub commit). The entry then lists
exactly the local files; files it listed before and no longer does are dropped from the
index (an index location keeps their bytes; the Hub commit deletes them).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from torchstore.errors import TorchstoreError
from torchstore.io.checksum import sha256_file
from torchstore.io.paths import check_name
from torchstore.io.transfer import progress_bar
from torchstore.remote.backend import open_backend
from torchstore.remote.index import (
    INDEX_NAME,
    EntryKind,
    RemoteEntry,
    RemoteFile,
    dump_index,
    parse_index,
)
from torchstore.remote.location import parse_location
from torchstore.remote.safe_upload import is_scratch, upload_refusal

__all__ = ["push", "write_index", "IncompleteFileError", "scan_folder"]

log = logging.getLogger(__name__)


class IncompleteFileError(TorchstoreError, ValueError):
    """A file that is meant to be uploaded is not complete (or not a regular file)."""


def _check_kind(kind: str) -> str:
    kinds = [k.value for k in EntryKind]
    if kind not in kinds:
        raise ValueError(f"kind ({kind!r}) must be one of {kinds}")
    return kind


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
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 5,
) -> RemoteEntry:
    """Upload ``local_dir`` (or a single file) as entry ``name``; returns the published entry.

    Every file must pass :func:`~torchstore.remote.is_safe_to_upload` (scratch, lock and
    hidden files are skipped); for a recording still being written use
    :func:`~torchstore.remote.sync_recording`.

    Raises:
        IncompleteFileError: a file is being written, is a symlink, or is not complete.

    Examples:
        >>> push("out/pusht", "http://127.0.0.1:8000/data", "pusht-demo")  # doctest: +SKIP
    """
    check_name(name, subject="entry name")
    _check_kind(kind)
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
        listed = "; ".join(f"{rel!r}: {reason}" for rel, reason in refused[:5])
        raise IncompleteFileError(
            f"push {local} -> {name!r}: {len(refused)} file(s) are not safe to upload ({listed}); "
            "finish or remove them, or use sync_recording for a recording in progress"
        )
    if not found:
        raise IncompleteFileError(f"push {local} -> {name!r}: no files to upload")
    files = [_describe(rel, path) for rel, path in found]
    backend = open_backend(parse_location(location), timeout=timeout, retries=retries)
    with progress_bar(sum(f.size for f, _ in files), f"push {name}", enabled=progress) as bar:
        published = backend.publish(name, kind, files, replace=True, progress=bar.update)
    log.info(
        "pushed %r to %s: %d of %d files uploaded",
        name,
        location,
        len(published.uploaded),
        len(files),
    )
    return published.entry


def write_index(directory: str | os.PathLike, *, kinds: dict[str, str] | None = None) -> Path:
    """Write ``directory/index.json`` listing every sub-folder as an entry (``torchstore remote index``).

    Kinds come from ``kinds``, else the existing index, else ``"policy"`` for folders of
    safetensors only and ``"dataset"`` otherwise. Files that are not safe to upload are
    left out (and logged).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no folder {directory} to index")
    old: dict[str, RemoteEntry] = {}
    if (directory / INDEX_NAME).exists():
        old = parse_index((directory / INDEX_NAME).read_bytes(), source=str(directory / INDEX_NAME))
    entries = []
    for sub in sorted(
        p
        for p in directory.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    ):
        name = check_name(sub.name, subject=f"folder {sub}")
        found, refused = scan_folder(sub)
        for rel, reason in refused:
            log.warning("index %s: leaving out %s/%s: %s", directory, name, rel, reason)
        files = tuple(_describe(rel, path)[0] for rel, path in found)
        if kinds and name in kinds:
            kind = _check_kind(kinds[name])
        elif name in old:
            kind = old[name].kind
        else:
            kind = (
                "policy"
                if files and all(f.path.endswith(".safetensors") for f in files)
                else "dataset"
            )
        entries.append(RemoteEntry(name, kind, files))
    target = directory / INDEX_NAME
    tmp = directory / f".{INDEX_NAME}.tmp-{os.getpid()}"
    tmp.write_bytes(dump_index(entries))
    os.replace(tmp, target)
    return target
