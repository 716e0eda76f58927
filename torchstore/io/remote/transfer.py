"""What every file transport shares: its errors, its protocol, progress bars, secret hygiene.

Transports (``http.py``, ``folder.py``) move bytes between a base location and local
files. They know nothing about indexes, entries or datasets; ``torchstore.remote`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from torchstore.errors import (
    DeadlineError,
    NoSuchEntryError,
    NoSuchLocationError,
    RemoteNotFoundError,
    TransferError,
)
from torchstore.io.flags import env_flag
from torchstore.io.progress import progress_bar as _progress_bar

__all__ = [
    "TransferError",
    "RemoteNotFoundError",
    "NoSuchLocationError",
    "NoSuchEntryError",
    "DeadlineError",
    "FileClient",
    "Progress",
    "progress_bar",
    "redact",
    "env_flag",
]

#: Called with the number of bytes just moved.
Progress = Callable[[int], None]


class FileClient(Protocol):
    """Byte transport relative to one base location (an HTTP URL, a folder, an fsspec URL)."""

    base: str

    def read_bytes(self, rel: str, *, limit: int) -> tuple[bytes, str | None] | None:
        """``(content, etag)`` of ``rel``, None if it does not exist; refuses > ``limit`` bytes."""

    def download(
        self, rel: str, partial: Path, *, size: int, progress: Progress | None = None
    ) -> None:
        """Append ``rel``'s bytes to ``partial`` from its current length until it holds ``size``."""

    def upload(
        self, src: Path, rel: str, *, progress: Progress | None = None, exclusive: bool = False
    ) -> None:
        """Store ``src`` at ``rel`` so a reader sees the old content or the whole new one;
        ``exclusive``: only if ``rel`` does not exist yet (else ``RemoteChangedError``)."""

    def write_bytes(
        self, rel: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> None:
        """Replace ``rel`` with ``data`` atomically; with ``if_match``, only if it is unchanged;
        with ``if_absent``, only if it is new."""

    def delete(self, rel: str) -> None:
        """Remove ``rel`` (already gone is fine); a server that refuses raises."""


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(total: int, desc: str, *, enabled: bool = True, initial: int = 0):
    """A tqdm bar counting bytes (with the transfer rate), or a no-op if disabled/unavailable."""
    bar = _progress_bar(
        enabled=enabled,
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
    )
    return _NoBar() if bar is None else bar


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every non-empty secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
