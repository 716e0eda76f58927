"""What a user sees when ``torchstore import`` refuses a source: one line, exit 1, no DEST."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def refused_import(src: Path, dest: Path, *, timeout: float = 300) -> str:
    """Run ``torchstore import SRC DEST`` in a fresh interpreter, check that it printed one
    line and no traceback, exited 1 and left no DEST, and return that line."""
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "import", str(src), str(dest)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("torchstore import: "), lines[0]
    assert "Traceback" not in run.stdout + run.stderr
    assert not dest.exists()
    return lines[0]
