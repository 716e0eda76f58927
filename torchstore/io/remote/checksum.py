"""File checksums: SHA-256 (what indexes declare) and the git blob SHA-1 (a Hub file's oid).

Examples:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x"
    >>> _ = p.write_bytes(b"abc")
    >>> sha256_file(p)[:16]
    'ba7816bf8f01cfea'
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from torchstore.errors import IntegrityError

__all__ = ["sha256_file", "git_blob_sha1_file", "verify_file", "is_sha256", "is_sha1"]

_CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")


def is_sha256(value: object) -> bool:
    """True for 64 lowercase hex characters."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def is_sha1(value: object) -> bool:
    """True for 40 lowercase hex characters."""
    return isinstance(value, str) and _SHA1.fullmatch(value) is not None


def _digest(path: Path, h) -> str:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, as 64 lowercase hex characters."""
    return _digest(Path(path), hashlib.sha256())


def git_blob_sha1_file(path: str | os.PathLike) -> str:
    """The git blob id of a file: ``sha1(b"blob <size>\\0" + bytes)`` (a Hub regular file's oid)."""
    path = Path(path)
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % path.stat().st_size)
    return _digest(path, h)


def verify_file(
    path: str | os.PathLike,
    *,
    size: int,
    sha256: str | None = None,
    blob_sha1: str | None = None,
    subject: str = "file",
) -> None:
    """Raise :class:`IntegrityError` unless ``path`` has ``size`` bytes and the given digest.

    ``sha256`` is preferred; ``blob_sha1`` (git blob id) is the fallback for Hub files that
    come with no SHA-256. One of them is required.
    """
    path = Path(path)
    got = path.stat().st_size
    if got != size:
        rule = "larger than" if got > size else "smaller than"
        raise IntegrityError(f"{subject}: received {got} bytes, {rule} the {size} bytes declared")
    if sha256 is not None:
        actual = sha256_file(path)
        if actual != sha256:
            raise IntegrityError(f"{subject}: sha256 mismatch, expected {sha256}, got {actual}")
    elif blob_sha1 is not None:
        actual = git_blob_sha1_file(path)
        if actual != blob_sha1:
            raise IntegrityError(
                f"{subject}: git blob sha1 mismatch, expected {blob_sha1}, got {actual}"
            )
    else:
        raise IntegrityError(
            f"{subject}: no sha256 or git blob sha1 is declared, so it cannot be verified"
        )
