"""Two-rank CPU DDP fits over a windowed store for test_ddp_windowed.py.

Run as ``python ddp_window_worker.py STORE OUT``; Lightning's ``ddp`` strategy relaunches
it for rank 1. Each rank writes ``OUT/rank{r}.pt``:

- ``rows``: rows of every batch of an uninterrupted 6-step prioritized run with a budget;
- ``order``: the blocks ``[lo, hi)`` this rank reads in epoch 0, in order;
- ``resumed``: rows of a run stopped after 3 steps, checkpointed and resumed to 6.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning_fixtures import QUIET, Recorder, offline_xy

from torchstore.lightning import OfflineDataModule

DDP = {**QUIET, "strategy": "ddp", "devices": 2}


def make(store):
    dm = OfflineDataModule(
        store,
        batch_size=16,
        steps_per_epoch=4,
        sampler="prioritized",
        seed=5,
        resident=60,
        resident_blocks=2,
        device="cpu",
    )
    return dm, Recorder(offline_xy, 3, 1, priority=True)


def fit(store, max_steps, ckpt_path=None, save=None):
    dm, model = make(store)
    trainer = pl.Trainer(max_steps=max_steps, **DDP)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(save)  # a collective: every rank takes part
    return trainer, dm, model


def main() -> None:
    store, out = sys.argv[1], Path(sys.argv[2])
    trainer, dm, model = fit(store, 6)
    window = dm.window
    order = [
        (int(window.blocks.lo[b]), int(window.blocks.hi[b])) for b in window.schedule.epoch_order(0)
    ]
    result = {
        "rank": trainer.global_rank,
        "rows": torch.stack(model.seen),
        "order": order,
        "phase": window.schedule.phase,
        "per_epoch": window.schedule.per_epoch,
    }
    dm.close()
    ckpt = out / "windowed.ckpt"
    fit(store, 3, save=ckpt)[1].close()
    trainer, dm, model = fit(store, 6, ckpt_path=ckpt)
    result.update(resumed=torch.stack(model.seen), resumed_steps=trainer.global_step)
    dm.close()
    torch.save(result, out / f"rank{result['rank']}.pt")


if __name__ == "__main__":
    main()
