"""``torchstore import SRC DEST`` (any format it can tell) and ``torchstore export --to``.

``import`` sniffs the source (:func:`torchstore.formats.sniff.sniff_format`), says which
format it found, imports with a progress bar and prints what it wrote; a source of no
known format is refused with one line naming the formats known. The per-format commands
(``import-lerobot``, ``import-minari``, ...) stay for their format's own options.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from torchstore.cli import args as types

__all__ = ["add_commands"]

EXPORTS = ("robomimic", "zarr", "lerobot", "minari")


def _import_robomimic(a: argparse.Namespace) -> None:
    from torchstore.formats.robomimic import import_robomimic

    import_robomimic(a.source, a.dest, overwrite=a.overwrite, progress=not a.no_progress)


def _import_zarr(a: argparse.Namespace) -> None:
    from torchstore.formats.zarr_import import import_zarr

    import_zarr(a.source, a.dest, overwrite=a.overwrite, progress=not a.no_progress)


def _import_rlds(a: argparse.Namespace) -> None:
    from torchstore.formats.rlds import import_rlds

    split = a.split or "train"
    import_rlds(a.source, a.dest, split=split, overwrite=a.overwrite, progress=not a.no_progress)


def _import_lerobot(a: argparse.Namespace) -> None:
    from torchstore.lerobot import import_lerobot

    import_lerobot(a.source, a.dest, overwrite=a.overwrite, progress=not a.no_progress)


def _import_minari(a: argparse.Namespace) -> None:
    from torchstore.minari import import_minari

    import_minari(a.source, a.dest, overwrite=a.overwrite, progress=not a.no_progress)


def _import_d4rl(a: argparse.Namespace) -> None:
    from torchstore.minari import import_d4rl

    import_d4rl(a.source, a.dest, env_id=a.env_id, overwrite=a.overwrite)


def _import_lafan(a: argparse.Namespace) -> None:
    from torchstore.motion import import_lafan

    import_lafan(a.source, a.dest, overwrite=a.overwrite, progress=not a.no_progress)


IMPORTERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "robomimic": _import_robomimic,
    "d4rl": _import_d4rl,
    "zarr": _import_zarr,
    "rlds": _import_rlds,
    "lerobot": _import_lerobot,
    "minari": _import_minari,
    "lafan": _import_lafan,
}


def _summary(dest: Path) -> str:
    from torchstore.data.store import TrajectoryStore

    with TrajectoryStore(dest) as store:
        return (
            f"wrote {dest}: {store.num_episodes} episodes, {store.num_rows} rows, "
            f"{len(store.columns)} columns"
        )


def _import(a: argparse.Namespace) -> None:
    from torchstore.errors import ArgumentError
    from torchstore.formats.sniff import sniff_format
    from torchstore.io.destination import check_destination

    check_destination(a.dest, sources=[a.source], overwrite=a.overwrite, what="store")
    found = a.format or sniff_format(a.source)
    for flag, value, fmt in (("--split", a.split, "rlds"), ("--env-id", a.env_id, "d4rl")):
        if value is not None and found != fmt:
            raise ArgumentError(f"{flag} applies to {fmt} sources; {a.source} is {found}")
    print(f"reading {a.source} as {found}")
    IMPORTERS[found](a)
    print(_summary(a.dest))


def _export(a: argparse.Namespace) -> None:
    progress = not a.no_progress
    if a.to == "robomimic":
        from torchstore.formats.robomimic_export import export_robomimic

        path = export_robomimic(a.store, a.dest, overwrite=a.overwrite, progress=progress)
    elif a.to == "zarr":
        from torchstore.formats.zarr_export import export_zarr

        path = export_zarr(a.store, a.dest, overwrite=a.overwrite, progress=progress)
    elif a.to == "lerobot":
        from torchstore.lerobot import export_lerobot

        path = export_lerobot(
            a.store, a.dest, fps=a.fps, overwrite=a.overwrite, progress=progress
        ).path
    else:
        from torchstore.minari import export_minari

        path = export_minari(a.store, str(a.dest), root=a.root, progress=progress)
    print(f"wrote {path}")


def add_commands(sub: argparse._SubParsersAction, writes: Callable) -> None:
    """Add ``import`` and ``export``; ``writes(parser, dest)`` records each one's output."""
    from torchstore.formats.sniff import FORMATS

    p = sub.add_parser(
        "import",
        help=f"import a dataset of any known format into a store ({', '.join(FORMATS)})",
    )
    p.add_argument("source", type=types.existing_path, help="the dataset file or folder")
    p.add_argument("dest", type=types.output_file, help="the store file to write")
    p.add_argument(
        "--format", choices=FORMATS, default=None, help="skip sniffing: read SOURCE as this"
    )
    p.add_argument("--split", default=None, help="rlds: the split to import (default: train)")
    p.add_argument("--env-id", default=None, help="d4rl: the env the data comes from")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_import)
    writes(p, "dest")

    p = sub.add_parser("export", help=f"write a store in another format ({', '.join(EXPORTS)})")
    p.add_argument("store", type=types.existing_file, help="the store to export")
    p.add_argument(
        "dest",
        help="the file (robomimic .hdf5, zarr .zarr or .zarr.zip) or folder (lerobot) to "
        "write; for minari, the new dataset's id",
    )
    p.add_argument("--to", choices=EXPORTS, required=True, help="the format to write")
    p.add_argument(
        "--root",
        type=types.output_folder,
        default=None,
        help="minari: the datasets root (default: $MINARI_DATASETS_PATH, else ~/.minari/datasets)",
    )
    p.add_argument(
        "--fps",
        type=types.bounded_int(1, 1000),
        default=None,
        help="lerobot: frames per second (default: the fps a LeRobot import recorded)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_export)
