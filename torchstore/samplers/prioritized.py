"""Proportional prioritized replay (Schaul et al. 2016) as a torchrl ``Sampler``.

The priority index is our :class:`~torchstore.samplers.SumTree` on the storage's device;
the storage never knows it exists. A row with raw priority ``p`` is stored as
``(p + eps) ** alpha`` and drawn with probability proportional to that value.

torchrl integration. The class subclasses torchrl's ``PrioritizedSampler`` **without calling
its ``__init__``** (which builds the C++ segment trees that do not load with torch 2.13) and
overrides every public method. The subclass is what makes torchrl's ``isinstance`` checks
pass, so these all work as they do with torchrl's own sampler:

- ``ReplayBuffer(storage=..., sampler=PrioritizedSampler(N))`` and
  ``PrioritizedReplayBuffer(alpha=..., beta=..., storage=..., sampler=PrioritizedSampler(N))``
  (the buffer's ``alpha``/``beta`` are then unused: the sampler's own are);
- ``TensorDictReplayBuffer(storage=..., sampler=PrioritizedSampler(N), priority_key="td_error")``
  with ``rb.update_tensordict_priority(td)`` after a loss, and ``rb.extend(td)`` of a
  TensorDict holding ``"td_error"`` setting those rows' priorities. This is the way for
  TensorDict users: ``TensorDictPrioritizedReplayBuffer`` always builds torchrl's own sampler
  internally and cannot take ours.

Importance weights are normalised buffer-wide, as torchrl and cpprb do:
``w_i / max_j w_j = (p_i / p_min) ** (-beta)`` over stored values, with ``p_min`` the
smallest positive stored value in the sampled range. With ERE the range is the newest
``c_k`` rows: ``c_k`` replaces ``N`` in ``w_i = (N * P(i)) ** (-beta)`` and ``P(i)`` is
renormalised over that range, and after dividing by the largest weight in the range both
cancel, leaving the same closed form with ``p_min`` taken over the range.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as _TorchrlPrioritizedSampler

from torchstore.errors import EmptyStorageError
from torchstore.samplers.draws import importance_weight, prioritized_rows, weighted_rows
from torchstore.samplers.ere import ERE
from torchstore.samplers.philox import PhiloxStream, cpu_kernels
from torchstore.samplers.sumtree import SumTree, filled, last_write_wins
from torchstore.samplers.uniform import (
    _is_compiling,
    _SamplerCommon,
    check_seed,
    ring_geometry,
    storage_device,
)
from torchstore.validation import non_negative_number, positive_int

__all__ = ["PrioritizedSampler"]

_REDUCTIONS = ("max", "min", "mean", "median", "sum")
BetaSchedule = Callable[[int], float] | tuple[float, int]


class PrioritizedSampler(_SamplerCommon, _TorchrlPrioritizedSampler):
    """Rows drawn with probability proportional to ``(priority + eps) ** alpha``.

    Args:
        capacity: rows the priority tree holds; at least the storage's capacity (equal to it
            when ``ere`` is set, since ERE ranges wrap at the ring's capacity).
        alpha: prioritisation exponent (>= 0; 0 is uniform).
        beta: importance-sampling exponent (>= 0), or the start of ``beta_schedule``.
        eps: added to every raw priority before the exponent (>= 0).
        beta_schedule: how ``beta`` moves as ``sample`` is called. A tuple ``(beta_end,
            steps)`` anneals linearly from ``beta`` to ``beta_end`` over ``steps`` calls and
            then stays; a callable ``f(t) -> beta`` is called with ``t``, the number of
            earlier ``sample`` calls. ``t`` is checkpointed; a callable is not.
        ere: an :class:`~torchstore.samplers.ERE` schedule restricting draws to the newest rows.
        device: where the tree lives; ``None`` follows the storage's device.
        reduction: how ``TensorDictReplayBuffer.update_tensordict_priority`` reduces a
            per-row priority with extra dims: ``"max"``, ``"min"``, ``"mean"``, ``"median"``
            or ``"sum"``.
        dtype: tree dtype; float64 by default.
        generator: a ``torch.Generator`` or an int seed (the buffer's generator wins).
        philox: a :class:`~torchstore.samplers.philox.PhiloxStream` to draw from (the
            graph-safe device path, :func:`torchstore.sample_into`, needs one); eager
            ``sample`` draws from it too, so both give the same rows.
        seed: build the Philox stream here (key ``seed``, sub-stream ``stream``, on the
            tree's device, following the storage when ``device`` is ``None``).
        stream: the Philox sub-stream, with ``seed``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=PrioritizedSampler(8))
        >>> index = rb.extend(torch.arange(4.0))
        >>> rb.update_priority(index, torch.tensor([0.0, 1.0, 2.0, 3.0]))
        >>> _, info = rb.sample(5, return_info=True)
        >>> sorted(info)
        ['index', 'priority_weight']
    """

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        beta_schedule: BetaSchedule | None = None,
        ere: ERE | None = None,
        device: torch.device | str | None = None,
        reduction: str = "max",
        dtype: torch.dtype = torch.float64,
        generator: torch.Generator | int | None = None,
        philox: PhiloxStream | None = None,
        seed: int | None = None,
        stream: int = 0,
    ) -> None:
        # torchrl's __init__ is skipped on purpose: it builds the C++ trees (see module doc).
        capacity = positive_int("capacity", capacity)
        for name, value in (("alpha", alpha), ("beta", beta), ("eps", eps)):
            non_negative_number(name, value)
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self._init_common(generator, ere)
        self._beta_schedule = _check_beta_schedule(beta_schedule)
        self._capacity = capacity
        self._alpha = float(alpha)
        self._beta = float(beta)
        self._eps = float(eps)
        self.reduction = reduction
        self.dtype = dtype
        self._follow_device = device is None
        tree_device = torch.device("cpu" if device is None else device)
        self._tree = SumTree(capacity, dtype=dtype, device=tree_device)
        self._raw = filled(capacity, 0.0, dtype, tree_device)
        self._max_raw: Tensor | None = None
        self._sample_calls = 0
        # highest row that ever got a priority: while it is below the storage length, no
        # leaf past the valid rows holds mass and draws can descend the whole tree
        self._high_water = -1
        if philox is not None and not isinstance(philox, PhiloxStream):
            raise TypeError(f"philox must be a PhiloxStream or None, got {type(philox).__name__}")
        if philox is not None and check_seed(seed) is not None:
            raise ValueError("pass either philox= or seed=, not both")
        #: the Philox stream draws come from (``None``: a torch generator)
        self.philox = philox
        self._follow_stream_device = False
        if philox is None:
            self._init_stream(seed, stream, None if device is None else tree_device)

    # ------------------------------------------------------------ properties
    @property
    def max_size(self) -> int:
        """The tree's capacity (torchrl's name)."""
        return self._capacity

    @property
    def capacity(self) -> int:
        """The tree's capacity."""
        return self._capacity

    @property
    def device(self) -> torch.device:
        """Device of the priority tree."""
        return self._tree.device

    @property
    def tree(self) -> SumTree:
        """The stored values ``(p + eps) ** alpha`` (read it; write through ``update_priority``)."""
        return self._tree

    @property
    def alpha(self) -> float:
        """Prioritisation exponent; setting it rewrites the tree from the raw priorities."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = float(non_negative_number("alpha", value))
        written = self._tree.values() > 0
        stored = torch.pow(self._raw + self._eps, self._alpha)
        self._tree.assign(torch.where(written, stored, torch.zeros_like(stored)))

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next ``sample`` call will use."""
        return self._beta_at(self._sample_calls)

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = float(non_negative_number("beta", value))

    def _beta_at(self, t: int) -> float:
        schedule = self._beta_schedule
        if schedule is None:
            return self._beta
        if callable(schedule):
            return float(schedule(t))
        beta_end, steps = schedule
        return self._beta + (beta_end - self._beta) * min(t / steps, 1.0)

    @property
    def default_priority(self) -> float:
        """Raw priority given to new rows: the largest raw priority seen, 1.0 before any."""
        return 1.0 if self._max_raw is None else float(self._max_raw)

    @property
    def _max_priority(self) -> tuple[float | None, None]:  # torchrl's attribute, read-only
        return (None if self._max_raw is None else float(self._max_raw), None)

    # ------------------------------------------------------------ writes
    def _follow_storage(self, storage: Any) -> None:
        if not self._follow_device or storage is None:
            return
        device = storage_device(storage)
        if self.philox is not None and self._follow_stream_device and device != self.philox.device:
            self.philox.to(device)
        if device != self._tree.device:
            self._tree.to(device)
            self._raw = self._raw.to(device)
            if self._max_raw is not None:
                self._max_raw = self._max_raw.to(device)

    def add(self, index: int) -> None:
        """No-op: new rows got their priority from ``mark_update``."""

    def extend(self, index: Tensor) -> None:
        """No-op: new rows got their priority from ``mark_update``."""

    def mark_update(self, index: int | Tensor, *, storage: Any = None) -> None:
        """Give freshly written rows ``default_priority`` (torchrl calls this on every write)."""
        priority = torch.ones((), dtype=self.dtype) if self._max_raw is None else self._max_raw
        self.update_priority(index, priority, storage=storage)

    @torch.no_grad()
    def update_priority(
        self, index: int | Tensor, priority: float | Tensor, *, storage: Any = None
    ) -> None:
        """Set raw priorities of rows, batched; the last duplicate of a row wins.

        Args:
            index: row indices (int, 1-D, or ``[N, ndim]`` coordinates with ``storage``).
                Negative indices are dropped (torchrl's ``TensorDictMaxValueWriter`` uses -1).
            priority: one value for all, or one per index; finite and ``>= 0``.
            storage: the buffer's storage (for its device and its shape with N-d indices).

        Raises:
            ValueError: if a priority is negative, NaN or infinite, the shapes disagree, or
                an index is ``>= capacity``.
        """
        self._follow_storage(storage)
        device = self._tree.device
        index = torch.as_tensor(index, dtype=torch.int64, device=device)
        if index.ndim == 2 and storage is not None and getattr(storage, "ndim", 1) > 1:
            index = _ravel(index, tuple(storage.shape))
        index = index.reshape(-1)
        priority = torch.as_tensor(priority, device=device).detach().to(self.dtype)
        if priority.numel() == 1:
            priority = priority.reshape(1).expand(index.shape[0])
        elif priority.numel() == index.numel():
            priority = priority.reshape(-1)
        else:
            raise ValueError(
                f"priority must hold one value or one per index ({index.numel()}), "
                f"got shape {tuple(priority.shape)}"
            )
        if (
            index.numel()
            and cpu_kernels(self._raw) is not None
            and self._write_checked(index, priority)
        ):
            return
        keep = index >= 0
        if not bool(keep.all()):
            index, priority = index[keep], priority[keep]
        if index.numel() == 0:
            return
        bad = ~torch.isfinite(priority) | (priority < 0)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"priority must be finite and >= 0, got {float(priority[pos])} at index "
                f"{int(index[pos])}"
            )
        if bool((index >= self._capacity).any()):
            raise ValueError(
                f"index must be < capacity ({self._capacity}), got {int(index.max())}; "
                "build the sampler with the storage's capacity"
            )
        self.write_priorities(index, priority)
        self._high_water = max(self._high_water, int(index.max()))

    def _write_checked(self, index: Tensor, priority: Tensor) -> bool:
        """The common CPU case in one compiled call: validate and, when the batch is clean,
        write it (raw priorities and tree). False when nothing was written."""
        stored = torch.pow(priority + self._eps, self._alpha)  # as in write_priorities
        tree = self._tree
        written, top, batch_max = cpu_kernels(self._raw).checked_update(
            tree._nodes, tree.depth, index, stored, self._raw, priority, self._capacity
        )
        if not written:
            return False
        self._note_max(batch_max)
        self._high_water = max(self._high_water, top)
        return True

    def _note_max(self, batch_max: float) -> None:
        """Raise the running largest raw priority to ``batch_max`` (a CPU host value;
        ``-inf`` from an empty batch changes nothing)."""
        if batch_max == float("-inf"):
            return
        if self._max_raw is None:
            self._max_raw = torch.tensor(batch_max, dtype=self.dtype)
        elif batch_max > float(self._max_raw):
            self._max_raw.fill_(batch_max)

    def write_priorities(self, index: Tensor, priority: Tensor) -> None:
        """Set raw priorities with no validation or host sync (graph-safe); the last
        duplicate of a row wins. On a CPU outside tracing one compiled kernel writes the raw
        priorities and the tree; elsewhere tensor code does the same arithmetic.

        ``update_priority`` validates and then calls this; a compiled or captured training
        step calls it through :func:`torchstore.update_priority_`. Priorities must be
        finite and ``>= 0``; indices in ``[0, capacity)`` and below the storage length.
        """
        priority = priority.to(self.dtype)
        # the stored values are computed on the caller's order in both implementations, so
        # an element meets the same (vectorised or scalar) pow whichever path runs
        stored = torch.pow(priority + self._eps, self._alpha)
        tree = self._tree
        kernels = cpu_kernels(self._raw)
        if kernels is not None:  # the kernel also returns the batch's largest priority
            self._note_max(
                kernels.update_tree(
                    tree._nodes,
                    tree.depth,
                    index,
                    stored,
                    raw=self._raw,
                    raw_value=priority,
                )
            )
            return
        batch_max = priority.max()
        if self._max_raw is None:
            self._max_raw = batch_max.clone()
        else:  # in place: a captured graph keeps updating the same tensor
            self._max_raw.copy_(torch.maximum(self._max_raw, batch_max))
        index, both = last_write_wins(index, torch.stack((priority, stored), 1))
        self._raw.index_copy_(0, index, both[:, 0])
        tree.update(index, both[:, 1], check=False, resolved=True)

    # ------------------------------------------------------------ sampling
    def _sampleable_count(self, storage: Any, batch_size: int) -> int:
        if len(storage) == 0:
            return 0
        start, count, _ = self._recent_range(storage)
        return int(self._tree.total(count, start=start) > 0) * count

    def sample(self, storage: Any, batch_size: int) -> tuple[Tensor | tuple[Tensor, ...], dict]:
        """Draw ``batch_size`` rows; ``info["priority_weight"]`` holds float32 IS weights.

        Raises:
            EmptyStorageError: if the storage is empty, or every sampleable row has priority 0.
            ValueError: if the storage outgrew ``capacity`` (or, with ERE, differs from it).
        """
        self._follow_storage(storage)
        n = len(storage)
        if n == 0:
            raise EmptyStorageError(
                "Cannot sample from an empty storage: PrioritizedSampler needs at least one row"
            )
        if n > self._capacity:
            raise ValueError(
                f"storage holds {n} rows but PrioritizedSampler capacity is {self._capacity}; "
                "build the sampler with the storage's capacity"
            )
        if self._ere is not None:
            ring_capacity = ring_geometry(storage)[1]
            if ring_capacity != self._capacity:
                raise ValueError(
                    f"with ERE, PrioritizedSampler capacity ({self._capacity}) must equal the "
                    f"storage capacity ({ring_capacity})"
                )
        start, count, _ = self._recent_range(storage)
        whole = self._ere is None and self._high_water < n
        beta = self._next_beta()
        if self.philox is not None:
            index, weight, total = prioritized_rows(
                self._tree,
                self.philox,
                batch_size,
                beta,
                count=None if whole else count,
                start=None if whole else start,
            )
        else:
            index, weight, total = self._sample_generator(batch_size, beta, whole, start, count)
        if not _is_compiling() and not float(total) > 0:
            raise EmptyStorageError(
                f"all {count} sampleable rows have priority 0 (with eps={self._eps}); "
                "give some row a positive priority or use eps > 0"
            )
        out_device = storage_device(storage)
        index = index.to(out_device)
        if getattr(storage, "ndim", 1) > 1:
            index = torch.unravel_index(index, tuple(storage.shape))
        return index, {"priority_weight": weight.to(out_device)}

    def _sample_generator(
        self, n: int, beta: float, whole: bool, start: int, count: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        device = self._tree.device
        u = torch.rand(
            n, dtype=torch.float64, generator=self.generator, device=self._draw_device(device)
        ).to(device)
        if whole:
            return weighted_rows(self._tree, u, beta)
        return weighted_rows(self._tree, u, beta, count=count, start=start)

    def draw(
        self,
        batch_size: int,
        *,
        count: Tensor | int | None = None,
        start: Tensor | int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` rows and their importance weights from the Philox stream.

        Graph-safe (no host sync, no validation): the whole tree with ``count=None``, else
        the ring range of ``count`` rows from ``start``. ``beta`` is the current one and the
        beta schedule does not advance (eager :meth:`sample` advances it).

        Raises:
            TypeError: if the sampler has no Philox stream.
        """
        if self.philox is None:
            raise TypeError(
                "the device path draws a PrioritizedSampler's uniforms from a Philox stream: "
                "build it with PrioritizedSampler(capacity, seed=...) or "
                "PrioritizedSampler(capacity, philox=PhiloxStream(seed, device=...))"
            )
        index, weight, _ = prioritized_rows(
            self._tree, self.philox, batch_size, self.beta, count=count, start=start
        )
        return index, weight

    def _next_beta(self) -> float:
        """The beta of this ``sample`` call; advances the beta schedule by one call."""
        beta = self._beta_at(self._sample_calls)
        self._sample_calls += 1
        return beta

    def _weights(self, value: Tensor, p_min: Tensor) -> Tensor:
        """float32 importance weights at this call's beta; advances the beta schedule."""
        return importance_weight(value, p_min, self._next_beta())

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Parameters, raw priorities, tree leaves, beta progress, ERE and own generator."""
        return {
            "schema": 1,
            "capacity": self._capacity,
            "alpha": self._alpha,
            "beta": self._beta,
            "eps": self._eps,
            "reduction": self.reduction,
            "sample_calls": self._sample_calls,
            "beta_schedule": self._beta_schedule
            if isinstance(self._beta_schedule, tuple)
            else None,
            "max_priority": None if self._max_raw is None else float(self._max_raw),
            "raw": self._raw.clone(),
            "tree": self._tree.state_dict(),
            **self._common_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (copies; the capacity must match).

        Raises:
            ValueError: if the checkpoint's capacity differs.
        """
        if int(state_dict["capacity"]) != self._capacity:
            raise ValueError(
                f"PrioritizedSampler capacity must match the checkpoint: this sampler has "
                f"{self._capacity}, the checkpoint {state_dict['capacity']}"
            )
        self._alpha = float(state_dict["alpha"])
        self._beta = float(state_dict["beta"])
        self._eps = float(state_dict["eps"])
        self.reduction = state_dict["reduction"]
        self._sample_calls = int(state_dict["sample_calls"])
        if state_dict.get("beta_schedule") is not None:
            self._beta_schedule = _check_beta_schedule(tuple(state_dict["beta_schedule"]))
        max_priority = state_dict["max_priority"]
        device = self._tree.device
        self._max_raw = (
            None
            if max_priority is None
            else torch.tensor(max_priority, dtype=self.dtype, device=device)
        )
        raw = torch.as_tensor(state_dict["raw"])
        self._raw = filled(raw.shape[0], 0.0, self.dtype, device).copy_(raw)
        self._tree.load_state_dict(state_dict["tree"])
        written = torch.nonzero(self._tree.values() > 0)
        self._high_water = int(written.max()) if written.numel() else -1
        self._load_common_state(state_dict)

    def _empty(self) -> None:
        self._high_water = -1
        self._tree.clear()
        self._raw.zero_()
        self._max_raw = None

    def __repr__(self) -> str:
        return (
            f"PrioritizedSampler(capacity={self._capacity}, alpha={self._alpha}, "
            f"beta={self.beta}, eps={self._eps}, ere={self._ere}, device={self.device})"
        )


def _check_beta_schedule(schedule: Any) -> BetaSchedule | None:
    if schedule is None or callable(schedule):
        return schedule
    if isinstance(schedule, (tuple, list)) and len(schedule) == 2:
        beta_end, steps = schedule
        if (
            isinstance(beta_end, (int, float))
            and beta_end >= 0
            and isinstance(steps, int)
            and not isinstance(steps, bool)
            and steps >= 1
        ):
            return (float(beta_end), steps)
    raise ValueError(
        "beta_schedule must be a callable t -> beta or a tuple (beta_end >= 0, steps >= 1), "
        f"got {schedule!r}"
    )


def _ravel(coords: Tensor, shape: tuple[int, ...]) -> Tensor:
    strides = [1] * len(shape)
    for dim in range(len(shape) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    keep = (coords >= 0).all(-1)
    flat = (coords * torch.tensor(strides, device=coords.device)).sum(-1)
    return torch.where(keep, flat, -1)
