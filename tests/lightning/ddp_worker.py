"""Two-rank CPU DDP fits for test_ddp.py; run as ``python ddp_worker.py STORE OUT``.

Lightning's ``ddp`` strategy relaunches this script for rank 1. Each rank writes what it
saw to ``OUT/rank{r}.pt``:

- ``offline``: rows of every batch, uniform sampling, all episodes on both ranks;
- ``prioritized`` / ``resumed``: an uninterrupted prioritized run of 6 steps, and a run
  stopped after 3 steps, checkpointed (``OUT/prioritized.ckpt``) and resumed to 6 in a
  fresh Trainer and DataModule;
- ``demo_episodes``: episodes of every sample with ``shard_episodes=True``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning_fixtures import QUIET, Recorder, demo_xy, offline_xy

from torchstore.lightning import DemonstrationDataModule, OfflineDataModule

DDP = {**QUIET, "strategy": "ddp", "devices": 2}


def fit(dm, model, max_steps, ckpt_path=None, save=None):
    trainer = pl.Trainer(max_steps=max_steps, **DDP)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(save)  # a collective: every rank takes part
    return trainer


def prioritized(store):
    dm = OfflineDataModule(store, batch_size=16, steps_per_epoch=4, sampler="prioritized", seed=5)
    return dm, Recorder(offline_xy, 3, 1, priority=True)


def main() -> None:
    store, out = sys.argv[1], Path(sys.argv[2])
    result = {}

    dm = OfflineDataModule(store, batch_size=16, steps_per_epoch=3, val_episodes=1, seed=3)
    model = Recorder(offline_xy, 3, 1)
    trainer = fit(dm, model, 4)
    result.update(
        offline=torch.stack(model.seen),
        offline_steps=trainer.global_step,
        val_rows=torch.cat(model.val_rows),
        rank=trainer.global_rank,
    )

    model = prioritized(store)[1]
    fit(prioritized(store)[0], model, 6)
    result["prioritized"] = torch.stack(model.seen)
    ckpt = out / "prioritized.ckpt"
    fit(*prioritized(store), 3, save=ckpt)
    model = prioritized(store)[1]
    trainer = fit(prioritized(store)[0], model, 6, ckpt_path=ckpt)
    result.update(resumed=torch.stack(model.seen), resumed_steps=trainer.global_step)

    dm = DemonstrationDataModule(
        store,
        batch_size=16,
        obs_keys=["obs"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=4,
        steps_per_epoch=3,
        shard_episodes=True,
        stats_cache=False,
    )
    model = Recorder(demo_xy, 6, 4)
    episodes = []
    model.training_step = _recording_episodes(model, episodes)
    fit(dm, model, 3)
    result["demo_episodes"] = torch.cat(episodes)

    torch.save(result, out / f"rank{result['rank']}.pt")


def _recording_episodes(model, episodes):
    step = model.training_step

    def training_step(batch, batch_idx):
        episodes.append(batch["episode"].clone())
        return step(batch, batch_idx)

    return training_step


if __name__ == "__main__":
    main()
