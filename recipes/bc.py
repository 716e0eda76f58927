"""Behaviour cloning on the default task's demonstrations, then rollouts in that task.

    python recipes/bc.py                                   # about half a CPU minute
    python recipes/bc.py datamodule.action_horizon=8 exec_horizon=4
    python recipes/bc.py trainer.max_steps=20 eval.episodes=2          # smoke

Data: ``data/reach_demo.h5`` (shipped; ``torchstore demo data/reach_demo.h5 --task reach``
rebuilds it), read by ``DemonstrationDataModule`` as observation histories
``[B, n_obs_steps, 6]`` and action chunks ``[B, action_horizon, 2]``, normalised. Policy:
an MLP from the flattened history to the flattened chunk, trained with a masked MSE by a
Lightning ``Trainer``. Evaluation:
the policy drives ``ReachTask`` (rebuilt from the store's manifest) on fresh reset seeds,
re-planning every ``exec_horizon`` steps; its success rate is printed next to the scripted
expert's and a random policy's.

Outputs (``outputs/bc/<time>/``, printed at the start and the end): ``config.yaml``,
``metrics.csv``, ``loss.png``, ``policy.safetensors``, ``last.ckpt`` and ``bc.log``.
``python recipes/rollout.py outputs/bc/<time>`` rolls the saved policy out again;
``python recipes/bc.py resume=outputs/bc/<time> trainer.max_steps=4000`` trains it on.
"""

from __future__ import annotations

import abc
from collections import deque

import hydra
import lightning as L
import numpy as np
import torch
from _common import (
    evaluate_policies,
    mlp_io,
    open_demo_store,
    prepared_config,
    reach_baselines,
    reach_task,
    recipe_run,
    rollout_row,
    strip,
)
from hydra.utils import instantiate
from omegaconf import DictConfig

from torchstore.data.columns import column_key
from torchstore.training import PolicyFile, masked_mse


class ChunkRegression(L.LightningModule, abc.ABC):
    """A behaviour-cloning policy's training: the masked MSE between the chunk it predicts
    for a batch (:meth:`predict_chunk`) and the batch's action chunk (:meth:`target`); steps
    of a chunk past its episode's end are padding, which ``action_mask`` leaves out."""

    @abc.abstractmethod
    def predict_chunk(self, batch) -> torch.Tensor:
        """The policy's chunk for a batch, ``[B, T_a, A]`` (each policy reads its own keys)."""

    def target(self, batch) -> torch.Tensor:
        return batch["action", "action"]

    def mask(self, batch) -> torch.Tensor:
        return batch["action_mask"]

    def _loss(self, batch) -> torch.Tensor:
        return masked_mse(self.predict_chunk(batch), self.target(batch), self.mask(batch))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch), prog_bar=True, batch_size=batch.shape[0])


class BCPolicy(ChunkRegression):
    """MLP: normalised observation history ``[B, T_o, D]`` -> action chunk ``[B, T_a, A]``.

    ``obs_keys``: the state columns whose values, side by side, make ``D``."""

    def __init__(
        self,
        net: torch.nn.Module,
        n_obs_steps: int,
        action_horizon: int,
        action_dim: int,
        optimizer,
        scheduler=None,
        obs_keys: tuple[str, ...] = ("state",),
    ):
        super().__init__()
        self.net, self.obs_keys = net, tuple(obs_keys)
        self.n_obs_steps, self.action_horizon, self.action_dim = (
            n_obs_steps,
            action_horizon,
            action_dim,
        )
        self._optimizer, self._scheduler = optimizer, scheduler

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        chunk = self.net(obs.flatten(-2))
        return chunk.unflatten(-1, (self.action_horizon, self.action_dim))

    def predict_chunk(self, batch) -> torch.Tensor:
        return self(torch.cat([batch["obs"][column_key(k)] for k in self.obs_keys], -1))

    def configure_optimizers(self):
        optim = self._optimizer(self.parameters())
        if self._scheduler is None:
            return optim
        return {
            "optimizer": optim,
            "lr_scheduler": {"scheduler": self._scheduler(optim), "interval": "step"},
        }


