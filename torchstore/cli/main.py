"""The ``torchstore`` command: parse arguments, then call the library."""

from __future__ import annotations

import argparse
import json
import sys

from torchstore.errors import TorchstoreError

__all__ = ["main"]


def _info(args: argparse.Namespace) -> None:
    from torchstore.data.store import TrajectoryStore
    from torchstore.data.summary import format_summary, summarize

    with TrajectoryStore(args.path) as store:
        info = summarize(store)
    print(json.dumps(info, indent=2) if args.json else format_summary(info))


def _demo(args: argparse.Namespace) -> None:
    from torchstore.demo import write_demo_store

    path = write_demo_store(args.path, episodes=args.episodes, steps=args.steps, seed=args.seed)
    print(f"wrote {args.episodes} episodes of {args.steps} steps to {path}")


def _import_lafan(args: argparse.Namespace) -> None:
    from torchstore.motion import import_lafan

    path = import_lafan(args.source, args.dest, fps=args.fps, quat_order=args.quat_order, overwrite=args.overwrite)
    print(f"wrote {path}")


def _demo_data(args: argparse.Namespace) -> None:
    from torchstore.tasks import write_demo_data

    path = write_demo_data(args.path, episodes=args.episodes, seed=args.seed)
    print(f"wrote {args.episodes} reach demonstrations to {path}")


def _viz(args: argparse.Namespace) -> None:
    from torchstore.viz import plot_store

    for path in plot_store(args.store, args.out, episodes=args.episodes):
        print(f"wrote {path}")


def _import_lerobot(args: argparse.Namespace) -> None:
    from torchstore.lerobot import import_lerobot

    summary = import_lerobot(
        args.source,
        args.dest,
        episodes=args.episodes,
        columns=args.columns,
        revision=args.revision,
        include_rejected=args.include_rejected,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(summary)


def _export_lerobot(args: argparse.Namespace) -> None:
    from torchstore.io.video import EncoderSettings
    from torchstore.lerobot import export_lerobot

    encoder = EncoderSettings.h264() if args.codec == "h264" else None
    summary = export_lerobot(
        args.store,
        args.dir,
        fps=args.fps,
        task=args.task,
        robot_type=args.robot_type,
        columns=args.columns,
        cameras=args.cameras,
        video_encoder=encoder,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(summary)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchstore", description="Trajectory stores, replay data and remote datasets."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="summarise a store: columns, rows, episodes, size, manifest")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_info)

    p = sub.add_parser("demo", help="write a small demo store (damped pendulum episodes)")
    p.add_argument("path")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)

    p = sub.add_parser("import-lafan", help="import LAFAN1 motions retargeted to the Unitree G1 (CSV)")
    p.add_argument("source", help="a CSV file or a folder of them")
    p.add_argument("dest", help="the store file to write")
    p.add_argument("--fps", type=float, default=None, help="resample to this frame rate")
    p.add_argument("--quat-order", choices=("wxyz", "xyzw"), default="wxyz")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_import_lafan)

    p = sub.add_parser("demo-data", help="write the default task's expert demonstrations (2-D reach)")
    p.add_argument("path", nargs="?", default="data/reach_demo.h5")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo_data)

    p = sub.add_parser("viz", help="plot a store: episode lengths, column traces, image frames (PNG)")
    p.add_argument("store")
    p.add_argument("--out", required=True, help="folder to write the PNG files to")
    p.add_argument("--episodes", type=int, default=3, help="episodes to draw traces and frames of")
    p.set_defaults(func=_viz)
    p = sub.add_parser("import-lerobot", help="import a LeRobot v3.0/v2.1 dataset (folder or Hub repo id) into a store")
    p.add_argument("source", help="a dataset folder, or a Hub repo id like user/name")
    p.add_argument("dest", help="the store file to write")
    p.add_argument("--episodes", type=int, nargs="+", default=None, help="episode indices (default: all)")
    p.add_argument("--columns", nargs="+", default=None, help="feature names (default: all)")
    p.add_argument("--revision", default=None, help="Hub revision (default: the v3.0 tag)")
    p.add_argument("--include-rejected", action="store_true", help="keep episodes an operator rejected")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_import_lerobot)

    p = sub.add_parser("export-lerobot", help="write a store as a LeRobot v3.0 dataset folder")
    p.add_argument("store")
    p.add_argument("dir")
    p.add_argument("--fps", type=int, default=None, help="default: the fps a LeRobot import recorded")
    p.add_argument("--task", default=None, help="the task of every frame (default: the imported tasks)")
    p.add_argument("--robot-type", default=None)
    p.add_argument("--columns", nargs="+", default=None)
    p.add_argument("--cameras", choices=("video", "image"), default="video", help="uint8 [H, W, 3] columns as MP4 or PNG")
    p.add_argument("--codec", choices=("av1", "h264"), default="av1")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_export_lerobot)
    from torchstore.cli.remote import add_commands

    add_commands(sub)  # catalog, pull, push, sync, remote index
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (TorchstoreError, FileNotFoundError, FileExistsError) as exc:
        print(f"torchstore {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
