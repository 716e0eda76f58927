"""Batch iteration for the DataModules: sized resumable iterables and rank state.

Lightning accepts any iterable as a dataloader. A :class:`Batches` has a length (so
Lightning never prefetches to find the end of an epoch: one ``next`` per training step)
and draws each batch lazily when it is asked for, from the DataModule's Philox stream (the
sampling core's :class:`~torchstore.samplers.philox.PhiloxStream`). The stream's position
is therefore exactly "batches consumed x draws per batch", which is what makes a resumed
run draw the batches an uninterrupted one would have. Nothing here samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "Batches",
    "EvalBatches",
    "rank_info",
    "gather_rank_states",
    "to_cpu",
]


class Batches:
    """``length`` batches per iteration, each drawn by ``draw()`` when it is asked for.

    Sized, so Lightning takes exactly one batch per training step. Lightning checkpoints
    its :meth:`state_dict` (the number of batches this epoch's iterator has handed out)
    and, on a mid-epoch resume, loads it so the resumed epoch holds only the remaining
    batches. The randomness itself lives in the DataModule's stream, not here.
    """

    def __init__(self, draw: Callable[[], Any], length: int):
        self._draw = draw
        self._length = length
        self._yielded = 0
        self._start = 0

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        self._yielded = start
        for _ in range(start, self._length):
            batch = self._draw()
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self._yielded, "length": self._length}

    def load_state_dict(self, state: dict[str, int]) -> None:
        yielded = int(state["yielded"])
        # a checkpoint taken after the epoch's last batch resumes at a fresh epoch
        self._start = yielded if 0 <= yielded < self._length else 0


class EvalBatches:
    """``length`` deterministic batches, batch ``i`` made by ``make(i)`` (validation)."""

    def __init__(self, make: Callable[[int], Any], length: int):
        self._make = make
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._length):
            yield self._make(i)


def rank_info(trainer: Any) -> tuple[int, int]:
    """``(rank, world_size)``: from the trainer when attached, else ``torch.distributed``."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_rank_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order.

    A collective under an initialised process group: every rank must call it.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [state]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in nested dicts, lists and tuples moved to the CPU."""
    if isinstance(obj, Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
