"""The tree stays lint-clean and formatted, with the settings in ruff.toml.

ruff is pinned in the dev extra, so its verdict does not move with a new release.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module", autouse=True)
def _needs_ruff():
    probe = _ruff("--version")
    if probe.returncode != 0:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")


def test_ruff_check_passes():
    result = _ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_file_is_formatted():
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
