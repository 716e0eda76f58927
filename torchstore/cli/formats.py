"""``torchstore import SRC DEST`` (any format, sniffed or named) and ``torchstore export --to``.

``import`` sniffs the source (:func:`torchstore.formats.sniff.sniff_format`) unless
``--format`` names it, says which format it reads, imports with a progress bar and prints
what it wrote; a source of no known format is refused with one line naming the formats
known. Each format's own options (``--episodes`` for LeRobot, ``--quat-order`` for LAFAN1,
...) are options of ``import`` and ``export`` that apply to that format only; one given for
another format is refused. The per-format commands of earlier releases (``import-lerobot``,
``export-minari``, ...) still run, as older spellings of the same two commands: they are
listed once in ``torchstore --help``'s epilog, not as commands of their own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from torchstore.cli import args as types

__all__ = ["EXPORTS", "OLDER_SPELLINGS", "add_commands"]

EXPORTS = ("robomimic", "zarr", "lerobot", "minari")

#: older spelling -> what it means today
OLDER_SPELLINGS = {
    "import-lerobot": "import --format lerobot",
    "import-minari": "import --format minari",
    "import-d4rl": "import --format d4rl",
    "import-lafan": "import --format lafan",
    "export-lerobot": "export --to lerobot",
    "export-minari": "export --to minari",
}

#: formats whose source may be a dataset id (``user/name`` on the Hub, ``namespace/name-v0``
#: in Minari's root) instead of a path
_BY_ID = ("lerobot", "minari")
#: importers that check DEST themselves (LAFAN1: against its CSV files, not their folder, so a
#: store may sit next to them; and not when resuming)
_CHECKS_ITS_DESTINATION = ("lafan", "lerobot")


def source_or_id(text: str) -> Path | str:
    """An input that exists, else the text as given: a dataset id (``user/name``) for the
    formats that take one. ``_import`` refuses the text for the others, and the LeRobot and
    Minari importers say themselves why a text is neither a folder nor an id they know."""
    path = Path(text)
    return path if path.exists() else text


source_or_id.__name__ = "path or dataset id"


# ---------------------------------------------------------------- importers
def _progress(a: argparse.Namespace) -> bool:
    return not a.no_progress


def _import_robomimic(a: argparse.Namespace) -> None:
    from torchstore.formats.robomimic import import_robomimic

    import_robomimic(a.source, a.dest, overwrite=a.overwrite, progress=_progress(a))


def _import_zarr(a: argparse.Namespace) -> None:
    from torchstore.formats.zarr_import import import_zarr

    import_zarr(a.source, a.dest, overwrite=a.overwrite, progress=_progress(a))


def _import_rlds(a: argparse.Namespace) -> None:
    from torchstore.formats.rlds import import_rlds

    split = a.split or "train"
    images = "decode" if a.decode_images else "keep"
    import_rlds(
        a.source, a.dest, split=split, overwrite=a.overwrite, progress=_progress(a), images=images
    )


def _import_lerobot(a: argparse.Namespace) -> object:
    from torchstore.lerobot import import_lerobot  # checks the destination itself

    return import_lerobot(
        a.source,
        a.dest,
        episodes=a.episodes,
        columns=a.columns,
        revision=a.revision,
        include_rejected=a.include_rejected,
        overwrite=a.overwrite,
        video=a.video or "packets",
        progress=_progress(a),
    )


def _import_minari(a: argparse.Namespace) -> None:
    from torchstore.minari import import_minari

    import_minari(str(a.source), a.dest, overwrite=a.overwrite, progress=_progress(a))


def _import_d4rl(a: argparse.Namespace) -> None:
    from torchstore.minari import import_d4rl

    import_d4rl(a.source, a.dest, env_id=a.env_id, overwrite=a.overwrite)


def _import_lafan(a: argparse.Namespace) -> None:
    from torchstore.motion import import_lafan

    import_lafan(
        a.source,
        a.dest,
        fps=a.fps,
        quat_order=a.quat_order or "wxyz",
        overwrite=a.overwrite,
        resume=getattr(a, "resume", False),
        progress=_progress(a),
    )


#: each importer; one that returns a summary of its own has it printed in place of the store's
IMPORTERS: dict[str, Callable[[argparse.Namespace], object]] = {
    "robomimic": _import_robomimic,
    "d4rl": _import_d4rl,
    "zarr": _import_zarr,
    "rlds": _import_rlds,
    "lerobot": _import_lerobot,
    "minari": _import_minari,
    "lafan": _import_lafan,
}

#: (flag, argparse dest, the formats it applies to): refused for any other format
_IMPORT_ONLY = (
    ("--split", "split", ("rlds",)),
    ("--decode-images", "decode_images", ("rlds",)),
    ("--env-id", "env_id", ("d4rl",)),
    ("--episodes", "episodes", ("lerobot",)),
    ("--columns", "columns", ("lerobot",)),
    ("--revision", "revision", ("lerobot",)),
    ("--include-rejected", "include_rejected", ("lerobot",)),
    ("--video", "video", ("lerobot",)),
    ("--fps", "fps", ("lafan",)),
    ("--quat-order", "quat_order", ("lafan",)),
    ("--resume", "resume", ("lafan",)),
)
_EXPORT_ONLY = (
    ("--root", "root", ("minari",)),
    ("--data-format", "data_format", ("minari",)),
    ("--fps", "fps", ("lerobot",)),
    ("--task", "task", ("lerobot",)),
    ("--robot-type", "robot_type", ("lerobot",)),
    ("--columns", "columns", ("lerobot",)),
    ("--cameras", "cameras", ("lerobot",)),
    ("--codec", "codec", ("lerobot",)),
)


def _refuse_others(a: argparse.Namespace, table, found: str, what: str) -> None:
    from torchstore.errors import ArgumentError

    for flag, dest, formats in table:
        value = getattr(a, dest, None)
        if value not in (None, False) and found not in formats:
            raise ArgumentError(f"{flag} applies to {' and '.join(formats)} {what}; {found} given")


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

    if isinstance(a.source, str):  # no such path: a dataset id, or a mistake
        if a.format not in _BY_ID:
            raise ArgumentError(
                f"no such file or folder: {a.source} (a dataset id needs --format lerobot or "
                "--format minari)"
            )
        found = a.format
    else:
        found = a.format or sniff_format(a.source)
        if found not in _CHECKS_ITS_DESTINATION:
            check_destination(a.dest, sources=[a.source], overwrite=a.overwrite, what="store")
    _refuse_others(a, _IMPORT_ONLY, found, "sources")
    if a.format is None:  # say what sniffing found
        print(f"reading {a.source} as {found}")
    said = IMPORTERS[found](a)
    print(said if said is not None else _summary(a.dest))


def _export(a: argparse.Namespace) -> None:
    _refuse_others(a, _EXPORT_ONLY, a.to, "exports")
    progress = _progress(a)
    if a.to == "robomimic":
        from torchstore.formats.robomimic_export import export_robomimic

        path = export_robomimic(a.store, a.dest, overwrite=a.overwrite, progress=progress)
    elif a.to == "zarr":
        from torchstore.formats.zarr_export import export_zarr

        path = export_zarr(a.store, a.dest, overwrite=a.overwrite, progress=progress)
    elif a.to == "lerobot":
        from torchstore.lerobot import export_lerobot

        said = export_lerobot(
            a.store,
            a.dest,
            fps=a.fps,
            task=a.task,
            robot_type=a.robot_type,
            columns=a.columns,
            cameras=a.cameras,
            video_encoder=a.codec,  # None: stored packets as they are, others AV1
            overwrite=a.overwrite,
            progress=progress,
        )
        print(said)  # its own summary: episodes, frames, rate
        return
    else:
        from torchstore.minari import export_minari

        path = export_minari(
            a.store,
            str(a.dest),
            root=a.root,
            data_format=a.data_format or "hdf5",
            progress=progress,
        )
    print(f"wrote {path}")


# ---------------------------------------------------------------- arguments
def _import_options(p: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """The options of ``import`` that apply to ``formats`` (an older spelling: its own)."""
    if "rlds" in formats:
        p.add_argument("--split", default=None, help="rlds: the split to import (default: train)")
        p.add_argument(
            "--decode-images",
            action="store_true",
            help="rlds: decode image features to raw frames (default: keep their JPEG / PNG "
            "bytes as they are, in encoded columns)",
        )
    if "d4rl" in formats:
        p.add_argument("--env-id", default=None, help="d4rl: the env the data comes from")
    if "lerobot" in formats:
        p.add_argument(
            "--episodes",
            type=types.non_negative_int,
            nargs="+",
            default=None,
            help="lerobot: episode indices (default: all)",
        )
        p.add_argument(
            "--columns", nargs="+", default=None, help="lerobot: feature names (default: all)"
        )
        p.add_argument(
            "--revision", default=None, help="lerobot: Hub revision (default: the v3.0 tag)"
        )
        p.add_argument(
            "--include-rejected",
            action="store_true",
            help="lerobot: keep episodes an operator rejected",
        )
        p.add_argument(
            "--video",
            choices=("packets", "decode"),
            default=None,
            help="lerobot: keep each camera's MP4 packets as they are (default), or decode "
            "them to raw frames",
        )
    if "lafan" in formats:
        p.add_argument(
            "--fps",
            type=types.finite_float(0.0, 1000.0),
            default=None,
            help="lafan: resample to this frame rate (default: keep the source's 30 fps)",
        )
        p.add_argument(
            "--quat-order",
            choices=("wxyz", "xyzw"),
            default=None,
            help="lafan: order of the stored root_quat (default: wxyz)",
        )
        p.add_argument(
            "--resume",
            action="store_true",
            help="lafan: append the files an interrupted import of the same source did not commit",
        )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _export_options(p: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """The options of ``export`` that apply to ``formats`` (an older spelling: its own)."""
    if "minari" in formats:
        p.add_argument(
            "--root",
            type=types.output_folder,
            default=None,
            help="minari: the datasets root (default: $MINARI_DATASETS_PATH, else "
            "~/.minari/datasets)",
        )
        p.add_argument(
            "--data-format",
            choices=("hdf5", "arrow"),
            default=None,
            help="minari: the data format (default: hdf5)",
        )
    if "lerobot" in formats:
        p.add_argument(
            "--fps",
            type=types.bounded_int(1, 1000),
            default=None,
            help="lerobot: frames per second (default: the fps a LeRobot import recorded)",
        )
        p.add_argument(
            "--task", default=None, help="lerobot: the task of every frame (default: imported)"
        )
        p.add_argument(
            "--robot-type", default=None, help="lerobot: info.json robot_type (default: none)"
        )
        p.add_argument(
            "--columns", nargs="+", default=None, help="lerobot: columns to export (default: all)"
        )
        p.add_argument(
            "--cameras",
            choices=("video", "image"),
            default=None,
            help="lerobot: every camera as MP4 or PNG (default: imported cameras as they were, "
            "others MP4)",
        )
        p.add_argument(
            "--codec",
            choices=("av1", "h264"),
            default=None,
            help="lerobot: video codec (default: a camera's stored AV1 / H.264 packets as "
            "they are, others av1)",
        )
    p.add_argument("--overwrite", action="store_true", help="replace an existing DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _lafan_resume(a: argparse.Namespace) -> str:
    fps = "" if a.fps is None else f" --fps {a.fps:g}"
    order = "" if a.quat_order is None else f" --quat-order {a.quat_order}"
    return f"torchstore import {a.source} {a.dest} --format lafan{fps}{order} --resume"


def _resume_hint(a: argparse.Namespace) -> str | None:
    """What an interrupted import prints to continue: LAFAN1 imports resume file by file."""
    return _lafan_resume(a) if getattr(a, "format", None) == "lafan" else None


def add_commands(sub: argparse._SubParsersAction, writes: Callable) -> None:
    """Add ``import`` and ``export`` and their older spellings; ``writes(parser, dest,
    resume)`` records each one's output."""
    from torchstore.formats.sniff import FORMATS

    p = sub.add_parser(
        "import",
        help=f"import a dataset of any known format into a store ({', '.join(FORMATS)})",
    )
    p.add_argument(
        "source",
        type=source_or_id,
        help="the dataset file or folder; with --format lerobot or minari also a dataset id "
        "(user/name on the Hub, namespace/name-v0 in the local Minari root)",
    )
    p.add_argument("dest", type=types.output_file, help="the store file to write")
    p.add_argument(
        "--format", choices=FORMATS, default=None, help="skip sniffing: read SOURCE as this"
    )
    _import_options(p, FORMATS)
    p.set_defaults(func=_import)
    writes(p, "dest", _resume_hint)

    p = sub.add_parser("export", help=f"write a store in another format ({', '.join(EXPORTS)})")
    p.add_argument("store", type=types.existing_file, help="the store to export")
    p.add_argument(
        "dest",
        help="the file (robomimic .hdf5, zarr .zarr or .zarr.zip) or folder (lerobot) to "
        "write; for minari, the new dataset's id",
    )
    p.add_argument("--to", choices=EXPORTS, required=True, help="the format to write")
    _export_options(p, EXPORTS)
    p.set_defaults(func=_export)
    writes(p, "dest", episodes=False)

    _add_older_spellings(sub, writes)


