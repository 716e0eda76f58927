"""ERE, Emphasizing Recent Experience (Wang & Ross 2019, arXiv:1906.04009), as pure math.

After each episode the agent makes ``K`` updates; update ``k`` (1-based) samples only from
the newest ``c_k`` rows::

    c_k = min(N, max(N * eta ** (k * 1000 / K), c_min))

with ``N`` the rows in the buffer. ``eta = 1`` is plain uniform replay. The paper's annealed
variant moves ``eta`` linearly to 1.0 over training; here that is ``anneal_to=1.0`` plus the
training fraction passed to :meth:`ERE.set_progress`.

In a ring the newest ``c`` rows end just before the write cursor:
``(cursor - c + arange(c)) % capacity`` (:func:`recent_range`). This holds before the ring
is full too, where ``cursor == N``.

Examples:
    >>> ere = ERE(eta=0.996, c_min=5000)
    >>> ere.set_progress(1, 1000)
    >>> ere.recent_count(1_000_000)
    996000
    >>> ere.set_progress(1000, 1000)
    >>> ere.recent_count(1_000_000)
    18169
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from torchstore.validation import fraction, positive_int

__all__ = ["ERE", "recent_range"]


@dataclass
class ERE:
    """The ERE schedule: how many of the newest rows update ``k`` of ``K`` may sample.

    Args:
        eta: decay per 1000 updates, in ``(0, 1]``; 0.996 in the paper.
        c_min: smallest window, in rows (>= 1); 5000 in the paper (for 1e6-row buffers).
        anneal_to: if given, ``eta`` moves linearly from ``eta`` to ``anneal_to`` as the
            training fraction passed to :meth:`set_progress` goes from 0 to 1 (the paper
            anneals to 1.0, i.e. to uniform replay at the end of training).

    Raises:
        ValueError: for ``eta`` or ``anneal_to`` outside ``(0, 1]`` or ``c_min < 1``.
    """

    eta: float = 0.996
    c_min: int = 5000
    anneal_to: float | None = None
    k: int = field(default=1, init=False)
    K: int = field(default=1, init=False)
    frac: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        fraction("eta", self.eta, low_open=True)
        if self.anneal_to is not None:
            fraction("anneal_to", self.anneal_to, low_open=True)
        positive_int("c_min", self.c_min)

    def set_progress(self, k: int, K: int, frac: float | None = None) -> None:
        """Say which update this is: update ``k`` of ``K`` since the last episode ended.

        Args:
            k: 1-based update number within the current round, ``1 <= k <= K``.
            K: updates per round (usually the length of the episode just finished).
            frac: training progress ``t / T`` in ``[0, 1]`` for the annealed variant;
                ``None`` keeps the previous value.

        Raises:
            ValueError: if ``K < 1``, ``k`` is outside ``[1, K]`` or ``frac`` outside [0, 1].
        """
        K = positive_int("K", K)
        if not 1 <= k <= K:
            raise ValueError(f"k must be in [1, K={K}], got {k}")
        if frac is not None:
            self.frac = float(fraction("frac", frac))
        self.k, self.K = int(k), int(K)

    @property
    def current_eta(self) -> float:
        """``eta`` after annealing toward ``anneal_to`` by the current training fraction."""
        if self.anneal_to is None:
            return self.eta
        return self.eta + (self.anneal_to - self.eta) * self.frac

    @property
    def factor(self) -> float:
        """``eta ** (k * 1000 / K)``: the fraction of the buffer update ``k`` may sample."""
        return self.current_eta ** (self.k * 1000.0 / self.K)

    def recent_count(self, n: int | Tensor) -> int | Tensor:
        """``c_k`` for a buffer of ``n`` rows, rounded to the nearest row, in ``[min(n, 1), n]``.

        ``n`` may be a 0-d int64 device tensor (graph-safe: tensor ops only).
        """
        if isinstance(n, Tensor):
            c = torch.floor(n.to(torch.float64) * self.factor + 0.5).to(torch.int64)
            return torch.minimum(c.clamp(min=self.c_min), n).clamp(min=n.clamp(max=1))
        if n <= 0:
            return 0
        c = math.floor(n * self.factor + 0.5)
        return max(1, min(n, max(c, self.c_min)))

    def state_dict(self) -> dict[str, Any]:
        """Schedule parameters and progress, as plain Python numbers."""
        return {
            "eta": self.eta,
            "c_min": self.c_min,
            "anneal_to": self.anneal_to,
            "k": self.k,
            "K": self.K,
            "frac": self.frac,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.eta = float(state_dict["eta"])
        self.c_min = int(state_dict["c_min"])
        anneal_to = state_dict["anneal_to"]
        self.anneal_to = None if anneal_to is None else float(anneal_to)
        self.__post_init__()
        self.k, self.K, self.frac = (
            int(state_dict["k"]),
            int(state_dict["K"]),
            float(state_dict["frac"]),
        )

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> ERE:
        """Build a schedule from :meth:`state_dict` output."""
        ere = cls(
            eta=float(state_dict["eta"]),
            c_min=int(state_dict["c_min"]),
            anneal_to=state_dict["anneal_to"],
        )
        ere.load_state_dict(state_dict)
        return ere


def recent_range(cursor: int | Tensor, count: int | Tensor, capacity: int) -> tuple[Any, Any]:
    """First row and row count of the newest ``count`` rows of a ring.

    The rows are ``(start + arange(count)) % capacity`` with ``start = (cursor - count) %
    capacity``; they wrap past the end of the ring when ``start + count > capacity``.

    Args:
        cursor: the row the next write goes to (== the number of rows while not full).
        count: how many of the newest rows, ``0 <= count <= rows in the ring``.
        capacity: ring capacity.

    Returns:
        ``(start, count)``, ints or tensors like the inputs.
    """
    return (cursor - count) % capacity, count
