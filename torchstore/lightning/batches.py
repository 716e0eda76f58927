"""Batch iteration for the DataModules: row sets, sized resumable iterables, rank state.

Lightning accepts any iterable as a dataloader. A :class:`Batches` has a length (so
Lightning never prefetches to find the end of an epoch: one ``next`` per training step)
and draws each batch lazily when it is asked for, from the DataModule's Philox stream.
The stream's position is therefore exactly "batches consumed x draws per batch", which
is what makes a resumed run draw the batches an uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from torchstore.data.episodes import EpisodeIndex
from torchstore.samplers.philox import (
    counters_from_offset,
    philox4x32,
    randint_below,
    uniform_from_words,
)

__all__ = [
    "DrawStream",
    "RowSegments",
    "Batches",
    "EvalBatches",
    "rank_info",
    "gather_rank_states",
    "to_cpu",
]

MAX_BLOCK_DRAWS = 1 << 16


class DrawStream:
    """Random draws from a Philox4x32-10 stream (key ``seed``, sub-stream ``stream``), in blocks.

    Draw ``i`` is the pair of 32-bit words ``2 * (i % 2)`` and ``2 * (i % 2) + 1`` of the
    Philox output for counter ``i // 2`` (:func:`~torchstore.samplers.philox.philox4x32`
    over :func:`~torchstore.samplers.philox.counters_from_offset`). An integer below ``high``
    is made from a pair by 64-bit multiply-shift
    (:func:`~torchstore.samplers.philox.randint_below`), a float by
    :func:`~torchstore.samplers.philox.uniform_from_words`.

    Philox is counter-based, so draw ``i`` is the same however it is computed. An eager
    Philox call costs a few hundred small tensor operations (about a millisecond on a CPU
    core for a few thousand counters), so the draws, and the integers or floats made from
    them, are computed for many batches in one call (a first block of 16 batches, each
    next one twice as large, up to ``max_block`` draws) and handed out batch by batch.
    ``position`` is the number of draws handed out: what a checkpoint saves; setting it
    seeks.

    Examples:
        >>> a, b = DrawStream(7, 1, "cpu"), DrawStream(7, 1, "cpu")
        >>> torch.equal(torch.cat([a.randint(3, 10), a.randint(5, 10)]), b.randint(8, 10))
        True
    """

    def __init__(
        self, seed: int, stream: int, device: torch.device | str, max_block: int = MAX_BLOCK_DRAWS
    ):
        self.seed, self.stream = seed, stream
        self.device = torch.device(device)
        self.max_block = max_block
        self.position = 0
        self._key = torch.tensor(
            [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], dtype=torch.int64, device=self.device
        )
        self._stream_id = torch.tensor(stream, dtype=torch.int64, device=self.device)
        self._start = 0  # draw number of self._pairs[0]
        self._pairs: Tensor | None = None
        self._derived: dict[Any, Tensor] = {}
        self._block = 0

    def _span(self, n: int) -> slice:
        """Compute the block holding draws ``[position, position + n)``; advance; their slice."""
        lo, hi = self.position - self._start, self.position + n - self._start
        if self._pairs is None or lo < 0 or hi > len(self._pairs):
            self._block = min(max(2 * self._block, 16 * n), self.max_block)
            first, skip = divmod(self.position, 2)  # first counter; draws of it to skip
            counters = -(-(max(n, self._block) + skip) // 2)
            offset = torch.tensor(first, dtype=torch.int64, device=self.device)
            words = philox4x32(counters_from_offset(offset, counters, self._stream_id), self._key)
            self._pairs = words.reshape(-1, 2)
            self._start, self._derived = 2 * first, {}
            lo, hi = skip, skip + n
        self.position += n
        return slice(lo, hi)

    def pairs(self, n: int) -> Tensor:
        """The next ``n`` draws as ``[n, 2]`` words (int64 holding uint32)."""
        return self._pairs[self._span(n)]

    def randint(self, n: int, high: int) -> Tensor:
        """The next ``n`` draws as integers in ``[0, high)`` (``high < 2**62``)."""
        span = self._span(n)
        key = ("int", high)
        if key not in self._derived:
            self._derived[key] = randint_below(self._pairs, high)
        return self._derived[key][span]

    def uniform(self, n: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """The next ``n`` draws as floats in ``[0, 1)``."""
        span = self._span(n)
        key = ("uniform", dtype)
        if key not in self._derived:
            self._derived[key] = uniform_from_words(self._pairs, dtype)
        return self._derived[key][span]


class RowSegments:
    """The rows of a set of episodes, numbered ``0 .. total - 1`` episode by episode.

    Drawing ``g`` uniformly in ``[0, total)`` and calling :meth:`locate` gives a row
    uniform over all rows of those episodes (long episodes weigh by their length).

    Args:
        episodes: the store's episode index, on the device the rows are drawn on.
        ids: int64 episode numbers (any order; kept as given).
    """

    def __init__(self, episodes: EpisodeIndex, ids: Tensor):
        device = episodes.device
        self.episode = ids.to(device=device, dtype=torch.int64)
        self.start = episodes.offsets[self.episode]
        self.length = episodes.lengths[self.episode]
        self.cum = torch.cumsum(self.length, 0)
        self.total = int(self.cum[-1]) if len(self.cum) else 0
        first = int(self.start[0]) if len(self.start) else 0
        contiguous = bool((self.start[1:] == (self.start + self.length)[:-1]).all())
        #: first row when the episodes are one contiguous block of rows, else ``None``
        self.first_row = first if contiguous else None

    def __len__(self) -> int:
        return self.total

    def locate(self, g: Tensor) -> tuple[Tensor, Tensor]:
        """``(row, segment)`` of row numbers ``g``; ``segment`` indexes this set's episodes."""
        seg = torch.searchsorted(self.cum, g, right=True)
        return self.start[seg] + g - (self.cum[seg] - self.length[seg]), seg

    def rows(self, g: Tensor) -> Tensor:
        """Store rows of row numbers ``g`` (no episode lookup when the rows are contiguous)."""
        if self.first_row is not None:
            return g + self.first_row
        return self.locate(g)[0]


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
