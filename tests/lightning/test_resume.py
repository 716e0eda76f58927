"""A run resumed from a Lightning checkpoint draws exactly the batches of an uninterrupted run.

For each DataModule configuration:

- run A fits 10 steps uninterrupted (4 batches per epoch) and records every batch's rows;
- run B fits the same configuration but stops after 7 steps, saving checkpoints after steps
  3 and 6 (mid-epoch) and at the end of epoch 0 (step 4, an epoch boundary);
- from each checkpoint, a fresh Trainer, model and DataModule resume to step 10.

B's batches equal A's first 7, and every resumed run's batches equal A's from the
checkpoint's step on. With ``sampler="prioritized"`` the model sets priorities from the
rows it sees, so the resumed draws also depend on the restored sum-tree.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_fixtures import QUIET, Recorder, demo_xy, offline_xy

from torchstore.demo import write_demo_store
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule

CHECKPOINTING = {k: v for k, v in QUIET.items() if k != "enable_checkpointing"}

CONFIGS = {
    "offline-uniform": lambda p: (
        OfflineDataModule(p, batch_size=8, steps_per_epoch=4, seed=11, val_episodes=1),
        Recorder(offline_xy, 3, 1),
    ),
    "offline-prioritized": lambda p: (
        OfflineDataModule(
            p, batch_size=8, steps_per_epoch=4, sampler="prioritized", layout="torchrl"
        ),
        Recorder(offline_xy, 3, 1, priority=True),
    ),
    "demonstration": lambda p: (
        DemonstrationDataModule(
            p,
            batch_size=8,
            obs_keys=["obs"],
            action_keys=["action"],
            n_obs_steps=2,
            action_horizon=4,
            steps_per_epoch=4,
            seed=2,
        ),
        Recorder(demo_xy, 6, 4),
    ),
}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(tmp_path_factory.mktemp("resume") / "demo.h5", episodes=5, steps=20)


def fit(config, store_path, max_steps, *, callbacks=(), ckpt_path=None):
    dm, model = CONFIGS[config](store_path)
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
        limit_val_batches=1,
        **CHECKPOINTING,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    assert trainer.global_step == max_steps
    return [rows.tolist() for rows in model.seen]


@pytest.mark.filterwarnings("ignore:.*callbacks used to create the checkpoint")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_resume_draws_the_uninterrupted_batches(config, store_path, tmp_path):
    a = fit(config, store_path, 10)
    assert len(a) == 10 and len({tuple(rows) for rows in a}) == 10

    steps = ModelCheckpoint(
        dirpath=tmp_path, filename="step{step}", every_n_train_steps=3, save_top_k=-1
    )
    epochs = ModelCheckpoint(
        dirpath=tmp_path,
        filename="epoch{epoch}",
        every_n_epochs=1,
        save_on_train_epoch_end=True,
        save_top_k=-1,
    )
    b = fit(config, store_path, 7, callbacks=[steps, epochs])
    assert b == a[:7]

    checkpoints = {3: "step=3", 6: "step=6", 4: "epoch=0"}  # mid-epoch, mid-epoch, boundary
    for step, name in checkpoints.items():
        path = tmp_path / f"{'step' if name.startswith('step') else 'epoch'}{name}.ckpt"
        state = torch.load(path, weights_only=True)
        assert state["global_step"] == step
        assert type(CONFIGS[config](store_path)[0]).__name__ in state  # the sampler state
        resumed = fit(config, store_path, 10, ckpt_path=path)
        assert resumed == a[step:], f"resumed from {path.name}"
