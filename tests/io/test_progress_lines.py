"""Progress bars off a terminal print whole lines: a real command's output to a pipe has no
``\\r``, no redraw and no partial ``0%`` line glued to the next thing it prints."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from torchstore.cli import main
from torchstore.demo import write_demo_store
from torchstore.io.progress import progress_bar


@pytest.fixture(autouse=True)
def _bars_on(monkeypatch):
    monkeypatch.delenv("TORCHSTORE_DISABLE_PROGRESS", raising=False)


def _run(*args: str) -> str:
    """A CLI command with stdout and stderr into one pipe, as ``cmd 2>&1 | tee log`` sees."""
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout
    return run.stdout


def _whole_lines(out: str, done: str) -> None:
    assert "\r" not in out, repr(out)
    lines = out.splitlines()
    bars = [line for line in lines if "%" in line]
    assert len(bars) == 2, out  # a line when it starts, one when it ends
    assert " 0% " in bars[0] and "100% " in bars[1], out
    assert any(line.startswith(done) for line in lines), out  # not glued to a bar
    assert "█" not in out and "|" not in bars[1]  # a log line draws no bar


def test_a_command_piped_prints_whole_progress_lines(tmp_path):
    store = write_demo_store(tmp_path / "d.h5", episodes=3, steps=40)
    _whole_lines(_run("verify", str(store)), f"{store}: OK")


def test_a_bar_that_rubs_itself_out_on_a_terminal_leaves_its_lines_in_a_log(tmp_path, capsys):
    store = write_demo_store(tmp_path / "d.h5", episodes=3, steps=40)
    assert main(["export", "--to", "zarr", str(store), str(tmp_path / "d.zarr")]) == 0
    out = capsys.readouterr()
    _whole_lines(out.err + out.out, "wrote ")


def test_a_bar_off_a_terminal_prints_a_line_only_when_the_count_moved():
    stream = io.StringIO()
    bar = progress_bar(total=10, desc="push", unit="B", file=stream, mininterval=0)
    for _ in range(3):
        bar.update(0)  # nothing new: no line
    bar.update(4)
    bar.refresh()
    bar.update(6)
    bar.close()
    bar.close()  # closing twice prints nothing more
    lines = stream.getvalue().split("\n")
    assert lines[-1] == ""  # every line ends
    assert [line.split(" [")[0] for line in lines[:-1]] == [
        "push:   0% 0/10",
        "push:  40% 4/10",
        "push: 100% 10/10",
    ]


def test_a_bar_without_a_total_counts_without_a_percentage():
    stream = io.StringIO()
    bar = progress_bar(desc="sync", unit="file", file=stream)
    bar.update(3)
    bar.close()
    assert stream.getvalue().splitlines()[-1].startswith("sync: 3file [")
    assert "%" not in stream.getvalue()


def test_a_bar_on_a_terminal_is_tqdms_own():
    from tqdm.std import tqdm

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = progress_bar(total=2, desc="import", file=stream, leave=False)
    bar.update(2)
    bar.close()
    assert type(bar).__name__ != "LineBar" and isinstance(bar, tqdm)
    assert "\r" in stream.getvalue()  # redrawn in place, as a terminal shows it


def test_a_terminal_that_reports_no_size_gets_a_bar_it_can_draw(monkeypatch):
    """``script -qc CMD /dev/null`` opens a 0x0 pseudo-terminal, where tqdm sized to the
    terminal drew nothing at all: the bar is drawn 80 columns wide there."""
    import os

    class Terminal(io.StringIO):
        def isatty(self):
            return True

        def fileno(self):
            return 1

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    stream = Terminal()
    bar = progress_bar(total=2, desc="verify", file=stream, leave=False)
    assert (bar.ncols, bar.nrows) == (80, 24)
    bar.update(2)
    bar.close()
    assert "verify:" in stream.getvalue()
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((120, 40)))
    sized = progress_bar(total=2, file=Terminal())
    assert sized.dynamic_ncols  # a terminal of a size: the bar follows its width
    sized.close()
