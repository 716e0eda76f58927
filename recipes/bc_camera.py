"""Behaviour cloning from cameras: any store with camera columns, keys and frames in the config.

    python recipes/bc_camera.py                          # the bundled reach demo, a few CPU minutes
    python recipes/bc_camera.py trainer.max_steps=20 eval.episodes=2          # smoke
    torchstore import path/to/lerobot_dataset aloha.h5   # once: a LeRobot, RLDS or robomimic source
    python recipes/bc_camera.py store.path=aloha.h5 'obs.rgb=[observation.images.top]' \
        'obs.low_dim=[observation.state]' datamodule.action_horizon=50 'datamodule.resident=2GB'

Data: ``DemonstrationDataModule`` reads each sample's observation history (``obs.rgb``
cameras and ``obs.low_dim`` state columns) and its action chunk (``action_keys``) from the
store; ``datamodule.delta_timestamps`` (LeRobot's per-key offsets in seconds) takes the place
of ``n_obs_steps`` / ``action_horizon`` when set. Cameras are ``[H, W, C]`` columns: uint8
(a LeRobot or RLDS import keeps them encoded and the window decodes them on refill) or
floats (the reach demo's quantised pixels). Policy: each camera through a small conv encoder,
concatenated with the state columns over the history, an MLP to the action chunk, trained
with a masked MSE by a Lightning ``Trainer``. Evaluation: when the store holds the reach task's
demonstrations, the policy drives ``ReachTask`` from its camera on fresh reset seeds, beside
the scripted expert and a random policy; any other store reports its validation loss.

Outputs (``outputs/bc_camera/<time>/``, printed at the start and the end): ``config.yaml``,
``metrics.csv``, ``loss.png``, ``policy.safetensors``, ``last.ckpt`` and ``bc_camera.log``.
``python recipes/rollout.py outputs/bc_camera/<time>`` rolls the saved policy out again;
``resume=outputs/bc_camera/<time> trainer.max_steps=4000`` trains it on.
"""

from __future__ import annotations

import math
from collections import deque

import hydra
import numpy as np
import torch
from _common import (
    evaluate_policies,
    open_demo_store,
    prepared_config,
    reach_baselines,
    reach_task,
    recipe_run,
    rollout_row,
    strip,
)
from bc import ChunkRegression
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from torchstore.data.columns import column_key
from torchstore.io.frames.resize import frame_resizes
from torchstore.tasks import TASK_ID
from torchstore.training import PolicyFile, describe_validation


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


