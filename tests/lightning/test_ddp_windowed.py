"""Two-process CPU DDP (gloo) over a windowed store: disjoint blocks, exact resume per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchstore.demo import write_demo_store

WORKER = Path(__file__).with_name("ddp_window_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_windowed")
    store = write_demo_store(tmp / "demo.h5", episodes=8, steps=30)  # 240 rows, 12 blocks
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
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)], out


def test_ranks_read_disjoint_blocks(ddp_run):
    (r0, r1), _ = ddp_run
    assert (r0["rank"], r1["rank"]) == (0, 1)
    blocks0, blocks1 = set(r0["order"]), set(r1["order"])
    assert not blocks0 & blocks1
    assert sorted(blocks0 | blocks1) == [(20 * i, 20 * i + 20) for i in range(12)]
    for r, blocks in ((r0, blocks0), (r1, blocks1)):
        assert r["phase"] + 2 <= r["per_epoch"]  # still inside epoch 0's blocks
        for row in r["rows"].reshape(-1).tolist():
            assert any(lo <= row < hi for lo, hi in blocks), row
    assert not set(r0["rows"].reshape(-1).tolist()) & set(r1["rows"].reshape(-1).tolist())


def test_resume_restores_each_ranks_window(ddp_run):
    (r0, r1), out = ddp_run
    for r in (r0, r1):
        assert r["resumed_steps"] == 6
        assert torch.equal(r["resumed"], r["rows"][3:])
    state = torch.load(out / "windowed.ckpt", weights_only=True)["OfflineDataModule"]
    assert [s["rank"] for s in state["ranks"]] == [0, 1]
    assert all("window" in s for s in state["ranks"])
