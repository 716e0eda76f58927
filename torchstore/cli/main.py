"""The ``torchstore`` command: parse arguments, then call the library.

Every argument is checked where it is parsed (:mod:`torchstore.cli.args`: a bad value is
one usage line, exit 2). Every other failure a user can cause is one line on stderr,
exit 1, in the command's own words (``--overwrite``, not ``overwrite=True``). Ctrl-C
prints one line (what the writer had committed and how to resume) and exits 130; a
closed pipe (``torchstore info X --json | head -1``) ends quietly.

Nothing heavy is imported to parse: each handler imports what it calls, so ``--help``
and ``--version`` answer without importing torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from torchstore._version import __version__
from torchstore.cli import args as types
from torchstore.cli.interrupt import InterruptGuard, Terminated
from torchstore.errors import TorchstoreError

__all__ = ["main", "build_parser"]

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM
#: Exit status when stdout's reader went away (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default once, except the uninformative ``None`` and ``False``.

    An option whose default is ``None`` says in its help what no value means; one whose
    help already says ``(default: ...)`` is left as it is.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "(default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Shows defaults in ``--help``; a usage error is one line naming the way to help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- handlers
def _info(args: argparse.Namespace) -> None:
    from torchstore.cli.info import print_info

    print_info(args.path, as_json=args.json)


#: what ``torchstore demo --task`` writes, and its default episode count
DEMO_TASKS = {
    "pendulum": ("damped-pendulum episodes, for trying things out", 20),
    "reach": ("the default task's 2-D reach demonstrations, byte-reproducible", 50),
}


def _demo(args: argparse.Namespace) -> None:
    from torchstore.errors import ArgumentError

    episodes = args.episodes or DEMO_TASKS[args.task][1]
    if args.task == "reach":
        for flag, value in (("--steps", args.steps), ("--resume", args.resume)):
            if value:
                raise ArgumentError(
                    f"{flag} applies to --task pendulum; reach demonstrations run until the "
                    "goal is reached, and are written whole or not at all"
                )
        from torchstore.tasks import write_demo_data

        path = write_demo_data(
            args.path, episodes=episodes, seed=args.seed, overwrite=args.overwrite
        )
        print(f"wrote {episodes} reach demonstrations to {path}")
        return
    from torchstore.demo import write_demo_store

    steps = args.steps or 200
    path = write_demo_store(
        args.path,
        episodes=episodes,
        steps=steps,
        seed=args.seed,
        overwrite=args.overwrite,
        resume=args.resume,
    )
    print(f"wrote {episodes} episodes of {steps} steps to {path}")


def _demo_data(args: argparse.Namespace) -> None:
    """``demo-data``: the older spelling of ``demo --task reach``, for one more release."""
    print(
        "torchstore demo-data is deprecated and goes in the next release: use "
        f"torchstore demo {args.path} --task reach",
        file=sys.stderr,
    )
    _demo(argparse.Namespace(**{**vars(args), "task": "reach", "steps": None, "resume": False}))


def _viz(args: argparse.Namespace) -> None:
    from torchstore.viz import plot_store

    for path in plot_store(args.store, args.out, episodes=args.episodes):
        print(f"wrote {path}")


def _encode(args: argparse.Namespace) -> None:
    from torchstore.data.store.recode import camera_columns, recode_store
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.errors import ColumnError
    from torchstore.io.frames.codec import FrameCodec

    settings = {k: getattr(args, k) for k in ("crf", "gop", "quality")}
    settings = {k: v for k, v in settings.items() if v is not None}  # None: the codec's own
    codec = FrameCodec(args.codec, **settings)
    names = args.columns
    if names is None:
        with TrajectoryStore(args.store) as store:
            names = camera_columns(store.columns)
        if not names:
            raise ColumnError(f"{args.store} has no uint8 [H, W, 3] column to encode")
    recode_store(
        args.store,
        args.dest,
        {name: codec for name in names},
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    with TrajectoryStore(args.dest) as out:
        described = ", ".join(f"{n} as {out.column(n).describe()}" for n in names)
    before, after = Path(args.store).stat().st_size, Path(args.dest).stat().st_size
    print(f"wrote {args.dest}: {described}; {before:,} -> {after:,} bytes")


def _verify(args: argparse.Namespace) -> None:
    from torchstore.errors import IntegrityError, StoreFormatError
    from torchstore.io.dataset_folders import folder_format, not_a_store

    if isinstance(args.path, str):  # a URL: the store, read in place
        from torchstore.data.store.verify import verify_store

        report = verify_store(args.path, progress=not args.no_progress)
    elif folder_format(args.path) == "lerobot":  # checked as far as its format allows
        from torchstore.lerobot.check import check_folder

        report = check_folder(args.path)
    elif (why := not_a_store(args.path)) is not None:  # another format's, or empty
        raise StoreFormatError(why)
    else:
        from torchstore.data.store.verify import verify_store

        report = verify_store(args.path, progress=not args.no_progress)
    if not report.ok:
        raise IntegrityError(report.verdict())
    print(report.verdict())


# ---------------------------------------------------------------- parser
def _writes(
    p: argparse.ArgumentParser,
    dest: str,
    resume: Callable[[argparse.Namespace], str] | None = None,
    *,
    episodes: bool = True,
) -> None:
    """Record which argument a command writes: for the Ctrl-C report and failure clean-up.

    ``episodes``: the output is a store or a LeRobot folder whose committed episodes the
    Ctrl-C line counts.
    """
    p.set_defaults(output=dest, resume_hint=resume, counts_episodes=episodes)


def _demo_resume(a: argparse.Namespace) -> str | None:
    if a.task != "pendulum":
        return None  # a reach run is written beside its path and renamed when whole
    return (
        f"torchstore demo {a.path} --episodes {a.episodes or DEMO_TASKS['pendulum'][1]} "
        f"--steps {a.steps or 200} --seed {a.seed} --resume"
    )


#: what ``encode`` uses for a setting it is not given: each codec's own default (those of
#: :class:`~torchstore.io.frames.codec_types.FrameCodec`, written out so that ``--help``
#: imports no numpy; tests/cli/test_help.py checks they agree)
ENCODE_DEFAULTS = {"crf": "30 for av1, 23 for h264", "gop": "32", "quality": "90"}


def _add_core_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="summarise a store or a LeRobot dataset folder: columns, rows, episodes, size",
    )
    p.add_argument(
        "path",
        type=types.store_path,
        help="a store file (or its https:// or hf:// URL), or a LeRobot dataset folder",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_info)

    p = sub.add_parser(
        "demo", help="write a small demo store: pendulum episodes, or reach demonstrations"
    )
    p.add_argument("path", type=types.output_file, help="the store file to write")
    p.add_argument(
        "--task",
        choices=tuple(DEMO_TASKS),
        default="pendulum",
        help="what to write: "
        + "; ".join(f"{name}: {what}" for name, (what, _) in DEMO_TASKS.items()),
    )
    p.add_argument(
        "--episodes",
        type=types.positive_int,
        default=None,
        help="episodes to write (default: "
        + ", ".join(f"{n} for {name}" for name, (_, n) in DEMO_TASKS.items())
        + ")",
    )
    p.add_argument(
        "--steps",
        type=types.positive_int,
        default=None,
        help="pendulum: steps per episode (default: 200)",
    )
    p.add_argument("--seed", type=types.seed, default=0, help="random seed (same seed, same rows)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at PATH")
    p.add_argument(
        "--resume",
        action="store_true",
        help="pendulum: append the episodes an interrupted run with the same arguments did "
        "not write (a reach run is written whole or not at all)",
    )
    p.set_defaults(func=_demo)
    _writes(p, "path", _demo_resume)

    # no help=: the command list does not show it; the epilog names it once
    p = sub.add_parser(
        "demo-data",
        description="deprecated, going in the next release: the older spelling of "
        "`torchstore demo PATH --task reach`",
    )
    p.add_argument(
        "path",
        nargs="?",
        type=types.output_file,
        default=Path("data/reach_demo.h5"),
        help="the store file to write",
    )
    p.add_argument(
        "--episodes", type=types.positive_int, default=50, help="demonstrations to record"
    )
    p.add_argument("--seed", type=types.seed, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at PATH")
    p.set_defaults(func=_demo_data)
    _writes(p, "path")

    p = sub.add_parser(
        "viz", help="plot a store or a LeRobot folder: episode lengths, column traces, frames (PNG)"
    )
    p.add_argument(
        "store", type=types.existing_path, help="a store file, or a LeRobot dataset folder"
    )
    p.add_argument(
        "--out",
        type=types.output_folder,
        default=None,
        help="folder to write the PNG files to (default: STORE_viz/ next to STORE, named "
        "for it without its suffix)",
    )
    p.add_argument(
        "--episodes",
        type=types.bounded_int(1, 1000),
        default=3,
        help="episodes to draw traces and frames of",
    )
    p.set_defaults(func=_viz)
    _writes(p, "out", episodes=False)

    p = sub.add_parser(
        "encode",
        help="copy a store with its camera columns encoded (av1, h264, jpeg, png) or raw again",
    )
    p.add_argument("store", type=types.existing_file, help="the store to copy")
    p.add_argument("dest", type=types.output_file, help="the store file to write")
    p.add_argument(
        "--codec",
        choices=("av1", "h264", "jpeg", "png", "raw"),
        default="av1",
        help="how to keep the frames; raw decodes them",
    )
    p.add_argument(
        "--columns", nargs="+", default=None, help="columns (default: every uint8 [H, W, 3] one)"
    )
    p.add_argument(
        "--crf",
        type=types.bounded_int(0, 63),
        default=None,
        help="video quality, lower is better: av1 0-63, h264 0-51 "
        f"(default: {ENCODE_DEFAULTS['crf']})",
    )
    p.add_argument(
        "--gop",
        type=types.bounded_int(1, 1000),
        default=None,
        help=f"video keyframe spacing in frames (default: {ENCODE_DEFAULTS['gop']})",
    )
    p.add_argument(
        "--quality",
        type=types.bounded_int(1, 100),
        default=None,
        help=f"JPEG quality 1-100 (default: {ENCODE_DEFAULTS['quality']})",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_encode)
    _writes(p, "dest")

    p = sub.add_parser(
        "verify",
        help="read every byte of a store and check its checksums, or check a LeRobot folder "
        "as far as its format allows (exit 1 if damaged)",
    )
    p.add_argument(
        "path",
        type=types.store_path,
        help="the store file (or folder of shards, or a store's https:// or hf:// URL), or a "
        "LeRobot dataset folder, to check",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``torchstore`` parser (every subcommand), without running anything."""
    from torchstore.cli.formats import older_spellings_epilog

    parser = _Parser(
        prog="torchstore",
        description="Trajectory stores, replay data and remote datasets.",
        epilog=f"{older_spellings_epilog()}; deprecated, going in the next release: "
        "demo-data = demo PATH --task reach",
    )
    parser.add_argument(
        "--version", action="version", version=f"torchstore {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    _add_core_commands(sub)
    from torchstore.cli.formats import add_commands as add_format_commands
    from torchstore.cli.remote import add_commands

    add_format_commands(sub, _writes)  # import (any format), export --to, older spellings

    add_commands(sub)  # catalog, pull, push, sync, remote index, datasets, list, project
    rerun = "run the same command again to continue"
    for name, line in (
        ("pull", f"interrupted; verified files stay in the cache, {rerun}"),
        ("push", f"interrupted; the index is written last, so the entry is as it was; {rerun}"),
        ("sync", f"interrupted; files already uploaded stay uploaded; {rerun}"),
    ):
        if name in sub.choices:
            sub.choices[name].set_defaults(interrupted_line=line)
    _describe(sub)
    return parser


def _describe(sub: argparse._SubParsersAction) -> None:
    """Each subcommand's ``--help`` opens with the line the command list shows."""
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, parser in sub.choices.items():
        if parser.description is None:
            parser.description = helps.get(name)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _describe(action)


# ---------------------------------------------------------------- running
def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = sub.choices[args.command]
    nested = getattr(args, "remote_command", None) or getattr(args, "project_command", None)
    for action in found._actions:
        if nested and isinstance(action, argparse._SubParsersAction):
            return action.choices[nested]
    return found


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    return [(a.dest, a.option_strings[-1]) for a in parser._actions if a.option_strings]


def _state(path: object) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # type: ignore[arg-type]
    except (OSError, TypeError, ValueError):
        return None
    return st.st_ino, st.st_mtime_ns


def _committed(path: Path) -> int | None:
    """Committed episodes at ``path`` (a store or a LeRobot folder), or None if unreadable."""
    try:
        if path.is_dir():
            from torchstore.lerobot import LeRobotSource

            with LeRobotSource(path) as source:
                return len(source.episodes)
        from torchstore.data.store.store import TrajectoryStore

        with TrajectoryStore(path) as store:
            return store.num_episodes
    except Exception:  # noqa: BLE001 - a report after Ctrl-C must not raise
        return None


def _interrupted(args: argparse.Namespace, before: tuple[int, int] | None) -> str:
    dest = getattr(args, "output", None)
    if dest is None or not getattr(args, "counts_episodes", False):
        return getattr(args, "interrupted_line", "interrupted")
    path = Path(getattr(args, dest))
    if _state(path) == before:
        return (
            f"interrupted; {path} unchanged"
            if before
            else f"interrupted; nothing written to {path}"
        )
    n = _committed(path)
    if n is None:
        return f"interrupted; {path} holds nothing readable yet"
    hint = getattr(args, "resume_hint", None)
    resume = hint(args) if hint else None
    tail = f", resume with: {resume}" if resume else ", run again with --overwrite to start over"
    return f"interrupted; {n} episodes committed to {path}{tail}"


def _missing_folders(path: object) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    if path is None:
        return []
    missing = []
    folder = Path(path).parent  # type: ignore[arg-type]
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    """Undo the parent folders a failed command created for its output (empty ones only)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _ignore_sigint():
    """Ignore SIGINT; returns the handler to restore (None off the main thread)."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # signal handlers can only be set from the main thread
        return None


def _quiet_stdout() -> None:
    # Python's recipe for SIGPIPE: point stdout at devnull so the interpreter's final
    # flush does not raise a second BrokenPipeError on the way out.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _interrupt_in(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM, as :class:`Terminated`) behind ``exc``: ``exc`` itself, or
    one on its chain of causes. A C extension can wrap it: a Ctrl-C that lands in the
    callback of h5py's link visit comes out as a ``SystemError`` caused by it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _exit_status(interrupt: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Run ``torchstore`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        return _run(argv)
    except BaseException as exc:
        interrupt = _interrupt_in(exc)
        if interrupt is None:
            raise
        # outside the command (while the parser is built, or in a failure's report): no
        # command's state to report, and still one line
        previous = _ignore_sigint()
        try:
            print("interrupted", file=sys.stderr)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return _exit_status(interrupt)


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 0
    output = getattr(args, getattr(args, "output", "") or "", None)
    before, created = _state(output), _missing_folders(output)
    guard = InterruptGuard()
    try:
        with guard:
            args.func(args)
            sys.stdout.flush()
    except BaseException as exc:
        interrupt = _interrupt_in(exc)  # Ctrl-C, or SIGTERM as Terminated
        if interrupt is not None:
            guard.handled()
            previous = _ignore_sigint()  # a second Ctrl-C must not cut the report short
            try:
                _remove_if_empty(created)
                print(_interrupted(args, before), file=sys.stderr)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGINT, previous)
            return _exit_status(interrupt)
        if isinstance(exc, BrokenPipeError):
            _quiet_stdout()
            return EXIT_BROKEN_PIPE
        if not isinstance(exc, (TorchstoreError, OSError, ValueError, ImportError)):
            raise
        _remove_if_empty(created)
        words = types.cli_words(
            str(exc) or type(exc).__name__, _flags(_command_parser(parser, args))
        )
        print(f"torchstore {args.command}: {words}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
