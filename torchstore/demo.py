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
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.errors import StoreFormatError
from torchstore.validation import non_negative_int, positive_int

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
        u = np.clip(
            -2.0 * energy * np.sign(thdot + 1e-6) * 0.1 + rng.normal(0, 0.3),
            -_MAX_TORQUE,
            _MAX_TORQUE,
        )
        angle = ((theta + np.pi) % (2 * np.pi)) - np.pi
        reward = -(angle**2 + 0.1 * thdot**2 + 0.001 * u**2)
        obs.append(_observe(theta, thdot))
        thdot = np.clip(
            thdot + (3 * _G / 2 * np.sin(theta) + 3.0 * u - _DAMPING * thdot) * _DT,
            -_MAX_SPEED,
            _MAX_SPEED,
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
    path: str | os.PathLike,
    *,
    episodes: int = 20,
    steps: int = 200,
    seed: int = 0,
    overwrite: bool = False,
    resume: bool = False,
) -> Path:
    """Write ``episodes`` pendulum episodes of ``steps`` steps to a new store at ``path``.

    Deterministic in ``seed``: the same arguments write the same rows.

    Args:
        path: the store file to write; missing parent folders are created.
        episodes: episodes to write (>= 1).
        steps: steps per episode (>= 1).
        seed: seed of the initial states and the controller's noise (>= 0).
        overwrite: replace an existing store at ``path`` (a file that is not a store is
            never replaced).
        resume: append to a store an interrupted call with the same arguments left, so
            it ends as an uninterrupted call would have written it.

    Raises:
        DestinationExistsError: ``path`` exists and neither ``overwrite`` nor ``resume``
            is set (also a ``FileExistsError``).
        DestinationError: ``path`` is a folder or a file that is not a store.
        StoreFormatError: ``resume`` on a store written with other arguments.

    Examples:
        >>> write_demo_store("pendulum.h5", episodes=2, steps=50)  # doctest: +SKIP
        PosixPath('pendulum.h5')
    """
    from torchstore.io.destination import check_destination

    episodes = positive_int("episodes", episodes)
    steps = positive_int("steps", steps)
    seed = non_negative_int("seed", seed)
    if overwrite and resume:
        raise ValueError("overwrite and resume exclude each other: start over, or continue")
    path = Path(path)
    rng = np.random.default_rng(seed)
    meta = {
        "source": "torchstore demo",
        "dynamics": "Pendulum-v1 with damping",
        "dt": _DT,
        "episodes": episodes,
        "steps": steps,
    }
    if resume and path.exists():
        writer = TrajectoryStoreWriter.resume(path)
        _check_resumable(writer, path, seed, meta)
    else:
        check_destination(path, overwrite=overwrite)
        writer = TrajectoryStoreWriter(
            path, DEMO_COLUMNS, env_id="Pendulum-v1", seed=seed, metadata=meta, overwrite=overwrite
        )
    with writer:
        done = writer.num_episodes
        for i in range(episodes):
            rows = _episode(rng, steps)  # generated even when skipped: the rng must advance
            if i >= done:
                writer.add_episode(rows, metadata={"episode": i})
    return path


def _check_resumable(writer: TrajectoryStoreWriter, path: Path, seed: int, meta: dict) -> None:
    old = writer.manifest
    same = old.seed == seed and all(old.metadata.get(k) == v for k, v in meta.items())
    if not same or writer.num_episodes > meta["episodes"]:
        writer.close()
        raise StoreFormatError(
            f"{path} was not written by an interrupted demo with these arguments "
            f"(it has seed {old.seed}, metadata {dict(old.metadata)}); "
            "write to another path, or pass overwrite=True to start over"
        )
