"""Two-process CPU DDP (gloo) through Lightning's own ``ddp`` launcher (see ddp_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchstore.demo import write_demo_store

WORKER = Path(__file__).with_name("ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]
EPISODES, STEPS = 8, 30


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    store = write_demo_store(tmp / "demo.h5", episodes=EPISODES, steps=STEPS)
    out = tmp / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(store), str(out)],
        cwd=WORKER.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return ranks, out


def test_ranks_draw_different_batches_and_training_completes(ddp_run):
    (r0, r1), _ = ddp_run
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["offline_steps"] == r1["offline_steps"] == 4
    assert r0["offline"].shape == r1["offline"].shape == (4, 16)
    for a, b in zip(r0["offline"], r1["offline"]):
        assert not torch.equal(a, b)
    train_rows = (EPISODES - 1) * STEPS
    assert int(r0["offline"].max()) < train_rows and int(r1["offline"].max()) < train_rows
    # every rank validates on every validation row
    assert (
        r0["val_rows"].tolist()
        == r1["val_rows"].tolist()
        == list(range(train_rows, EPISODES * STEPS))
    )


def test_shard_episodes_gives_each_rank_its_own_episodes(ddp_run):
    (r0, r1), _ = ddp_run
    assert set(r0["demo_episodes"].tolist()) <= {0, 2, 4, 6}
    assert set(r1["demo_episodes"].tolist()) <= {1, 3, 5, 7}


def test_resume_restores_each_ranks_own_sampler_state(ddp_run):
    (r0, r1), out = ddp_run
    for r in (r0, r1):
        assert r["resumed_steps"] == 6
        assert torch.equal(r["resumed"], r["prioritized"][3:])
    state = torch.load(out / "prioritized.ckpt", weights_only=True)["OfflineDataModule"]
    assert state["world_size"] == 2 and [s["rank"] for s in state["ranks"]] == [0, 1]
    raw = [s["priorities"]["raw"] for s in state["ranks"]]
    assert not torch.equal(raw[0], raw[1])  # each rank set priorities from its own batches
