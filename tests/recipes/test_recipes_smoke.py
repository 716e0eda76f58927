"""Each recipe end to end, as a user runs it (``python recipes/X.py overrides``), in smoke size.

Run from a scratch folder, so the recipes must find the shipped data and configs relative to
the repository, not the working directory.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["trainer.enable_progress_bar=false"]

SMOKES = {
    "bc": ["trainer.max_steps=20", "eval.episodes=2", *QUIET],
    "offline_rl": [
        "trainer.max_steps=20",
        "eval.episodes=2",
        "datamodule.sampler=prioritized",
        *QUIET,
    ],
    "sac": [
        "collector.total_frames=300",
        "collector.init_random_frames=100",
        "updates_per_frame=0.5",
        "eval.episodes=1",
        "eval.max_steps=50",
        "sampler=prioritized",
        "sampler.ere=true",
    ],
    "sac_uniform": [
        "collector.total_frames=200",
        "collector.init_random_frames=100",
        "updates_per_frame=0.25",
        "eval.episodes=1",
        "eval.max_steps=20",
    ],
}
EXPECT = {
    "bc": "learned",
    "offline_rl": "TD3+BC",
    "sac": "mean return",
    "sac_uniform": "mean return",
}


@pytest.mark.parametrize("name", list(SMOKES))
def test_recipe_smoke(name, tmp_path):
    script = ROOT / "recipes" / f"{name.split('_uniform')[0]}.py"
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), *SMOKES[name], f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert EXPECT[name] in proc.stdout
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2 and "step" in rows[0]
    assert any(k.startswith("eval/") and v for row in rows for k, v in row.items())
    assert (run_dir / "loss.png").stat().st_size > 5_000
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert (
        not any(tmp_path.glob("*.stats.json"))
        and not (ROOT / "data" / "reach_demo.h5.stats.json").exists()
    )
