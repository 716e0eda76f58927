"""Reach-and-stop in 2-D: the default task, its scripted expert and its demonstration store.

A point mass (position and velocity in ``[-1, 1]^2``) is pushed by a continuous 2-D
acceleration in ``[-1, 1]^2``; an episode succeeds when the agent is within
``target_radius`` of the target *and* slower than ``settle_speed`` (reaching alone is not
enough: the policy has to brake). Success terminates the episode; ``max_steps`` truncates
it. Pure numpy, no simulator: the point of the task is a small, real dataset whose
learned policies can be checked by rolling them out.

Observations are a dict of the store's observation columns:

- ``state``: float32[6], agent position (2), agent velocity (2), target position (2);
- ``pixels``: uint8[H, W, 3], a top-down render (target red, agent blue).

The reward is minus the distance to the target after the step.

Examples:
    >>> task = ReachTask()
    >>> obs, info = task.reset(seed=0)
    >>> obs["state"].shape, obs["pixels"].shape
    ((6,), (32, 32, 3))
    >>> expert = ReachExpert(seed=0)
    >>> obs, reward, terminated, truncated, info = task.step(expert(obs))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.quantize import Quantize
from torchstore.tasks.rollout import evaluate
from torchstore.validation import (
    int_at_least,
    non_negative_int,
    non_negative_number,
    positive_int,
    positive_number,
)

__all__ = [
    "ReachTask",
    "ReachExpert",
    "expert_baselines",
    "reach_columns",
    "render_frame",
    "write_demo_data",
    "TASK_ID",
    "TASK_DESCRIPTION",
    "STATE_DIM",
    "ACTION_DIM",
]

#: The ``env_id`` written into demonstration stores of this task.
TASK_ID = "torchstore/Reach2D-v0"
TASK_DESCRIPTION = (
    "2-D reach-and-stop: a point mass driven by 2-D accelerations in [-1, 1] must come to rest "
    "within target_radius of a random target"
)
STATE_DIM = 6
ACTION_DIM = 2
_START_SPAN = 0.9  # agent and target start inside [-0.9, 0.9]^2
_MIN_START_DISTANCE = 0.5
_AGENT_RADIUS = 0.1  # drawn sizes, larger than the physics for a readable 32 px image
_TARGET_DRAW_SCALE = 1.4
_BACKGROUND = np.array([236, 236, 230], dtype=np.float32)
_TARGET_RGB = np.array([214, 48, 49], dtype=np.float32)
_AGENT_RGB = np.array([38, 92, 196], dtype=np.float32)
_WALL_RGB = np.array([90, 90, 90], dtype=np.float32)


@dataclass
class ReachTask:
    """The 2-D reach-and-stop task with a gymnasium-style interface.

    Args:
        max_steps: steps before an episode is truncated.
        image_size: side of the rendered square image, in pixels.
        target_radius: success distance to the target.
        settle_speed: success needs the agent's speed below this.
        dt: integration step, in seconds.
        max_accel: acceleration of a unit action.
        damping: velocity damping per second.
    """

    max_steps: int = 40
    image_size: int = 32
    target_radius: float = 0.1
    settle_speed: float = 0.3
    dt: float = 0.1
    max_accel: float = 4.0
    damping: float = 1.0

    def __post_init__(self) -> None:
        positive_int("max_steps", self.max_steps)
        int_at_least("image_size", self.image_size, 8)
        for name in ("target_radius", "settle_speed", "dt", "max_accel"):
            positive_number(name, getattr(self, name))
        non_negative_number("damping", self.damping)
        self._state: dict[str, Any] = {"rng": np.random.default_rng(), "t": 0}

    # ----------------------------------------------------------------- spaces
    @property
    def state_dim(self) -> int:
        return STATE_DIM

    @property
    def action_dim(self) -> int:
        return ACTION_DIM

    @property
    def action_low(self) -> np.ndarray:
        return -np.ones(ACTION_DIM, dtype=np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.ones(ACTION_DIM, dtype=np.float32)

    def config(self) -> dict[str, Any]:
        """The task's parameters: ``ReachTask(**task.config())`` rebuilds it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ----------------------------------------------------------------- episode
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode; ``seed`` reseeds the task's generator (gymnasium semantics)."""
        s = self._state
        if seed is not None:
            s["rng"] = np.random.default_rng(seed)
        rng = s["rng"]
        pos = rng.uniform(-_START_SPAN, _START_SPAN, 2)
        target = rng.uniform(-_START_SPAN, _START_SPAN, 2)
        while np.linalg.norm(target - pos) < _MIN_START_DISTANCE:
            target = rng.uniform(-_START_SPAN, _START_SPAN, 2)
        s.update(pos=pos, vel=np.zeros(2), target=target, t=0)
        return self._observe(), {"distance": self._distance(), "success": False}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply an action (clipped to ``[-1, 1]``).

        Returns:
            ``obs, reward, terminated, truncated, info`` (gymnasium order).
        """
        s = self._state
        if "pos" not in s:
            raise RuntimeError("ReachTask.step() called before reset()")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(ACTION_DIM), -1.0, 1.0)
        vel = s["vel"] * (1.0 - self.damping * self.dt) + self.max_accel * self.dt * a
        pos = s["pos"] + vel * self.dt
        wall = np.abs(pos) > 1.0
        pos = np.clip(pos, -1.0, 1.0)
        vel = np.where(wall, 0.0, vel)
        s.update(pos=pos, vel=vel, t=s["t"] + 1)
        distance = self._distance()
        success = bool(distance < self.target_radius and np.linalg.norm(vel) < self.settle_speed)
        truncated = not success and s["t"] >= self.max_steps
        info = {"distance": distance, "success": success}
        return self._observe(), -distance, success, truncated, info

    def render(self) -> np.ndarray:
        """The current frame: uint8 ``[image_size, image_size, 3]``, target red, agent blue."""
        s = self._state
        if "pos" not in s:
            raise RuntimeError("ReachTask.render() called before reset()")
        return render_frame(s["pos"], s["target"], self.image_size, self.target_radius)

    # ----------------------------------------------------------------- helpers
    def _distance(self) -> float:
        s = self._state
        return float(np.linalg.norm(s["pos"] - s["target"]))

    def _observe(self) -> dict[str, np.ndarray]:
        s = self._state
        state = np.concatenate([s["pos"], s["vel"], s["target"]]).astype(np.float32)
        return {"state": state, "pixels": self.render()}


def render_frame(
    pos: np.ndarray, target: np.ndarray, size: int, target_radius: float
) -> np.ndarray:
    """Draw the arena: anti-aliased discs for target and agent, a one-pixel wall."""
    centers = (np.arange(size) + 0.5) / size * 2.0 - 1.0  # world coordinate of each pixel
    x, y = np.meshgrid(centers, -centers)  # row 0 is the top (y = +1)
    px = 2.0 / size
    image = np.broadcast_to(_BACKGROUND, (size, size, 3)).copy()
    for center, radius, rgb in (
        (target, max(target_radius * _TARGET_DRAW_SCALE, px), _TARGET_RGB),
        (pos, _AGENT_RADIUS, _AGENT_RGB),
    ):
        dist = np.hypot(x - center[0], y - center[1])
        alpha = np.clip((radius - dist) / px + 0.5, 0.0, 1.0)[..., None]
        image = image * (1.0 - alpha) + rgb * alpha
    image[[0, -1], :] = _WALL_RGB
    image[:, [0, -1]] = _WALL_RGB
    return np.rint(image).astype(np.uint8)


@dataclass
class ReachExpert:
    """The scripted expert: a PD controller toward the target plus Gaussian action noise.

    Args:
        kp: gain on the position error.
        kd: gain on the velocity (braking).
        noise: standard deviation of the Gaussian noise added to each action component.
        seed: seeds the noise.
    """

    kp: float = 3.0
    kd: float = 1.5
    noise: float = 0.2
    seed: int | None = None

    def __post_init__(self) -> None:
        non_negative_number("noise", self.noise)
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        state = np.asarray(obs["state"], dtype=np.float64)
        pos, vel, target = state[0:2], state[2:4], state[4:6]
        action = self.kp * (target - pos) - self.kd * vel
        if self.noise:
            action = action + self._rng.normal(0.0, self.noise, ACTION_DIM)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "PD controller toward the target",
            "kp": self.kp,
            "kd": self.kd,
            "noise": self.noise,
        }


def reach_columns(image_size: int = 32) -> tuple[ColumnSpec, ...]:
    """The columns of a reach demonstration store (pixels kept as uint8: ``Quantize(0, 1)``)."""
    return (
        ColumnSpec("state", torch.float32, (STATE_DIM,)),
        ColumnSpec(
            "pixels", torch.float32, (image_size, image_size, 3), quantize=Quantize(0.0, 1.0)
        ),
        ColumnSpec("action", torch.float32, (ACTION_DIM,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("done", torch.bool),
        ColumnSpec("terminated", torch.bool),
        ColumnSpec("truncated", torch.bool),
        ColumnSpec("next/state", torch.float32, (STATE_DIM,)),
    )


def _record_episode(
    task: ReachTask, expert: ReachExpert, seed: int
) -> tuple[dict[str, np.ndarray], bool]:
    obs, _ = task.reset(seed=seed)
    rows: dict[str, list] = {
        name: []
        for name in ("state", "pixels", "action", "reward", "terminated", "truncated", "next/state")
    }
    while True:
        action = expert(obs)
        nxt, reward, terminated, truncated, info = task.step(action)
        rows["state"].append(obs["state"])
        rows["pixels"].append(obs["pixels"])
        rows["action"].append(action)
        rows["reward"].append(reward)
        rows["terminated"].append(terminated)
        rows["truncated"].append(truncated)
        rows["next/state"].append(nxt["state"])
        obs = nxt
        if terminated or truncated:
            break
    out = {k: np.asarray(v) for k, v in rows.items()}
    out["pixels"] = out["pixels"].astype(np.float32) / 255.0
    out["reward"] = out["reward"].astype(np.float32)
    out["done"] = out["terminated"] | out["truncated"]
    return out, bool(info["success"])


def write_demo_data(
    path: str | os.PathLike,
    *,
    episodes: int = 50,
    seed: int = 0,
    task: ReachTask | None = None,
    expert: ReachExpert | None = None,
    overwrite: bool = False,
) -> Path:
    """Record ``episodes`` expert demonstrations of :class:`ReachTask` into a new store.

    Deterministic in ``seed``, to the byte: episode ``i`` starts from
    ``reset(seed=seed * 1_000_003 + i)``, the expert's noise is seeded with ``seed``, the
    manifest records no creation time and the file is a
    :func:`~torchstore.io.hdf5.reproducible.reproducible_copy` (no HDF5 timestamps, no stale
    bytes), so regenerating ``data/reach_demo.h5`` leaves it unchanged. The manifest metadata
    describes the task (``task_config`` rebuilds it), the expert, and the expert's success
    rate on these episodes; each episode's metadata holds its reset seed and whether it
    succeeded.

    The store is written next to ``path`` and renamed into place when complete: an
    interrupted call leaves ``path`` as it was.

    Args:
        path: the store file to write; missing parent folders are created.
        episodes: demonstrations to record (>= 1).
        seed: the seed of resets and expert noise (>= 0).
        task: the task (default: ``ReachTask()``).
        expert: the expert (default: ``ReachExpert(seed=seed)``).
        overwrite: replace an existing store at ``path`` (a file that is not a store is
            never replaced).

    Raises:
        DestinationExistsError: ``path`` exists and ``overwrite`` is false (also a
            ``FileExistsError``).
        DestinationError: ``path`` is a folder or a file that is not a store.

    Examples:
        >>> path = write_demo_data("reach.h5", episodes=10)
    """
    from torchstore.io.destination import check_destination

    episodes = positive_int("episodes", episodes)
    seed = non_negative_int("seed", seed)
    path = check_destination(path, overwrite=overwrite)
    task = task or ReachTask()
    expert = expert or ReachExpert(seed=seed)
    recorded = []
    for i in range(episodes):
        reset_seed = seed * 1_000_003 + i
        rows, success = _record_episode(task, expert, reset_seed)
        recorded.append((rows, {"episode": i, "reset_seed": reset_seed, "success": success}))
    success_rate = float(np.mean([meta["success"] for _, meta in recorded]))
    metadata = {
        "source": "torchstore.tasks.reach.write_demo_data",
        "task": TASK_ID,
        "description": TASK_DESCRIPTION,
        "task_config": task.config(),
        "observation": {
            "state": "agent pos (2), agent vel (2), target pos (2)",
            "pixels": "RGB top-down render",
        },
        "expert": expert.describe(),
        "expert_success_rate": success_rate,
    }
    _write_reproducibly(path, reach_columns(task.image_size), seed, metadata, recorded)
    return path


def _write_reproducibly(
    path: Path, columns: list, seed: int, metadata: dict, recorded: list[tuple[dict, dict]]
) -> None:
    """Write a complete store next to ``path`` with no timestamps, then rename it over ``path``."""
    from torchstore.io.hdf5.reproducible import reproducible_copy

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    copy = path.with_name(f".{path.name}.{os.getpid()}.copy")
    try:
        with TrajectoryStoreWriter(
            partial,
            columns,
            env_id=TASK_ID,
            seed=seed,
            metadata=metadata,
            created="",
            overwrite=True,
        ) as writer:
            for rows, meta in recorded:
                writer.add_episode(rows, metadata=meta)
        reproducible_copy(partial, copy)
        os.replace(copy, path)
    finally:
        partial.unlink(missing_ok=True)
        copy.unlink(missing_ok=True)


def expert_baselines(
    task: ReachTask, *, episodes: int = 100, seed: int = 10_000
) -> dict[str, float]:
    """Success rates of the scripted expert and a uniform-random policy on fresh seeds."""
    from torchstore.tasks.rollout import RandomPolicy

    expert = evaluate(task, ReachExpert(seed=seed), episodes=episodes, seed=seed)
    random = evaluate(task, RandomPolicy(ACTION_DIM, seed=seed), episodes=episodes, seed=seed)
    return {"expert": expert["success_rate"], "random": random["success_rate"]}
