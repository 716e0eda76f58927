"""Behaviour cloning from robomimic-layout demonstrations (robomimic, MimicGen, LIBERO,
Isaac Lab), with image and low-dimensional observation keys chosen in the config.

    torchstore import lift_image.hdf5 lift.h5        # once: any robomimic-layout file
    python recipes/bc_robomimic.py store.path=lift.h5
    python recipes/bc_robomimic.py store.path=lift.h5 'obs.rgb=[obs/agentview_image]' \
        'obs.low_dim=[obs/robot0_eef_pos,obs/object]' datamodule.action_horizon=8

Data: ``DemonstrationDataModule`` reads observation histories and action chunks from the
imported store (``obs.low_dim`` and ``obs.rgb`` are store columns: robomimic's
``obs/<key>``); validation is robomimic's own ``valid`` filter key when the file has one
(``datamodule.val_episodes=valid``), else a fraction. Policy: each camera through a small
conv encoder (uint8 ``[H, W, 3]`` scaled to ``[0, 1]`` on the device), concatenated with the
normalised low-dim keys over the history, an MLP to the action chunk, trained with a
masked MSE by a Lightning ``Trainer``. robomimic's simulators (robosuite, LIBERO) are not
dependencies, so the run reports losses, not rollouts.

Outputs (``outputs/bc_robomimic/<time>/``): ``config.yaml``, ``metrics.csv``, ``loss.png``,
``policy.safetensors``, ``last.ckpt`` and ``bc_robomimic.log``;
``resume=outputs/bc_robomimic/<time>`` continues a run from its ``last.ckpt``.
"""

from __future__ import annotations

import math

import hydra
import lightning as L
import torch
from _common import open_demo_store, recipe_run, run_config, strip
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from torchstore.data.columns import column_key
from torchstore.training import describe_validation, masked_mse


def camera_encoder(channels: int, features: int) -> nn.Module:
    """A small conv net: ``[N, C, H, W]`` float -> ``[N, features]`` (any image size)."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, features),
    )


class VisuomotorPolicy(L.LightningModule):
    """Observation history (cameras and low-dim keys) -> action chunk ``[B, T_a, A]``."""

    def __init__(
        self,
        low_dim: dict,
        rgb: dict,
        n_obs_steps: int,
        horizon: int,
        action_dim: int,
        hidden: int,
        features: int,
        lr: float,
    ):
        super().__init__()
        self.low_dim, self.rgb = dict(low_dim), dict(rgb)  # column -> per-step size / channels
        self.horizon, self.action_dim, self.lr = horizon, action_dim, lr
        self.cameras = nn.ModuleList(camera_encoder(c, features) for c in self.rgb.values())
        step = sum(self.low_dim.values()) + features * len(self.rgb)
        self.net = nn.Sequential(
            nn.Linear(n_obs_steps * step, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, horizon * action_dim),
        )

    def forward(self, obs) -> torch.Tensor:
        parts = [obs[column_key(k)].flatten(2).float() for k in self.low_dim]
        for name, encoder in zip(self.rgb, self.cameras):
            frames = obs[column_key(name)]  # [B, T, H, W, C] uint8
            b, t = frames.shape[:2]
            x = frames.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
            parts.append(encoder(x).unflatten(0, (b, t)))
        chunk = self.net(torch.cat(parts, -1).flatten(1))
        return chunk.unflatten(-1, (self.horizon, self.action_dim))

    def _loss(self, batch) -> torch.Tensor:
        # steps of a chunk past its episode's end are padding: action_mask leaves them out
        return masked_mse(self(batch["obs"]), batch["action", "action"], batch["action_mask"])

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch), prog_bar=True, batch_size=batch.shape[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _sizes(store, cfg: DictConfig) -> tuple[dict, dict]:
    low_dim = {k: math.prod(store.column(k).shape) for k in cfg.obs.low_dim}
    rgb = {}
    for k in cfg.obs.rgb:
        spec = store.column(k)
        if spec.dtype != torch.uint8 or len(spec.shape) != 3:
            raise ValueError(
                f"obs.rgb key {k!r} is {spec.dtype} {tuple(spec.shape)}, not uint8 HWC"
            )
        rgb[k] = int(spec.shape[-1])
    return low_dim, rgb


def _model(cfg: DictConfig, low_dim: dict, rgb: dict, action_dim: int) -> VisuomotorPolicy:
    return VisuomotorPolicy(
        low_dim,
        rgb,
        cfg.datamodule.n_obs_steps,
        cfg.datamodule.action_horizon,
        action_dim,
        cfg.model.hidden,
        cfg.model.features,
        cfg.model.lr,
    )


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> VisuomotorPolicy:
    """The trained network of a run, from its config and its saved tensors."""
    meta = OmegaConf.to_container(cfg.policy_shapes)
    model = _model(cfg, meta["low_dim"], meta["rgb"], meta["action_dim"])
    model.load_state_dict(strip(state, "model."))
    return model.eval()


def rollout_saved(cfg: DictConfig, policy, episodes: int | None = None) -> str:
    raise ValueError(
        "bc_robomimic has no simulator to roll out in (robosuite / LIBERO are not "
        "dependencies); load the policy with load_policy(...).policy and run it in yours"
    )


@hydra.main(config_path="../configs", config_name="bc_robomimic", version_base=None)
def main(cfg: DictConfig) -> float:
    cfg = run_config(cfg)
    torch.set_num_threads(cfg.threads)
    L.seed_everything(cfg.seed, verbose=False)
    with recipe_run(cfg, "bc_robomimic") as run:
        store = open_demo_store(cfg.store)
        low_dim, rgb = _sizes(store, cfg)
        keys = [*cfg.obs.low_dim, *cfg.obs.rgb]
        dm = instantiate(cfg.datamodule, store=store, obs_keys=keys, action_keys=["action"])
        action_dim = math.prod(store.column("action").shape)
        model = _model(cfg, low_dim, rgb, action_dim)
        with open_dict(cfg):  # what policy_from_weights needs to rebuild the network
            cfg.policy_shapes = {"low_dim": low_dim, "rgb": rgb, "action_dim": action_dim}
        run.folder.write_config(cfg)
        trainer = run.trainer(cfg.trainer)
        run.policy_tensors = lambda: (
            {f"model.{k}": v for k, v in model.state_dict().items()},
            trainer.global_step,
        )
        run.fit(trainer, model, dm)
        val = trainer.callback_metrics.get("val/loss")
        run.log.info(
            f"{store.num_episodes} demonstrations ({len(dm.split.train)} train, "
            f"{len(dm.split.val)} validation), {trainer.global_step} gradient steps, "
            f"{describe_validation(val)}"
        )
    return float(val) if val is not None else float("nan")


if __name__ == "__main__":
    main()
