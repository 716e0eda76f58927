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
masked MSE by a Lightning ``Trainer``: ``recipes/bc_camera.py``'s policy and training, with
robomimic's keys in ``configs/bc_robomimic.yaml``. robomimic's simulators (robosuite,
LIBERO) are not dependencies, so the run reports losses, not rollouts.

Outputs (``outputs/bc_robomimic/<time>/``): ``config.yaml``, ``metrics.csv``, ``loss.png``,
``policy.safetensors``, ``last.ckpt`` and ``bc_robomimic.log``;
``resume=outputs/bc_robomimic/<time>`` continues a run from its ``last.ckpt``.
"""

from __future__ import annotations

import hydra
import torch
from bc_camera import VisuomotorPolicy, saved_model, train
from omegaconf import DictConfig


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> VisuomotorPolicy:
    """The trained network of a run, from its config and its saved tensors."""
    return saved_model(cfg, state)


def rollout_saved(cfg: DictConfig, policy, episodes: int | None = None) -> str:
    raise ValueError(
        "bc_robomimic has no simulator to roll out in (robosuite / LIBERO are not "
        "dependencies); load the policy with load_policy(...).policy and run it in yours"
    )


@hydra.main(config_path="../configs", config_name="bc_robomimic", version_base=None)
def main(cfg: DictConfig) -> float:
    return train(cfg, "bc_robomimic")


if __name__ == "__main__":
    main()