class ChunkedPolicy:
    """Runs a :class:`BCPolicy` in the task: keeps the observation history, re-plans every
    ``exec_horizon`` steps, and maps normalised actions back to task units."""

    def __init__(self, model: BCPolicy, normalizer, exec_horizon: int):
        if not 1 <= exec_horizon <= model.action_horizon:
            raise ValueError(
                f"exec_horizon ({exec_horizon}) must be in "
                f"[1, action_horizon={model.action_horizon}]"
            )
        self.model, self.normalizer, self.exec_horizon = model.eval(), normalizer, exec_horizon
        self.reset()

    def reset(self) -> None:
        self.history: deque = deque(maxlen=self.model.n_obs_steps)
        self.queue: deque = deque()

    def _observation(self, obs) -> torch.Tensor:
        """The task's observation as the policy reads a batch's: its ``obs_keys`` normalised
        and side by side."""
        parts = []
        for key in self.model.obs_keys:
            x = torch.as_tensor(obs[key], dtype=torch.float32)
            parts.append(x if self.normalizer is None else self.normalizer.normalize(key, x))
        return torch.cat(parts, -1)

    @torch.no_grad()
    def __call__(self, obs) -> np.ndarray:
        x = self._observation(obs)
        if not self.history:  # the data module pads an episode's start by repeating its first row
            self.history.extend([x] * self.model.n_obs_steps)
        self.history.append(x)
        if not self.queue:
            chunk = self.model(torch.stack(list(self.history)).unsqueeze(0))[0]
            if self.normalizer is not None:
                chunk = self.normalizer.unnormalize("action", chunk)
            self.queue.extend(chunk[: self.exec_horizon].numpy())
        return self.queue.popleft()


def policy_tensors(model: BCPolicy) -> dict[str, torch.Tensor]:
    """The net's weights; the run saves the data module's normaliser beside them."""
    return {f"net.{k}": v for k, v in model.net.state_dict().items()}


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> ChunkedPolicy:
    """The :class:`ChunkedPolicy` of a run, from its config and its saved tensors."""
    saved = PolicyFile(state)
    n_obs, horizon = cfg.datamodule.n_obs_steps, cfg.datamodule.action_horizon
    in_features, out_features = mlp_io(saved.tensors, "net.")
    net = instantiate(cfg.model.net, in_features=in_features, out_features=out_features)
    net.load_state_dict(strip(saved.tensors, "net."))
    obs_keys = tuple(cfg.datamodule.obs_keys)
    model = BCPolicy(net, n_obs, horizon, out_features // horizon, None, obs_keys=obs_keys)
    normalizer = saved.normalizer(cfg.datamodule.get("normalization", "mean_std"))
    return ChunkedPolicy(model, normalizer, cfg.exec_horizon)


def rollout_saved(cfg: DictConfig, policy: ChunkedPolicy, episodes: int | None = None) -> str:
    """Evaluate a saved policy exactly as the run did (same task, reset seeds, table row)."""
    return rollout_row(cfg, "learned", policy, episodes)


@hydra.main(config_path="../configs", config_name="bc", version_base=None)
def main(cfg: DictConfig) -> float:
    cfg = prepared_config(cfg)
    with recipe_run(cfg, "bc") as run:
        store = open_demo_store(cfg.store)
        task = reach_task(store)
        dm = instantiate(cfg.datamodule, store=store)
        dm.setup("fit")
        obs_keys = tuple(cfg.datamodule.obs_keys)
        obs_dim = sum(store.column(k).shape[0] for k in obs_keys)
        action_dim = store.column("action").shape[0]
        n_obs, horizon = cfg.datamodule.n_obs_steps, cfg.datamodule.action_horizon

        net = instantiate(
            cfg.model.net, in_features=n_obs * obs_dim, out_features=horizon * action_dim
        )
        model = BCPolicy(
            net,
            n_obs,
            horizon,
            action_dim,
            instantiate(cfg.model.optimizer),
            instantiate(cfg.model.scheduler) if cfg.model.get("scheduler") else None,
            obs_keys=obs_keys,
        )
        trainer = run.trainer(cfg.trainer)
        run.policy_tensors = lambda: (policy_tensors(model), trainer.global_step)
        run.normalizer = dm.normalizer
        run.fit(trainer, model, dm)

        learned = ChunkedPolicy(model, dm.normalizer, cfg.exec_horizon)
        policies = {"learned": learned, **reach_baselines(store, cfg.seed)}
        results = evaluate_policies(run, cfg, task, policies, trainer.global_step)
        run.log.info(f"\n{store.num_episodes} demonstrations, {trainer.global_step} gradient steps")
    return results["learned"]["success_rate"]


if __name__ == "__main__":
    main()
