"""Every option of every subcommand, fed hostile values: one line, exit 1 or 2, nothing written.

The cases come from ``build_parser()`` itself, so a command added tomorrow is walked too.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchstore.cli import args as types
from torchstore.cli import main
from torchstore.cli.main import build_parser

BAD_NUMBERS = ("0", "-1", "nan", "inf", "1e30")
ALWAYS_BAD = ("-1", "nan", "inf")  # no numeric option of ours accepts these
INPUT_TYPES = {"path", "file", "folder"}
OUTPUT_TYPES = {"output file", "output folder"}
CACHE_TYPES = {"cache folder"}  # may be read-only or missing; never a file


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*prefix, name))


COMMANDS = dict(_commands(build_parser()))


def _type_name(action: argparse.Action) -> str | None:
    return getattr(action.type, "__name__", None) if action.type is not None else None


def _positionals(parser):
    return [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


def _options(parser):
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")]


def _baseline(parser, tmp: Path) -> list[str]:
    """Positionals and required options that are well-formed but name nothing that exists."""
    argv = []
    for action in _positionals(parser):
        kind = _type_name(action)
        argv.append(str(tmp / ("out" if kind in OUTPUT_TYPES else "missing") / "x.h5"))
    for action in _options(parser):
        if action.required:
            argv += [action.option_strings[-1], str(tmp / "out")]
    return argv


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run(argv, capsys) -> tuple[int, str]:
    code = main(argv)  # an uncaught exception fails the test with its traceback
    err = capsys.readouterr().err
    # a deprecated spelling says so on a line of its own before it runs (demo-data)
    return code, re.sub(r"^torchstore [\w-]+ is deprecated[^\n]*\n", "", err)


def _one_line(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCHSTORE_OFFLINE", "1")
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")


def test_the_walk_finds_every_command():
    assert {" ".join(c) for c in COMMANDS} >= {
        "info",
        "demo",
        "demo-data",
        "import-lafan",
        "viz",
        "import-lerobot",
        "export-lerobot",
        "catalog",
        "pull",
        "push",
        "sync",
        "remote index",
    }


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_every_argument_has_help_and_a_checked_type(command):
    parser = COMMANDS[command]
    assert parser.description, f"{command} has no description"
    for action in _positionals(parser) + _options(parser):
        assert action.help, f"{' '.join(command)} {action.dest} has no help text"
        if action.default is not None and action.default is not False:
            assert "(default:" in parser.format_help() or "%(default)" in action.help
        assert action.type not in (int, float), (
            f"{' '.join(command)} {action.dest}: use a checked type from torchstore.cli.args"
        )
    help_text = " ".join(parser.format_help().split())
    for action in _options(parser):
        if action.default is not None and action.default is not False and action.help:
            assert f"(default: {action.default})" in help_text, (command, action.dest)


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_hostile_numbers_are_one_line_and_write_nothing(command, tmp_path, capsys):
    parser = COMMANDS[command]
    numeric = [a for a in _options(parser) if _type_name(a) in ("int", "float")]
    for action in numeric:
        flag = action.option_strings[-1]
        for value in BAD_NUMBERS:
            try:
                action.type(value)
            except argparse.ArgumentTypeError:
                pass
            else:  # a valid value for this option (a seed of 0): nothing hostile to check
                assert value not in ALWAYS_BAD, (command, flag, value)
                continue
            before = _snapshot(tmp_path)
            code, err = _run([*command, flag, value, *_baseline(parser, tmp_path)], capsys)
            _one_line(err)
            assert code == 2 and flag in err, (command, flag, value, err)
            assert _snapshot(tmp_path) == before, (command, flag, value)


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_hostile_paths_are_one_line_and_write_nothing(command, tmp_path, capsys):
    parser = COMMANDS[command]
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a folder\n")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    (a_dir / "keep.txt").write_text("kept\n")
    actions = _positionals(parser) + _options(parser)
    positionals = _positionals(parser)
    for action in actions:
        kind = _type_name(action)
        if kind in CACHE_TYPES:
            bad = [str(a_file)]
        elif kind in INPUT_TYPES:
            bad = [str(tmp_path / "missing" / "x")]
        elif kind in OUTPUT_TYPES:
            bad = [str(a_file / "x.h5")]
        else:
            continue
        if kind == "output file":
            bad.append(str(a_dir))
        if kind == "output folder":
            bad.append(str(a_file))
        if kind == "file":
            bad.append(str(a_dir))
        if kind == "folder":
            bad.append(str(a_file))
        for value in bad:
            argv = _baseline(parser, tmp_path)
            if action.option_strings:
                argv = [action.option_strings[-1], value, *argv]
                if action.required:  # drop the baseline's copy of this option
                    i = argv.index(action.option_strings[-1], 2)
                    del argv[i : i + 2]
            else:
                argv[positionals.index(action)] = value
            before = _snapshot(tmp_path)
            code, err = _run([*command, *argv], capsys)
            _one_line(err)
            assert code == 2, (command, action.dest, value, err)
            assert _snapshot(tmp_path) == before
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_parent_is_a_usage_error(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for command, parser in COMMANDS.items():
            for i, action in enumerate(_positionals(parser)):
                if _type_name(action) != "output file":
                    continue
                argv = _baseline(parser, tmp_path)
                argv[i] = str(locked / "x.h5")
                code, err = _run([*command, *argv], capsys)
                _one_line(err)
                assert code == 2 and "not writable" in err, (command, err)
    finally:
        locked.chmod(0o700)


def test_the_source_as_the_destination_is_refused_and_kept(tmp_path, capsys):
    source = tmp_path / "source.csv"
    source.write_text("1,2,3\n")
    walked = []
    for command, parser in COMMANDS.items():
        kinds = [_type_name(a) for a in _positionals(parser)]
        outputs = [i for i, k in enumerate(kinds) if k in OUTPUT_TYPES]
        if not outputs:
            continue
        walked.append(" ".join(command))
        argv = _baseline(parser, tmp_path)
        for i, kind in enumerate(kinds):
            if kind in INPUT_TYPES | OUTPUT_TYPES:
                argv[i] = str(source)
        flags = {a.option_strings[-1] for a in _options(parser)}
        for extra in ([], ["--overwrite"] if "--overwrite" in flags else []):
            code, err = _run([*command, *argv, *extra], capsys)
            _one_line(err)
            assert code in (1, 2), (command, err)
            assert source.read_text() == "1,2,3\n", command
        assert _snapshot(tmp_path) == {"source.csv"}, command
    assert {"demo", "demo-data", "import-lafan", "import-lerobot", "export-lerobot"} <= set(walked)


def test_messages_name_flags_not_keywords(tmp_path, capsys):
    from torchstore.demo import write_demo_store

    write_demo_store(tmp_path / "d.h5", episodes=1, steps=5)
    code, err = _run(["demo", str(tmp_path / "d.h5"), "--episodes", "1"], capsys)
    assert code == 1 and "--overwrite" in err and "overwrite=" not in err
    assert types.cli_words(
        "needs fps= and pass overwrite=True", [("fps", "--fps"), ("overwrite", "--overwrite")]
    ) == ("needs --fps and pass --overwrite")
    assert types.cli_words("fps=0 is wrong", [("fps", "--fps")]) == "--fps 0 is wrong"
