"""Offline RL: TD3+BC (Fujimoto & Gu 2021) on logged transitions, evaluated by rollouts.

    python recipes/offline_rl.py                                  # ~2 CPU minutes
    python recipes/offline_rl.py datamodule.sampler=prioritized
    python recipes/offline_rl.py trainer.max_steps=20 eval.episodes=2          # smoke

Data: the default task's store (``data/reach_demo.h5``) through ``OfflineDataModule`` with
``layout="torchrl"``: ``state``, ``action``, ``("next", "state")``, ``("next", "reward")``,
``("next", "done")``, ``("next", "terminated")``, so ``torchrl.objectives.TD3BCLoss`` takes
a batch as it is (scalar columns get a trailing dim). A Lightning ``Trainer`` runs the
updates: critics every step, actor and target networks every ``policy_delay`` steps; with
``datamodule.sampler=prioritized`` the loss's TD errors become the rows' priorities (and its
importance weights are applied by the loss).
Evaluation rolls the deterministic actor out in ``ReachTask``.

Outputs (``outputs/offline_rl/<time>/``, printed at the start and the end): ``config.yaml``,
``metrics.csv``, ``loss.png``, ``policy.safetensors`` (the actor), ``last.ckpt`` and
``offline_rl.log``. ``python recipes/rollout.py outputs/offline_rl/<time>`` rolls the saved
actor out again; ``resume=outputs/offline_rl/<time>`` continues the run from ``last.ckpt``.
"""

from __future__ import annotations

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
from tensordict.nn import TensorDictModule
from torchrl.modules import ValueOperator
from torchrl.objectives import SoftUpdate

OBS = "state"
POLICY_NAME = "TD3+BC"
SCALARS = (("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated"))


class TD3BC(L.LightningModule):
    """TD3+BC with torchrl's loss; one optimizer (the actor's grads are ``None`` when it skips)."""

    def __init__(self, cfg: DictConfig, obs_dim: int, action_dim: int):
        super().__init__()
        actor_net = torch.nn.Sequential(
            instantiate(cfg.actor, in_features=obs_dim, out_features=action_dim), torch.nn.Tanh()
        )
        self.actor = TensorDictModule(actor_net, in_keys=[OBS], out_keys=["action"])
        critic = ValueOperator(
            instantiate(cfg.critic, in_features=obs_dim + action_dim, out_features=1),
            in_keys=[OBS, "action"],
        )
        self.loss = instantiate(cfg.loss)(
            actor_network=self.actor, qvalue_network=critic, bounds=(-1.0, 1.0)
        )
        self.loss.make_value_estimator(gamma=cfg.gamma)
        self.target_update = SoftUpdate(self.loss, tau=cfg.tau)
        self.policy_delay = cfg.policy_delay
        self._optimizer = instantiate(cfg.optimizer)

    @staticmethod
    def _prepare(batch):
        for key in SCALARS:  # torchrl losses expect [B, 1] rewards and flags
            if key in batch.keys(include_nested=True) and batch.get(key).ndim == 1:
                batch.set(key, batch.get(key).unsqueeze(-1))
        return batch

    def training_step(self, batch, batch_idx):
        losses = self.loss(self._prepare(batch))
        total = losses["loss_qvalue"]
        if "priority_weight" in batch.keys():  # sampler=prioritized: |TD error| as priority
            self.trainer.datamodule.update_priority(batch["index"], batch["td_error"].detach())
        if self.global_step % self.policy_delay == 0:
            total = total + losses["loss_actor"]
        for key in ("loss_qvalue", "loss_actor", "bc_loss"):
            self.log(
                f"train/{key}",
                losses[key],
                prog_bar=key == "loss_qvalue",
                batch_size=batch.shape[0],
            )
        return total

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (self.global_step - 1) % self.policy_delay == 0:
            self.target_update.step()

    def validation_step(self, batch, batch_idx):
        losses = self.loss(self._prepare(batch))
        self.log("val/loss_qvalue", losses["loss_qvalue"], batch_size=batch.shape[0])
        self.log("val/bc_loss", losses["bc_loss"], batch_size=batch.shape[0])

    def configure_optimizers(self):
        return self._optimizer(self.loss.parameters())

    @torch.no_grad()
    def act(self, obs) -> np.ndarray:
        return DeterministicActor(self.actor.module)(obs)


class DeterministicActor:
    """The trained actor network as a task policy: observation -> action in ``[-1, 1]``."""

    def __init__(self, net: torch.nn.Module):
        self.net = net.eval()

    @torch.no_grad()
    def __call__(self, obs) -> np.ndarray:
        state = torch.as_tensor(obs[OBS], dtype=torch.float32)
        return self.net(state.unsqueeze(0))[0].numpy()


def policy_tensors(model: TD3BC) -> dict[str, torch.Tensor]:
    """The actor network's weights (the critics are not part of the policy)."""
    return {f"actor.{k}": v for k, v in model.actor.module.state_dict().items()}


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> DeterministicActor:
    """The run's actor, from its config and :func:`policy_tensors`."""
    obs_dim, action_dim = mlp_io(state, "actor.")
    net = torch.nn.Sequential(
        instantiate(cfg.model.actor, in_features=obs_dim, out_features=action_dim), torch.nn.Tanh()
    )
    net.load_state_dict(strip(state, "actor."))
    return DeterministicActor(net)


def rollout_saved(cfg: DictConfig, policy: DeterministicActor, episodes: int | None = None) -> str:
    """Evaluate a saved actor exactly as the run did (same task, reset seeds, table row)."""
    return rollout_row(cfg, POLICY_NAME, policy, episodes)


@hydra.main(config_path="../configs", config_name="offline_rl", version_base=None)
def main(cfg: DictConfig) -> float:
    cfg = prepared_config(cfg)
    with recipe_run(cfg, "offline_rl") as run:
        store = open_demo_store(cfg.store)
        task = reach_task(store)
        obs_dim, action_dim = store.column(OBS).shape[0], store.column("action").shape[0]
        dm = instantiate(cfg.datamodule, store=store)
        model = TD3BC(cfg.model, obs_dim, action_dim)
        trainer = run.trainer(cfg.trainer)
        run.policy_tensors = lambda: (policy_tensors(model), trainer.global_step)
        run.fit(trainer, model, dm)

        model.eval()
        policies = {POLICY_NAME: model.act, **reach_baselines(store, cfg.seed)}
        results = evaluate_policies(run, cfg, task, policies, trainer.global_step)
        run.log.info(f"\n{store.num_rows} transitions, {trainer.global_step} gradient steps")
    return results[POLICY_NAME]["success_rate"]


if __name__ == "__main__":
    main()
