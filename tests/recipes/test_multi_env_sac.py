"""Smoke run of the multi-env SAC recipe: a SerialEnv of 3 envs into StoreReplay(ndim=2).

The collector hands over ``[n_envs, T]`` batches; they go as they are into a multi-env
ring, and the length-4 windows the learner samples stay inside one env's stream.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SMOKE = [
    "envs=3",
    "window=4",
    "batch_size=32",
    "collector.frames_per_batch=48",  # 16 steps of each of the 3 envs per batch
    "collector.total_frames=288",
    "collector.init_random_frames=144",
    "updates_per_frame=0.25",
    "eval.episodes=1",
    "eval.max_steps=20",
]


def test_multi_env_sac_smoke(tmp_path, preloaded):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = preloaded.run(  # its own process, forked from an interpreter with torch imported
        [sys.executable, str(ROOT / "recipes" / "sac.py"), *SMOKE, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "replay: StoreReplay(ndim=2) over 3 env(s), SequenceWindowSampler(length=4" in out
    assert "frames 288, gradient steps 48" in out
    assert any(line.startswith("evaluation: mean return ") for line in out.splitlines())
    assert (run_dir / "policy.safetensors").is_file()
    assert "Traceback" not in out