def _older(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    """A command of an earlier release, kept working: no ``help=``, so the command list does
    not show it (the epilog lists them once)."""
    return sub.add_parser(
        name, description=f"older spelling of `torchstore {OLDER_SPELLINGS[name]}`"
    )


def _add_older_spellings(sub: argparse._SubParsersAction, writes: Callable) -> None:
    for name, fmt in (
        ("import-lerobot", "lerobot"),
        ("import-minari", "minari"),
        ("import-d4rl", "d4rl"),
        ("import-lafan", "lafan"),
    ):
        p = _older(sub, name)
        source_type = source_or_id if fmt in _BY_ID else types.existing_path
        p.add_argument("source", type=source_type, help=f"the {fmt} dataset to import")
        p.add_argument("dest", type=types.output_file, help="the store file to write")
        _import_options(p, (fmt,))
        p.set_defaults(func=_import, format=fmt)
        writes(p, "dest", _resume_hint)

    p = _older(sub, "export-lerobot")
    p.add_argument("store", type=types.existing_file, help="the store to export")
    p.add_argument(
        "dest", metavar="dir", type=types.output_folder, help="the dataset folder to write"
    )
    _export_options(p, ("lerobot",))
    p.set_defaults(func=_export, to="lerobot")
    writes(p, "dest")

    p = _older(sub, "export-minari")
    p.add_argument("store", type=types.existing_file, help="the store to export")
    p.add_argument(
        "dest", metavar="dataset_id", help="the new dataset's id, like namespace/name-v0"
    )
    _export_options(p, ("minari",))
    p.add_argument(
        "--format", dest="data_format", choices=("hdf5", "arrow"), help=argparse.SUPPRESS
    )
    p.set_defaults(func=_export, to="minari")
    writes(p, "dest", episodes=False)


def older_spellings_epilog() -> str:
    """The ``--help`` epilog that lists the older spellings once."""
    pairs = ", ".join(f"{old} = {new}" for old, new in OLDER_SPELLINGS.items())
    return f"older spellings (still accepted): {pairs}"
