"""Safe paths for names that come from an untrusted source (a remote index, a repo listing).

A remote says "write ``data/x.parquet``"; these checks make sure that can only ever mean a
file *inside* the destination folder: no absolute paths, no ``..``, no empty or ``.``
segments, no backslashes or control characters, and no symlink on the way (a symlink
planted in the cache must never redirect a write outside it).

Examples:
    >>> check_relpath("data/chunk-000/file-000.parquet")
    'data/chunk-000/file-000.parquet'
    >>> check_relpath("../etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    torchstore.errors.UnsafePathError: path '../etc/passwd' must stay inside its folder: ...
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from torchstore.errors import UnsafePathError

__all__ = ["check_relpath", "check_name", "resolve_inside", "make_dirs_inside", "MAX_PATH_CHARS"]

MAX_PATH_CHARS = 1024
_MAX_SEGMENT_BYTES = 255
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DRIVE = re.compile(r"[A-Za-z]:")


def check_relpath(path: object, *, subject: str = "path") -> str:
    """Return ``path`` if it is a clean relative POSIX path, else raise :class:`UnsafePathError`.

    Args:
        path: the untrusted path, as given by the remote.
        subject: what the path is, for the message (``"file of entry 'x'"``).
    """
    if not isinstance(path, str):
        raise UnsafePathError(f"{subject} must be a string, got {type(path).__name__}")
    shown = repr(path[:200])
    if not path:
        raise UnsafePathError(f"{subject} must not be empty")
    if len(path) > MAX_PATH_CHARS:
        raise UnsafePathError(
            f"{subject} {shown}... is {len(path)} characters; at most {MAX_PATH_CHARS} allowed"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise UnsafePathError(f"{subject} {shown} must not contain control characters")
    if "\\" in path:
        raise UnsafePathError(
            f"{subject} {shown} must use '/' separators: backslashes are not allowed"
        )
    if path.startswith("/") or _DRIVE.match(path):
        raise UnsafePathError(
            f"{subject} {shown} must be relative to its folder: absolute paths are not allowed"
        )
    for segment in path.split("/"):
        if segment == "..":
            raise UnsafePathError(
                f"{subject} {shown} must stay inside its folder: '..' segments are not allowed"
            )
        if segment in ("", "."):
            raise UnsafePathError(f"{subject} {shown} must not have empty or '.' segments")
        if len(segment.encode()) > _MAX_SEGMENT_BYTES:
            raise UnsafePathError(
                f"{subject} {shown} has a segment longer than {_MAX_SEGMENT_BYTES} bytes"
            )
    return path


def check_name(name: object, *, subject: str = "name") -> str:
    """Return ``name`` if it is a plain entry name (``[A-Za-z0-9][A-Za-z0-9._-]*``, <= 128)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise UnsafePathError(
            f"{subject} ({name!r}) must be 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _refuse_symlinks(root: Path, rel: str, *, subject: str) -> Path:
    """``root / rel`` after checking that no existing component below ``root`` is a symlink."""
    current = root
    for segment in rel.split("/"):
        current = current / segment
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISLNK(mode):
            raise UnsafePathError(
                f"{subject} {rel!r} passes through a symlink ({current}); symlinks inside "
                f"{root} are never followed"
            )
    return current


def resolve_inside(root: str | os.PathLike, rel: str, *, subject: str = "path") -> Path:
    """The path of ``rel`` inside ``root``, refusing anything that would land outside it.

    ``rel`` is checked with :func:`check_relpath`; every existing component below ``root``
    must be a real file or folder (not a symlink), and the resolved path must stay under
    the resolved ``root``.
    """
    root = Path(root)
    check_relpath(rel, subject=subject)
    target = _refuse_symlinks(root, rel, subject=subject)
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise UnsafePathError(f"{subject} {rel!r} resolves to {real}, outside {real_root}")
    return target


def make_dirs_inside(root: str | os.PathLike, rel_dir: str, *, subject: str = "path") -> Path:
    """Create the folder ``rel_dir`` under ``root`` one segment at a time, never via a symlink."""
    root = Path(root)
    target = resolve_inside(root, rel_dir, subject=subject)
    current = root
    for segment in rel_dir.split("/"):
        current = current / segment
        try:
            current.mkdir()
        except FileExistsError:
            mode = os.lstat(current).st_mode
            if not stat.S_ISDIR(mode):
                raise UnsafePathError(
                    f"{subject} {rel_dir!r} needs {current} to be a folder, but it is a "
                    f"{'symlink' if stat.S_ISLNK(mode) else 'file'}"
                ) from None
    return target
