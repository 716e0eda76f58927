"""What a folder that is not a store holds, told by the marker files of its format.

A store is an HDF5 file, or a folder of them (a store set). A dataset folder of another
format is known by a file that format keeps at a fixed place; nothing else is read:

========== ==========================================================================
format     its marker
========== ==========================================================================
lerobot    ``meta/info.json``
zarr       ``.zgroup`` or ``zarr.json`` (a zarr group)
rlds       ``dataset_info.json`` in the folder or in one folder below it (TFDS)
minari     ``data/metadata.json`` or ``metadata.json`` with Minari's keys
========== ==========================================================================

:func:`not_a_store` is what opening such a folder as a store says: what the folder is and
the command that imports it. ``torchstore import`` sniffs folders by :func:`folder_format`
first (:mod:`torchstore.formats.sniff`).

Examples:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> not_a_store(folder).endswith("is an empty folder: it holds no store")
    True
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["FOLDER_FORMATS", "folder_format", "not_a_store"]

#: the formats :func:`folder_format` knows, with what a message calls them
FOLDER_FORMATS = {
    "lerobot": "a LeRobot dataset",
    "zarr": "a zarr dataset",
    "rlds": "an RLDS (TFDS) dataset",
    "minari": "a Minari dataset",
}


def _is_tfds(path: Path) -> bool:
    """A TFDS folder, or one holding TFDS version folders."""
    if (path / "dataset_info.json").is_file():
        return True
    return any((p / "dataset_info.json").is_file() for p in path.iterdir() if p.is_dir())


def _is_minari(path: Path) -> bool:
    for meta in (path / "data" / "metadata.json", path / "metadata.json"):
        if meta.is_file():
            try:
                keys = json.loads(meta.read_text())
            except (OSError, ValueError):
                return False
            return isinstance(keys, dict) and ("dataset_id" in keys or "minari_version" in keys)
    return False


def folder_format(path: str | os.PathLike) -> str | None:
    """The format whose marker the folder at ``path`` holds (a key of
    :data:`FOLDER_FORMATS`), or None (also for a path that is not a folder)."""
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / "meta" / "info.json").is_file():
        return "lerobot"
    if (path / ".zgroup").is_file() or (path / "zarr.json").is_file():
        return "zarr"
    if _is_tfds(path):
        return "rlds"
    if _is_minari(path):
        return "minari"
    return None


def not_a_store(path: str | os.PathLike, *, empty: bool = True) -> str | None:
    """Why the folder at ``path`` cannot be opened as a store, in one line with the way on:
    a dataset of another format (import it first) or, with ``empty``, an empty folder.
    None for anything else (a file, or a folder that may hold store shards)."""
    path = Path(path)
    found = folder_format(path)
    if found is not None:
        dest = f"{path.resolve().name or 'dataset'}.h5"
        return (
            f"{path} is {FOLDER_FORMATS[found]}, not a store: import it first with "
            f"`torchstore import {path} {dest}`"
        )
    if empty and path.is_dir() and not any(path.iterdir()):
        return f"{path} is an empty folder: it holds no store"
    return None
