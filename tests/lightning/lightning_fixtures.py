"""Tiny LightningModules and Trainer settings for the DataModule tests."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn

QUIET = dict(
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    enable_checkpointing=False,
    num_sanity_val_steps=0,
)


def offline_xy(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Observation and action of an offline batch in either layout."""
    obs = batch["observation"] if "observation" in batch.keys() else batch["obs"]
    return obs, batch["action"]


def demo_xy(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened observation history and action chunk of a demonstration batch."""
    return batch["obs", "obs"].flatten(1), batch["action", "action"].flatten(1)


class Recorder(pl.LightningModule):
    """Regresses y on x with one linear layer and records each training batch's rows.

    ``priority``: set priorities from the batch rows after each step (deterministic, so a
    resumed run can match an uninterrupted one).
    """

    def __init__(self, xy, n_in: int, n_out: int, *, priority: bool = False):
        super().__init__()
        self.xy = xy
        self.layer = nn.Linear(n_in, n_out)
        self.priority = priority
        self.seen: list[torch.Tensor] = []
        self.val_rows: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["index"].clone())
        x, y = self.xy(batch)
        loss = nn.functional.mse_loss(self.layer(x), y)
        if self.priority:
            rows = batch["index"]
            self.trainer.datamodule.update_priority(rows, (rows % 7 + 1).double())
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_rows.append(batch["index"].clone())
        x, y = self.xy(batch)
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), batch_size=x.shape[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
