"""A --quick run of benchmarks/cameras.py: every row is printed, and what is not a timing holds.

Timings are printed, never asserted. What is checked is what a run must get right whatever
the machine: the store decodes the same pixels as PyAV decoding the MP4 of its packets, the
encoded store is smaller than the raw one, every episode is drawn in an epoch, and without a
lerobot interpreter row 4 says it was skipped and how to make one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.file_module import load_module

CAMERAS = Path(__file__).resolve().parents[2] / "benchmarks" / "cameras.py"


@pytest.fixture(scope="module")
def cameras():
    return load_module(CAMERAS, "cameras_benchmark")


def test_a_quick_run_prints_every_row_and_its_target(cameras, tmp_path, capsys):
    missing = tmp_path / "no-venv" / "bin" / "python"
    code = cameras.main(["--quick", "--lerobot-python", str(missing), "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    titles = ("1. disk", "2. training batches", "3. decode", "5. sampling quality")
    for title in (*titles, "6. action chunks", "7. decode at the ceiling", "8. resize", "targets"):
        assert title in out, title
    assert f"skipped: lerobot 0.6 venv not found at {missing}" in out
    assert "lerobot_venv.sh 0.6.1" in out
    targets = (
        "<= 1.1x LeRobot's dataset",
        ">= 0.8x raw batches/s",
        ">= 0.9x PyAV per core (top)",
        "50-step chunk >= 0.9x single-step batches/s (raw",
        "decoded rows/s >= 0.85x the ceiling (reuse 1)",
    )
    for target in targets:
        assert target in out, target

    # the store's decode and PyAV's give the same pixels: the last column of each camera row
    decode = out.split("3. decode")[1].split("\n\n")[0]
    diffs = re.findall(r"^\s+(wrist|top), \d+\s.*\s(\d+)$", decode, re.M)
    assert [cam for cam, _ in diffs] == ["wrist", "top"] and {d for _, d in diffs} == {"0"}

    raw_ratio = re.search(r"raw uint8 store\s+[\d,.]+\s+([\d,.]+)x", out)
    assert raw_ratio and float(raw_ratio.group(1).replace(",", "")) > 2

    # one epoch from the windowed encoded store reaches every episode (6 in --quick)
    epoch = re.search(r"windowed encoded store, 1 epoch\(s\)\s+[\d,]+\s+(\d+)/(\d+)", out)
    assert epoch and epoch.group(1) == epoch.group(2) == "6"
    # row 6's chunk batch: the cameras at one frame, the action over 50 steps
    chunks = out.split("6. action chunks")[1].split("\n\n")[0]
    assert "obs/top [64, 1, 96, 128, 3]" in chunks and "action/action [64, 50, 14]" in chunks
    assert not list(tmp_path.iterdir())  # the datasets lived in a folder removed at the end