class VisuomotorPolicy(ChunkRegression):
    """Observation frames (cameras and state columns) -> action chunk ``[B, T_a, A]``.

    ``low_dim`` maps a state column to its per-step size, ``rgb`` a camera column to its
    channels, ``actions`` an action column to its per-step size: the chunk holds the action
    columns side by side, in that order. ``obs_frames`` maps each observation column to the
    frame offsets it comes with (the data module's: ``n_obs_steps`` frames ending at ``t``
    unless ``frame_offsets`` / ``delta_timestamps`` say otherwise).
    """

    def __init__(
        self,
        low_dim: dict,
        rgb: dict,
        actions: dict,
        obs_frames: dict,
        horizon: int,
        hidden: int,
        features: int,
        lr: float,
    ):
        super().__init__()
        self.low_dim, self.rgb = dict(low_dim), dict(rgb)  # column -> per-step size / channels
        self.actions = dict(actions)
        self.obs_frames = {k: tuple(int(o) for o in v) for k, v in obs_frames.items()}
        self.horizon, self.lr = horizon, lr
        self.action_dim = sum(self.actions.values())
        self.cameras = nn.ModuleList(camera_encoder(c, features) for c in self.rgb.values())
        inputs = sum(len(self.obs_frames[k]) * size for k, size in self.low_dim.items())
        inputs += sum(len(self.obs_frames[k]) * features for k in self.rgb)
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, horizon * self.action_dim),
        )

    def forward(self, obs) -> torch.Tensor:
        parts = [obs[column_key(k)].flatten(1).float() for k in self.low_dim]
        for name, encoder in zip(self.rgb, self.cameras):
            frames = obs[column_key(name)]  # [B, T, H, W, C]: uint8, or floats as stored
            x = frames.flatten(0, 1).permute(0, 3, 1, 2)
            x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
            parts.append(encoder(x).unflatten(0, frames.shape[:2]).flatten(1))
        chunk = self.net(torch.cat(parts, -1))
        return chunk.unflatten(-1, (self.horizon, self.action_dim))

    def target(self, batch) -> torch.Tensor:
        """The batch's action chunk, its ``action_keys`` side by side: ``[B, T_a, A]``."""
        actions = [batch["action"][column_key(k)].flatten(2) for k in self.actions]
        return torch.cat(actions, -1).float()

    def unnormalize(self, normalizer, chunk: torch.Tensor) -> torch.Tensor:
        """A chunk's action columns back in their own units (``[..., A]`` -> ``[..., A]``)."""
        parts = chunk.split(list(self.actions.values()), -1)
        return torch.cat(
            [
                normalizer.unnormalize(k, p) if k in normalizer.keys else p
                for k, p in zip(self.actions, parts)
            ],
            -1,
        )

    def predict_chunk(self, batch) -> torch.Tensor:
        return self(batch["obs"])

    def mask(self, batch) -> torch.Tensor:
        """Which steps of the chunk are real: the first action column's ``<key>_is_pad``
        inverted, when the data module selects its frames per column, else ``action_mask``."""
        pad = batch.get(f"{next(iter(self.actions))}_is_pad", None)
        return batch["action_mask"] if pad is None else ~pad

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class CameraChunkedPolicy:
    """Runs a :class:`VisuomotorPolicy` in a task: task observations (uint8 camera frames,
    float state) made into the columns the policy trained on, a history per key, a chunk
    re-planned every ``exec_horizon`` steps and mapped back to task units."""

    def __init__(
        self,
        model: VisuomotorPolicy,
        normalizer,
        columns: dict,
        exec_horizon: int,
        resizes: dict | None = None,
    ):
        if not 1 <= exec_horizon <= model.horizon:
            raise ValueError(
                f"exec_horizon ({exec_horizon}) must be in [1, action_horizon={model.horizon}]"
            )
        self.model, self.normalizer, self.exec_horizon = model.eval(), normalizer, exec_horizon
        late = {k: o for k, o in model.obs_frames.items() if max(o) > 0}
        if late:
            raise ValueError(
                f"observation frames after t ({late}) cannot be seen in a rollout; "
                "give observation columns offsets <= 0"
            )
        self.columns = columns  # obs key -> its ColumnSpec in the store
        self.resizes = dict(resizes or {})  # camera key -> the FrameResize it trained at
        self.reset()

    def reset(self) -> None:
        self.history = {k: deque(maxlen=1 - min(self.model.obs_frames[k])) for k in self.columns}
        self.queue: deque = deque()

    def _column_value(self, key: str, value) -> torch.Tensor:
        """A task observation as the store's column holds it (then normalised like a batch)."""
        spec, value = self.columns[key], np.asarray(value)
        if key in self.resizes:  # the frames it trained on were resized as they were read
            value = self.resizes[key].apply(value)
        x = torch.as_tensor(value)
        if spec.quantize is not None and x.dtype == torch.uint8:
            x = spec.quantize.decode(x)  # the reach demo keeps pixels as Quantize(0, 1)
        x = x.to(spec.dtype)
        if self.normalizer is not None and key in self.normalizer.keys:
            x = self.normalizer.normalize(key, x)
        return x

    @torch.no_grad()
    def __call__(self, obs) -> np.ndarray:
        for key, history in self.history.items():
            x = self._column_value(key, obs[key])
            if not history:  # the data module pads an episode's start with its first row
                history.extend([x] * history.maxlen)
            history.append(x)
        if not self.queue:
            batch = {
                column_key(k): torch.stack([h[o - 1] for o in self.model.obs_frames[k]])[None]
                for k, h in self.history.items()
            }
            chunk = self.model(batch)[0]
            if self.normalizer is not None:
                chunk = self.model.unnormalize(self.normalizer, chunk)
            self.queue.extend(chunk[: self.exec_horizon].numpy())
        return self.queue.popleft()


def _sizes(store, cfg: DictConfig) -> tuple[dict, dict]:
    """State columns' per-step sizes and cameras' channels; a camera must be ``[H, W, C]``."""
    low_dim = {k: math.prod(store.column(k).shape) for k in cfg.obs.low_dim}
    rgb = {}
    for k in cfg.obs.rgb:
        spec = store.column(k)
        if len(spec.shape) != 3 or spec.shape[-1] not in (1, 3, 4):
            raise ValueError(
                f"obs.rgb key {k!r} is {spec.dtype} {tuple(spec.shape)}, not a camera "
                "column [H, W, C] with C 1, 3 or 4"
            )
        rgb[k] = int(spec.shape[-1])
    if not low_dim and not rgb:
        raise ValueError(
            "the policy needs at least one observation key: set obs.rgb or obs.low_dim"
        )
    return low_dim, rgb


def _model(cfg: DictConfig, shapes: dict) -> VisuomotorPolicy:
    return VisuomotorPolicy(
        shapes["low_dim"],
        shapes["rgb"],
        shapes["actions"],
        shapes["obs_frames"],
        shapes["horizon"],
        cfg.model.hidden,
        cfg.model.features,
        cfg.model.lr,
    )


