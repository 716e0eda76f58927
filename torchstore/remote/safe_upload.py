"""The one rule for "is this file complete, so it may be uploaded?".

A recording in progress has finished files next to files being written. ``push`` and
``sync_recording`` upload a file only if :func:`is_safe_to_upload` says so. The rule, in
the order it is checked:

1. **A regular file**, not a symlink (a symlink could point anywhere: ``~/.ssh``), a
   folder, a FIFO or a socket.
2. **Not scratch or lock state** by name, and not under a hidden folder: ``*.tmp*``,
   ``.*.tmp-*``, ``*.lock``, ``*.partial``, ``*.incomplete``, ``*.part``, ``*.swp``,
   ``*~``, or any path with a segment starting with ``.`` (``.cache/``, ``.git/``).
3. **Not claimed by a lock file**: ``X`` is skipped while ``X.lock`` exists next to it.
4. **Not modified in the last** ``min_age_s`` seconds (default 0: off; writers that write
   in place without locks or temporary names can be caught with a settle time).
5. **Structurally complete** for the formats whose end can be checked cheaply:
   Parquet (``PAR1`` at both ends, footer length inside the file), MP4/MOV (top-level
   boxes tile the file exactly and include ``moov``; a box of size 0 — "to the end",
   what a writer leaves before it finalises — fails), safetensors (header parses, data
   ends exactly at the end of the file), JSON (parses), JSONL (ends with a newline).
6. **HDF5 stores only when no writer holds them.** Copying a store while a writer
   appends can give an inconsistent copy (a half-flushed B-tree or commit record), so
   a ``.h5``/``.hdf5`` file is safe only if its superblock's consistency flags say no
   writer has it open (superblock v2/v3, what torchstore writes: a SWMR writer sets them
   and clears them on close, and it does *not* keep a file lock), or, for older
   superblocks, if a shared ``flock`` can be taken (a non-SWMR writer holds an exclusive
   one). A store whose writer was killed keeps its flags set and stays unsafe until a
   writer resumes and closes it; the writer lock (``torchstore.io.hdf5.writer_lock``) tells
   the two apart: a live writer holds it, a dead one left its sidecar behind unheld
   (:data:`DEAD_WRITER_STORE`). ``sync_recording`` uploads either as a snapshot of its
   committed episodes instead (see ``torchstore.remote.recording``).

Rule 6 reads 12 bytes, or takes and drops a shared lock for a moment; it never opens the
store with HDF5 and never modifies it.

Examples:
    >>> is_safe_to_upload("recording/meta/info.json.tmp-123")
    False
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import stat
import struct
import time
from pathlib import Path

__all__ = ["is_safe_to_upload", "upload_refusal", "is_scratch", "LIVE_STORE", "DEAD_WRITER_STORE"]

#: The refusal reason for an HDF5 store a writer has open (``sync_recording`` snapshots these).
LIVE_STORE = "an HDF5 store a writer has open"
#: The refusal reason for a store left open by a writer that died (snapshotted too).
DEAD_WRITER_STORE = "an HDF5 store whose writer died before closing it"

_SCRATCH = ("*.tmp*", ".*.tmp-*", "*.lock", "*.partial", "*.incomplete", "*.part", "*.swp", "*~")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_MAX_JSON_CHECK = 64 << 20


def is_scratch(rel: str) -> bool:
    """True for lock, temporary and hidden paths (rule 2): never uploaded, never reported."""
    parts = rel.replace(os.sep, "/").split("/")
    if any(p.startswith(".") for p in parts):
        return True
    return any(fnmatch.fnmatchcase(parts[-1], pattern) for pattern in _SCRATCH)


def is_safe_to_upload(
    path: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    min_age_s: float = 0.0,
    now: float | None = None,
) -> bool:
    """True if ``path`` is a complete file that may be uploaded (see the module rule).

    Args:
        path: the file.
        root: the folder being uploaded; the hidden-folder rule applies to the folders
            between ``root`` and ``path`` (without ``root``, only to the file's name).
        min_age_s: also refuse files modified less than this many seconds ago.
        now: the clock for ``min_age_s`` (``time.time()`` by default).
    """
    return upload_refusal(path, root=root, min_age_s=min_age_s, now=now) is None


def upload_refusal(
    path: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    min_age_s: float = 0.0,
    now: float | None = None,
) -> str | None:
    """Why ``path`` is not safe to upload (see :func:`is_safe_to_upload`), or ``None``."""
    path = Path(path)
    rel = os.path.relpath(path, root) if root is not None else path.name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist (any more)"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink (never followed)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if is_scratch(rel):
        return "a lock, temporary or hidden file"
    if path.with_name(path.name + ".lock").exists():
        return f"claimed by {path.name}.lock"
    if min_age_s > 0 and (now if now is not None else time.time()) - st.st_mtime < min_age_s:
        return f"modified less than {min_age_s:g} s ago"
    check = _FORMAT_CHECKS.get(path.suffix.lower())
    return check(path, st.st_size) if check is not None else None


# --------------------------------------------------------------------- format checks
def _read_at(path: Path, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _parquet(path: Path, size: int) -> str | None:
    if size < 12 or _read_at(path, 0, 4) != b"PAR1":
        return "not a complete Parquet file (no leading PAR1)"
    tail = _read_at(path, size - 8, 8)
    if tail[4:] != b"PAR1":
        return "an incomplete Parquet file (no trailing PAR1 footer)"
    if struct.unpack("<I", tail[:4])[0] > size - 12:
        return "an incomplete Parquet file (footer longer than the file)"
    return None


def _mp4(path: Path, size: int) -> str | None:
    offset, seen = 0, set()
    with open(path, "rb") as f:
        while offset < size:
            f.seek(offset)
            head = f.read(16)
            if len(head) < 8:
                return "an incomplete MP4 (a truncated box header)"
            box, kind = struct.unpack(">I", head[:4])[0], head[4:8]
            if box == 1:
                if len(head) < 16:
                    return "an incomplete MP4 (a truncated box header)"
                box = struct.unpack(">Q", head[8:16])[0]
            if box == 0:
                return f"an unfinalised MP4 (box {kind!r} runs to the end of the file)"
            if box < 8 or offset + box > size:
                return f"an incomplete MP4 (box {kind!r} extends past the end of the file)"
            seen.add(kind)
            offset += box
    return None if b"moov" in seen else "an unfinalised MP4 (no moov box yet)"


def _safetensors(path: Path, size: int) -> str | None:
    if size < 8:
        return "an incomplete safetensors file (no header length)"
    n = struct.unpack("<Q", _read_at(path, 0, 8))[0]
    if n > size - 8 or n > 100 << 20:
        return "an incomplete safetensors file (header longer than the file)"
    try:
        header = json.loads(_read_at(path, 8, n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "an incomplete safetensors file (header does not parse)"
    if 8 + n + max(ends, default=0) != size:
        return "an incomplete safetensors file (data does not end at the end of the file)"
    return None


def _json(path: Path, size: int) -> str | None:
    if size > _MAX_JSON_CHECK:
        return None
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return "JSON that does not parse (still being written?)"
    return None


def _jsonl(path: Path, size: int) -> str | None:
    if size and _read_at(path, size - 1, 1) != b"\n":
        return "JSON lines whose last line is unfinished"
    return None


def _hdf5(path: Path, size: int) -> str | None:
    offset = 0
    while offset + 16 <= size:  # the superblock sits at 0, 512, 1024, 2048, ...
        head = _read_at(path, offset, 16)
        if head[:8] == _HDF5_SIGNATURE:
            break
        offset = 512 if offset == 0 else offset * 2
    else:
        return "not an HDF5 file (no superblock; still being created?)"
    if head[8] >= 2:
        if not head[11] & 0b101:
            return None
        from torchstore.io.hdf5.writer_lock import live_writer, lock_path

        # a locking writer leaves its sidecar behind only when it dies; without a sidecar
        # the writer did not lock (an older or foreign one) and may well be alive
        if lock_path(path).exists() and live_writer(path) is None:
            return DEAD_WRITER_STORE
        return LIVE_STORE
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        return LIVE_STORE
    finally:
        os.close(fd)
    return None


_FORMAT_CHECKS = {
    ".parquet": _parquet,
    ".mp4": _mp4,
    ".m4v": _mp4,
    ".mov": _mp4,
    ".safetensors": _safetensors,
    ".json": _json,
    ".jsonl": _jsonl,
    ".h5": _hdf5,
    ".hdf5": _hdf5,
}
