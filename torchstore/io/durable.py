"""Durable renames: a folder's entries fsynced, so a name moved into it survives a crash.

A rename (or a new file) is durable only once the folder holding the name is fsynced
too; an fsync of the file itself keeps its bytes, not its name.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["fsync_folder"]


def fsync_folder(folder: str | os.PathLike, *, best_effort: bool = False) -> None:
    """fsync ``folder`` itself (its entries: the names renamed or created in it).

    Args:
        folder: the folder.
        best_effort: ignore an ``OSError`` (some filesystems refuse to fsync a folder);
            otherwise it propagates.
    """
    with contextlib.suppress(OSError) if best_effort else contextlib.nullcontext():
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
