"""A small, real demo dataset: a damped pendulum swung by a noisy energy-pumping controller.

Used by the README's first command and by tests that want physically meaningful data
without a simulator dependency. Dynamics follow gymnasium's Pendulum-v1 (g = 10, m = l = 1,
dt = 0.05, torque clipped to [-2, 2]) with light damping.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.writer import TrajectoryStoreWriter

__all__ = ["write_demo_store", "DEMO_COLUMNS"]

DEMO_COLUMNS = (
    ColumnSpec("obs", torch.float32, (3,)),
    ColumnSpec("action", torch.float32, (1,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("truncated", torch.bool),
    ColumnSpec("next/obs", torch.float32, (3,)),
)

_G, _DT, _MAX_TORQUE, _MAX_SPEED, _DAMPING = 10.0, 0.05, 2.0, 8.0, 0.05


def _observe(theta: float, thdot: float) -> np.ndarray:
    return np.array([np.cos(theta), np.sin(theta), thdot], dtype=np.float32)


def _episode(rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    theta, thdot = rng.uniform(-np.pi, np.pi), rng.uniform(-1.0, 1.0)
    obs, act, rew, nxt = [], [], [], []
    for _ in range(steps):
        energy = 0.5 * thdot**2 + _G * (np.cos(theta) - 1.0)  # 0 when upright and still
        u = np.clip(-2.0 * energy * np.sign(thdot + 1e-6) * 0.1 + rng.normal(0, 0.3), -_MAX_TORQUE, _MAX_TORQUE)
        angle = ((theta + np.pi) % (2 * np.pi)) - np.pi
        reward = -(angle**2 + 0.1 * thdot**2 + 0.001 * u**2)
        obs.append(_observe(theta, thdot))
        thdot = np.clip(
            thdot + (3 * _G / 2 * np.sin(theta) + 3.0 * u - _DAMPING * thdot) * _DT, -_MAX_SPEED, _MAX_SPEED
        )
        theta = theta + thdot * _DT
        act.append([u])
        rew.append(reward)
        nxt.append(_observe(theta, thdot))
    truncated = np.zeros(steps, dtype=bool)
    truncated[-1] = True
    return {
        "obs": np.stack(obs),
        "action": np.asarray(act, dtype=np.float32),
        "reward": np.asarray(rew, dtype=np.float32),
        "done": truncated.copy(),
        "truncated": truncated,
        "next/obs": np.stack(nxt),
    }


def write_demo_store(
    path: str | os.PathLike, *, episodes: int = 20, steps: int = 200, seed: int = 0, overwrite: bool = True
) -> Path:
    """Write ``episodes`` pendulum episodes of ``steps`` steps to a new store at ``path``."""
    rng = np.random.default_rng(seed)
    meta = {"source": "torchstore demo", "dynamics": "Pendulum-v1 with damping", "dt": _DT}
    with TrajectoryStoreWriter(
        path, DEMO_COLUMNS, env_id="Pendulum-v1", seed=seed, metadata=meta, overwrite=overwrite
    ) as writer:
        for i in range(episodes):
            writer.add_episode(_episode(rng, steps), metadata={"episode": i})
    return Path(path)
