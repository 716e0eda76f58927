"""recipes/distributed_sac.py end to end in smoke size: 2 collector actors, 1 learner, local Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

from torchstore.data import StoreSet  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


def test_distributed_sac_smoke(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes" / "distributed_sac.py"),
            "rounds=3",
            "frames_per_round=100",
            "init_random_frames=200",
            "batch_size=64",
            "eval.episodes=1",
            "eval.max_steps=30",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert re.search(r"^evaluation: mean return -?\d", text, re.M), text[-2000:]
    assert "gradient steps 200" in text, [
        ln for ln in text.splitlines() if "round" in ln or "steps" in ln
    ]
    (run,) = (tmp_path / "outputs" / "distributed_sac").iterdir()
    for name in ("config.yaml", "metrics.csv", "policy.safetensors", "replay"):
        assert (run / name).exists(), name
    # each collector committed its first 200-step episode to its own shard
    with StoreSet(run / "shards") as shards:
        assert len(shards.shards) == 2 and shards.num_episodes == 2 and len(shards) == 400
    # the buffer's checkpoint loads into the buffer serve_replay(resume=...) builds in its
    # actor (that a new actor resumes a dumps checkpoint is tests/distributed's): built here,
    # it spares this Ray group a second cluster
    from torchrl.data import TensorDictReplayBuffer

    from torchstore import UniformSampler
    from torchstore.data.replay.ring import StoreReplay

    resumed = TensorDictReplayBuffer(
        storage=StoreReplay(100000), sampler=UniformSampler(), batch_size=64
    )
    resumed.loads(str(run / "replay"))
    assert len(resumed) == 600 and resumed.sample().batch_size[0] == 64
    assert resumed.sample(16).batch_size[0] == 16