def _frames(cfg: DictConfig, dm, keys: list[str]) -> tuple[dict, int]:
    """Each observation column's frame offsets and the action chunk's length, as the data
    module selects them (``frame_offsets`` / ``delta_timestamps``, else its two defaults)."""
    asked = dm.frame_offsets or {}
    n_obs, horizon = cfg.datamodule.n_obs_steps, cfg.datamodule.action_horizon
    obs_frames = {k: list(asked.get(k, range(1 - n_obs, 1))) for k in keys}
    lengths = {len(asked.get(k, range(horizon))) for k in cfg.action_keys}
    if len(lengths) != 1:
        raise ValueError(f"action_keys {list(cfg.action_keys)} must share one chunk length")
    return obs_frames, lengths.pop()


def saved_model(cfg: DictConfig, tensors: dict[str, torch.Tensor]) -> VisuomotorPolicy:
    """The trained network of a run, from its config's ``policy_shapes`` and its tensors."""
    model = _model(cfg, OmegaConf.to_container(cfg.policy_shapes))
    model.load_state_dict(strip(tensors, "model."))
    return model.eval()


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> CameraChunkedPolicy:
    """The task-driving policy of a run, from its config and its saved tensors."""
    saved = PolicyFile(state)
    model = saved_model(cfg, saved.tensors)
    normalizer = saved.normalizer(cfg.datamodule.get("normalization", "mean_std"))
    store = open_demo_store(cfg.store)
    columns = {k: store.column(k) for k in [*cfg.obs.low_dim, *cfg.obs.rgb]}
    resize = cfg.datamodule.get("resize")
    resizes = frame_resizes(
        OmegaConf.to_container(resize) if OmegaConf.is_config(resize) else resize,
        {k: columns[k].shape for k in cfg.obs.rgb},
    )
    return CameraChunkedPolicy(model, normalizer, columns, cfg.exec_horizon, resizes)


def rollout_saved(cfg: DictConfig, policy, episodes: int | None = None) -> str:
    """Evaluate a saved policy as the run did (the reach task, the same reset seeds)."""
    _check_simulator(open_demo_store(cfg.store))
    return rollout_row(cfg, "learned", policy, episodes)


def _check_simulator(store) -> None:
    if store.manifest.env_id != TASK_ID:
        raise ValueError(
            f"{store.path} holds {store.manifest.env_id or 'no named task'}'s demonstrations; "
            f"only {TASK_ID} has a simulator here: load the policy with "
            "load_policy(...).policy and run it in yours"
        )


def train(cfg: DictConfig, recipe: str) -> float:
    """One run of a camera behaviour-cloning recipe (``bc_camera``, ``bc_robomimic``): train,
    then roll out in the reach task when the store holds its demonstrations. Returns the
    learned policy's success rate, or the last validation loss where there is no rollout."""
    cfg = prepared_config(cfg)
    with recipe_run(cfg, recipe) as run:
        store = open_demo_store(cfg.store)
        low_dim, rgb = _sizes(store, cfg)
        keys = [*cfg.obs.low_dim, *cfg.obs.rgb]
        dm = instantiate(
            cfg.datamodule, store=store, obs_keys=keys, action_keys=list(cfg.action_keys)
        )
        dm.setup("fit")
        obs_frames, horizon = _frames(cfg, dm, keys)
        shapes = {
            "low_dim": low_dim,
            "rgb": rgb,
            "actions": {k: math.prod(store.column(k).shape) for k in cfg.action_keys},
            "obs_frames": obs_frames,
            "horizon": horizon,
        }
        model = _model(cfg, shapes)
        with open_dict(cfg):  # what policy_from_weights needs to rebuild the network
            cfg.policy_shapes = shapes
        run.folder.write_config(cfg)
        trainer = run.trainer(cfg.trainer)
        run.policy_tensors = lambda: (
            {f"model.{k}": v for k, v in model.state_dict().items()},
            trainer.global_step,
        )
        run.normalizer = dm.normalizer
        run.fit(trainer, model, dm)
        val = trainer.callback_metrics.get("val/loss")
        run.log.info(
            f"{store.num_episodes} demonstrations ({len(dm.split.train)} train, "
            f"{len(dm.split.val)} validation), {trainer.global_step} gradient steps, "
            + describe_validation(val)
        )
        if store.manifest.env_id != TASK_ID:
            run.log.info(
                f"no rollout: {store.manifest.env_id or 'the store'} has no simulator here"
            )
            return float(val) if val is not None else float("nan")
        columns = {k: store.column(k) for k in keys}
        learned = CameraChunkedPolicy(model, dm.normalizer, columns, cfg.exec_horizon, dm.resize)
        policies = {"learned": learned, **reach_baselines(store, cfg.seed)}
        results = evaluate_policies(run, cfg, reach_task(store), policies, trainer.global_step)
    return results["learned"]["success_rate"]


@hydra.main(config_path="../configs", config_name="bc_camera", version_base=None)
def main(cfg: DictConfig) -> float:
    return train(cfg, "bc_camera")


if __name__ == "__main__":
    main()
