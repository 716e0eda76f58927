"""Rolling a policy out in a gymnasium-style task: success rate, return, episode length.

A policy is any callable ``policy(obs) -> action``; when it has a ``reset()`` method (a
policy that keeps an observation history or an action queue), it is called at the start
of every episode.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from torchstore.validation import positive_int

__all__ = ["Task", "RandomPolicy", "evaluate"]


class Task(Protocol):
    """What :func:`evaluate` needs from a task: gymnasium's ``reset`` and ``step``."""

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]: ...

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]: ...


class RandomPolicy:
    """Uniform actions in ``[low, high]^action_dim``.

    Examples:
        >>> RandomPolicy(2, seed=0)(None).shape
        (2,)
    """

    def __init__(
        self, action_dim: int, *, low: float = -1.0, high: float = 1.0, seed: int | None = None
    ):
        action_dim = positive_int("action_dim", action_dim)
        if not high > low:
            raise ValueError(f"high ({high}) must be greater than low ({low})")
        self.action_dim, self.low, self.high = action_dim, low, high
        self._rng = np.random.default_rng(seed)

    def __call__(self, obs: Any) -> np.ndarray:
        return self._rng.uniform(self.low, self.high, self.action_dim).astype(np.float32)


def evaluate(
    task: Task, policy: Any, *, episodes: int = 50, seed: int = 10_000
) -> dict[str, float]:
    """Roll ``policy`` out for ``episodes`` episodes (reset seeds ``seed, seed + 1, ...``).

    Returns:
        ``success_rate`` (share of episodes whose last ``info["success"]`` is true),
        ``mean_return`` and ``mean_length``.

    Examples:
        >>> from torchstore.tasks import ReachExpert, ReachTask
        >>> evaluate(ReachTask(), ReachExpert(seed=0), episodes=5)["success_rate"]
        1.0
    """
    episodes = positive_int("episodes", episodes)
    successes, returns, lengths = [], [], []
    for i in range(episodes):
        obs, info = task.reset(seed=seed + i)
        if hasattr(policy, "reset"):
            policy.reset()
        total, steps, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, info = task.step(policy(obs))
            total += float(reward)
            steps += 1
            done = terminated or truncated
        successes.append(bool(info.get("success", False)))
        returns.append(total)
        lengths.append(steps)
    return {
        "success_rate": float(np.mean(successes)),
        "mean_return": float(np.mean(returns)),
        "mean_length": float(np.mean(lengths)),
    }
