"""Which dataset format a path holds, from what lies at it (never from its name alone).

:func:`sniff_format` looks at a file's or folder's own markers, cheaply (a few ``stat``
calls, an HDF5 root listing, a zip's table of contents), so ``torchstore import SRC DEST``
can say what it found before it reads a byte of data:

========== ===========================================================================
format     what marks it
========== ===========================================================================
robomimic  HDF5 with a ``data`` group of ``demo_N`` groups (robomimic, LIBERO, Isaac Lab)
d4rl       HDF5 with top-level ``observations`` and ``actions`` datasets
zarr       a zarr group (``.zgroup`` or ``zarr.json``, folder or ``.zip``) with
           ``data/`` and ``meta/episode_ends`` (diffusion-policy's ReplayBuffer)
rlds       a TFDS folder: ``dataset_info.json`` and ``features.json`` beside TFRecord
           shards (or one version folder below that holds them)
lerobot    a folder with ``meta/info.json``
minari     a folder with ``data/metadata.json`` (or ``metadata.json``) and Minari's keys
lafan      a ``.csv`` file, or a folder of them (LAFAN1 motions retargeted to the G1)
========== ===========================================================================
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from torchstore.errors import DatasetFormatError

__all__ = ["FORMATS", "sniff_format", "rlds_folder"]

#: Every format ``torchstore import`` reads, in the order the table above gives.
FORMATS = ("robomimic", "d4rl", "zarr", "rlds", "lerobot", "minari", "lafan")


def _unknown(path: Path, why: str) -> DatasetFormatError:
    return DatasetFormatError(f"{path}: {why}; torchstore import reads {', '.join(FORMATS)}")


def _hdf5_format(path: Path) -> str | None:
    import h5py

    from torchstore.io.destination import is_store_file

    if is_store_file(path):
        raise DatasetFormatError(f"{path} is already a torchstore store; nothing to import")
    try:
        with h5py.File(path, "r") as f:
            data = f.get("data")
            if isinstance(data, h5py.Group) and any(
                name.startswith("demo") and isinstance(g, h5py.Group) for name, g in data.items()
            ):
                return "robomimic"
            if isinstance(f.get("observations"), h5py.Dataset) and isinstance(
                f.get("actions"), h5py.Dataset
            ):
                return "d4rl"
    except OSError as exc:
        raise DatasetFormatError(
            f"{path}: an HDF5 file that cannot be opened (truncated or damaged?): {exc}"
        ) from None
    return None


def _zip_format(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            names = {n.rstrip("/") for n in z.namelist()}
    except (zipfile.BadZipFile, OSError) as exc:
        raise DatasetFormatError(f"{path}: a zip file that cannot be read: {exc}") from None
    root = ".zgroup" in names or "zarr.json" in names
    ends = any(n.startswith("meta/episode_ends/") or n == "meta/episode_ends" for n in names)
    return "zarr" if root and ends else None


def rlds_folder(path: Path) -> Path | None:
    """The TFDS version folder at ``path`` or one level below it, or None."""

    def marked(folder: Path) -> bool:
        return (folder / "dataset_info.json").is_file() and (folder / "features.json").is_file()

    if marked(path):
        return path
    below = [p for p in sorted(path.iterdir()) if p.is_dir() and marked(p)]
    return below[0] if len(below) == 1 else None


def _is_minari(path: Path) -> bool:
    for meta in (path / "data" / "metadata.json", path / "metadata.json"):
        if meta.is_file():
            try:
                keys = json.loads(meta.read_text())
            except (OSError, ValueError):
                return False
            return isinstance(keys, dict) and ("dataset_id" in keys or "minari_version" in keys)
    return False


def _folder_format(path: Path) -> str | None:
    if (path / "meta" / "info.json").is_file():
        return "lerobot"
    if ((path / ".zgroup").is_file() or (path / "zarr.json").is_file()) and (
        path / "meta" / "episode_ends"
    ).exists():
        return "zarr"
    if rlds_folder(path) is not None:
        return "rlds"
    if _is_minari(path):
        return "minari"
    if any(path.glob("*.csv")):
        return "lafan"
    return None


def sniff_format(source: str | os.PathLike) -> str:
    """The format of the dataset at ``source``: one of :data:`FORMATS`.

    Raises:
        DatasetFormatError: nothing is at ``source``, it is already a store, or it is none
            of the formats (one line naming the formats known).
    """
    import h5py  # here, not at the top: `torchstore --help` lists FORMATS without h5py

    path = Path(source)
    if not path.exists():
        raise DatasetFormatError(f"{path}: no such file or folder")
    if path.is_dir():
        found = _folder_format(path)
    elif h5py.is_hdf5(path):
        found = _hdf5_format(path)
    elif zipfile.is_zipfile(path):
        found = _zip_format(path)
    elif path.suffix.lower() == ".csv":
        found = "lafan"
    else:
        found = None
    if found is None:
        kind = "a folder" if path.is_dir() else "a file"
        raise _unknown(path, f"{kind} of no format torchstore knows")
    return found
