"""A recipe's console: Lightning's bar on a terminal, a few plain lines in a log, a pipe or
a terminal that reports no size, and the same results table either way
(``python recipes/bc.py > run.log`` as a user types it, and the same under a
pseudo-terminal of 24x80 and of 0x0, as ``script -qc CMD /dev/null`` opens one)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["trainer.max_steps=40", "trainer.val_check_interval=20", "eval.episodes=1"]


def _bc(tmp_path: Path, *, terminal: bool, size: tuple[int, int] = (24, 80)) -> str:
    return _console(
        [sys.executable, str(ROOT / "recipes" / "bc.py"), *ARGS],
        tmp_path,
        terminal=terminal,
        size=size,
    )


def _console(cmd: list[str], tmp_path: Path, *, terminal: bool, size: tuple[int, int]) -> str:
    """What ``cmd`` prints, into a pipe or a pseudo-terminal of ``size`` (rows, columns)."""
    if not terminal:
        done = subprocess.run(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300
        )
        assert done.returncode == 0, done.stdout[-2000:]
        return done.stdout.decode()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=follower, stderr=follower)
    os.close(follower)
    out = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the run is over
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=300) == 0, out[-2000:]
    os.close(leader)
    return out.decode(errors="replace")


def test_off_a_terminal_progress_is_a_few_plain_lines(tmp_path):
    out = _bc(tmp_path, terminal=False)
    assert "\r" not in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert 3 <= len(steps) <= 12 and steps[-1].startswith("step 40/40 (100%): ")
    assert "train/loss" in steps[-1] and "val/loss" in steps[-1]
    assert "policy      success" in out and "learned" in out


def test_on_a_terminal_lightning_draws_its_bar(tmp_path):
    out = _bc(tmp_path, terminal=True)
    assert "\r" in out and "it/s" in out  # tqdm's redraws
    assert not any(line.startswith("step 40/40") for line in out.splitlines())
    assert "policy      success" in out and "learned" in out


def test_a_terminal_of_no_size_gets_the_plain_lines(tmp_path):
    """tqdm draws nothing at width 0: the run would print nothing while it trains."""
    out = _bc(tmp_path, terminal=True, size=(0, 0))
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert 3 <= len(steps) <= 12 and steps[-1].startswith("step 40/40 (100%): ")
    assert "it/s" not in out and "learned" in out


def test_sacs_own_bar_draws_at_a_fixed_width_on_a_terminal_of_no_size(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "recipes" / "sac.py"),
        "collector.total_frames=200",
        "collector.init_random_frames=100",
        "updates_per_frame=0.1",
        "eval.episodes=1",
        "eval.max_steps=10",
    ]
    out = _console(cmd, tmp_path, terminal=True, size=(0, 0))
    bars = [part for part in out.replace("\n", "\r").split("\r") if part.startswith("sac:")]
    assert bars and bars[-1].startswith("sac: 100%") and "200/200" in bars[-1], out[-2000:]
