"""A recipe's console: Lightning's bar on a terminal, a few plain lines in a log or a pipe,
and the same results table either way (``python recipes/bc.py > run.log`` as a user types
it, and the same under a pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["trainer.max_steps=40", "trainer.val_check_interval=20", "eval.episodes=1"]


def _bc(tmp_path: Path, *, terminal: bool) -> str:
    cmd = [sys.executable, str(ROOT / "recipes" / "bc.py"), *ARGS]
    if not terminal:
        done = subprocess.run(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300
        )
        assert done.returncode == 0, done.stdout[-2000:]
        return done.stdout.decode()
    leader, follower = pty.openpty()
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
