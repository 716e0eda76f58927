"""A tiny run of benchmarks/remote_lerobot.py: both loaders from the loopback Hub, one table.

Timings are printed, never asserted. What is checked holds on any machine: the torchstore
rows are there, the cold one fetched the store by ranges and the warm one read it from the
range cache (no body bytes sent), every row reports its spread over episodes, the scratch
folder is gone afterwards, and without a lerobot interpreter its row says it was skipped and
how to make one. With the lerobot 0.6 venv, its streaming dataset's row is there too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.file_module import load_module

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "remote_lerobot.py"
TINY = ["--episodes", "8", "--min-len", "10", "--max-len", "40", "--batch", "16"]
TINY += ["--batches", "4", "--repeats", "1", "--our-repeats", "1", "--latency-ms", "2"]
LEROBOT_PYTHON = Path("/tmp/lr06/bin/python")


@pytest.fixture(scope="module")
def bench():
    return load_module(BENCHMARK, "remote_lerobot_benchmark")


def _row(out: str, name: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.strip().startswith(name))
    return re.split(r"\s{2,}", line.strip())


def test_our_side_runs_alone_without_the_lerobot_venv(bench, tmp_path, capsys):
    missing = tmp_path / "no-venv" / "bin" / "python"
    assert bench.main([*TINY, "--lerobot-python", str(missing), "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"skipped: lerobot 0.6 venv not found at {missing}" in out
    assert "lerobot_venv.sh 0.6.1" in out
    assert "StreamingLeRobotDataset," not in out
    cold = _row(out, "torchstore WindowStorage from hf://, cold cache")
    warm = _row(out, "torchstore WindowStorage from hf://, warm cache")
    iid = _row(out, "i.i.d. uniform over the rows")
    # loader, first batch s, samples/s, vs lerobot, requests, ranged, >= 400, MiB sent, spread
    assert int(cold[5]) > 0 and float(cold[7]) > 0 and cold[6] == "0"
    assert int(warm[5]) == 0 and warm[7] == "0.00"  # every range from the cache
    for row in (cold, warm, iid):
        assert len(row) == 12 and re.fullmatch(r"\d+/8", row[8])
    assert not list(tmp_path.iterdir())  # the scratch folder is removed


def test_the_spread_is_zero_for_draws_in_proportion_and_large_for_one_episode(bench):
    lengths = np.array([30, 10, 20])
    rows = torch.arange(60)  # every row once: each episode drawn its expected share
    assert bench.spread(bench.episode_of(rows, lengths), lengths, 60) == ("3/3", "3", "0.00", "0.0")
    # in batches of 20 rows in order: episode 0, episodes 0 and 1, episode 2
    assert bench.spread(bench.episode_of(rows, lengths), lengths, 20)[1] == "1"
    one = bench.spread(torch.zeros(60, dtype=torch.int64), lengths, 20)
    assert one[:2] == ("1/3", "1") and float(one[2]) > 1 and float(one[3]) > 10


@pytest.mark.slow  # lerobot's interpreter starts: about 13-17 s on 2 busy cores
@pytest.mark.skipif(
    not LEROBOT_PYTHON.exists(),
    reason="the lerobot 0.6 venv (bash tests/lerobot/lerobot_venv.sh 0.6.1 /tmp/lr06)",
)
def test_lerobot_streaming_from_the_same_hub(bench, tmp_path, capsys):
    assert bench.main([*TINY, "--lerobot-python", str(LEROBOT_PYTHON), "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out
    theirs = _row(out, "lerobot StreamingLeRobotDataset,")
    assert theirs[3] == "1.00x" and int(theirs[4]) > 0 and re.fullmatch(r"\d+/8", theirs[8])
    ours = _row(out, "torchstore WindowStorage from hf://, warm cache")
    assert ours[3].endswith("x") and ours[3] != "-"
