"""Which dataset format a path holds, from what lies at it (never from its name alone).

:func:`sniff_format` looks at a file's or folder's own markers, cheaply (a few ``stat``
calls, an HDF5 root listing, a zip's table of contents), so ``torchstore import SRC DEST``
can say what it found before it reads a byte of data. A source with a format's marker but
not the rest (a ``data`` group without demos, a zarr without ``meta/episode_ends``) is
sniffed as that format, so its importer names what is missing:

========== ===========================================================================
format     what marks it
========== ===========================================================================
robomimic  HDF5 with a ``data`` group (of ``demo_N`` groups: robomimic, LIBERO, Isaac Lab)
d4rl       HDF5 with top-level ``observations`` and ``actions`` datasets
zarr       a zarr group (``.zgroup`` or ``zarr.json``): a folder, a ``.zip`` of one, or a
           zip holding one such folder (diffusion-policy's ReplayBuffer)
rlds       a TFDS folder (``dataset_info.json``), or a folder of TFDS version folders
lerobot    a folder with ``meta/info.json``
minari     a folder with ``data/metadata.json`` (or ``metadata.json``) and Minari's keys
lafan      a ``.csv`` file, or a folder of them, every one starting with rows of the 36
           numbers of LAFAN1's G1 layout (:mod:`torchstore.motion.lafan_probe`)
========== ===========================================================================

The folder markers of lerobot, zarr, rlds and minari are
:func:`torchstore.io.dataset_folders.folder_format`'s, which opening such a folder as a
store also reads to say what it is. A source that matches none of these is refused as of
no known format: sniffing claims a format only on its markers (a folder of unrelated CSV
files is not LAFAN1).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from torchstore.errors import DatasetFormatError
from torchstore.io.dataset_folders import folder_format

__all__ = ["FORMATS", "sniff_format", "rlds_folder"]

#: Every format ``torchstore import`` reads, in the order the table above gives.
FORMATS = ("robomimic", "d4rl", "zarr", "rlds", "lerobot", "minari", "lafan")
_HDF5_SUFFIXES = (".hdf5", ".h5", ".he5", ".hdf")


def _unknown(path: Path, why: str) -> DatasetFormatError:
    return DatasetFormatError(f"{path}: {why}; torchstore import reads {', '.join(FORMATS)}")


def _hdf5_format(path: Path) -> str | None:
    import h5py

    from torchstore.io.destination import is_store_file

    if is_store_file(path):
        raise DatasetFormatError(f"{path} is already a torchstore store; nothing to import")
    try:
        with h5py.File(path, "r") as f:
            if isinstance(f.get("data"), h5py.Group):
                return "robomimic"  # (its importer says what is wrong with the demos)
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
    roots = {n.rsplit("/", 1)[0] if "/" in n else "" for n in names if _is_zarr_root(n)}
    # a zarr at the zip's top (zarr's ZipStore) or in one folder of it (a zipped .zarr)
    return "zarr" if "" in roots or len({r for r in roots if "/" not in r}) == 1 else None


def _is_zarr_root(name: str) -> bool:
    return name.rsplit("/", 1)[-1] in (".zgroup", "zarr.json")


def rlds_folder(path: Path) -> Path | None:
    """The TFDS version folder at ``path`` or one level below it, or None."""

    def marked(folder: Path) -> bool:
        return (folder / "dataset_info.json").is_file() and (folder / "features.json").is_file()

    if marked(path):
        return path
    below = [p for p in sorted(path.iterdir()) if p.is_dir() and marked(p)]
    return below[0] if len(below) == 1 else None


def _folder_format(path: Path) -> str | None:
    found = folder_format(path)  # lerobot, zarr, rlds, minari: by their marker files
    if found is not None:
        return found  # (each importer says what is missing besides its marker)
    from torchstore.motion.lafan_probe import csv_files

    if csv_files(path):
        return _lafan_or_why(path)
    return None


def _lafan_or_why(path: Path) -> str:
    """``"lafan"`` when every CSV at ``path`` has the G1 layout; else a refusal naming why
    (an unrelated CSV is no LAFAN1 file with a bad column count)."""
    from torchstore.motion.lafan_probe import not_lafan

    why = not_lafan(path)
    if why is None:
        return "lafan"
    kind = "a folder" if path.is_dir() else "a file"
    raise _unknown(
        path,
        f"{kind} of no format torchstore knows (not LAFAN1's 36-column G1 CSV layout: {why})",
    )


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
    elif path.suffix.lower() in _HDF5_SUFFIXES:
        raise DatasetFormatError(
            f"{path}: not readable HDF5 (empty, truncated or damaged?); "
            f"torchstore import reads {', '.join(FORMATS)}"
        )
    elif path.suffix.lower() == ".zip":
        raise DatasetFormatError(f"{path}: not a readable zip file (empty, truncated or damaged?)")
    elif path.suffix.lower() == ".csv":
        found = _lafan_or_why(path)
    else:
        found = None
    if found is None:
        kind = "a folder" if path.is_dir() else "a file"
        raise _unknown(path, f"{kind} of no format torchstore knows")
    return found
