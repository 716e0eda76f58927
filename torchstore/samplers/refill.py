"""The refill schedule of a window over a store larger than memory: blocks, order, phases.

Pure host-side bookkeeping, no I/O (the reads live in :mod:`torchstore.window.block_window`).

**Blocks.** The rows to sample (a set of segments: episodes, or one run of rows) are cut
into *blocks* of at most ``block_rows`` contiguous rows (:func:`cut_blocks`). With
``align=True`` a block holds whole episodes only, so a sequence window or an
observation-history/action-chunk window inside an episode is always inside one resident
block; an episode longer than a block is a :class:`~torchstore.errors.ResidencyError`.
A block never spans a gap between segments.

**Order.** Every epoch the blocks are put in an order drawn from the core's Philox
stream (:class:`~torchstore.samplers.philox.PhiloxStream` keyed by the seed, on the
sub-stream :data:`BLOCK_STREAM` that no rank or worker uses for rows; epoch ``e`` reads the
stream at position ``e * blocks``). Under DDP every rank computes the same order and rank
``r`` of ``W`` takes every ``W``-th block of it, so ranks read disjoint blocks in an epoch.

**Phases.** Epoch ``e`` has one phase per block of the rank's order ``O`` (``N`` blocks).
Its phase ``j`` samples from the ``K`` resident blocks ``O[j], O[j + 1], .., O[j + K - 1]``
(indices mod ``N``: the order is read as a cycle, so the last phases of an epoch take its
first blocks again). Inside an epoch going to phase ``j + 1`` swaps one block (``O[j]``
out, ``O[j + K]`` in), which a background thread has read into a spare slot meanwhile
(double-buffered: ``K + 1`` slots); at an epoch's end the ``K`` blocks of the next epoch's
first phase come in (the prefetched one, the others read then). An epoch reads
``N + K - 1`` blocks (``N`` when ``K = N``: nothing is read inside the epoch).
Phase ``p`` lasts ``floor(credit)`` batches, ``credit`` accumulating ``w_p / (K * B)`` (the
remainder is carried, so nothing is lost to rounding), where ``w_p`` is what the active
blocks weigh: rows (uniform rows), valid windows (sequence windows), or priority mass scaled
to rows (prioritized). Within a phase draws are uniform over the active rows (windows) or
proportional to their priorities.

*Why this is uniform over the store.* Every block is active in exactly ``K`` phases of
every epoch, the first included. Phase ``p`` draws ``c * w_p`` units uniformly over its
``w_p`` active units, so each unit of a phase is drawn ``c`` times in expectation, and each
unit of the store ``K * c`` times per epoch: the same for every row, the expected frequency
of uniform sampling over the whole store (up to the carried remainder, less than one batch
per phase, which moves to the next phase instead of being dropped). ``tests/samplers``
checks the phase counts and a chi-square over one epoch's row counts. The same argument
with mass in place of rows makes the prioritized marginal ``p_i / sum(p)``; see
:mod:`torchstore.window.block_window` for the bias that remains when priorities change
mid-epoch and how the importance weights treat it.

State for an exact resume: ``(phase, left, credit)`` here, plus the row stream's position.

Examples:
    >>> import numpy as np
    >>> blocks = cut_blocks(np.array([0, 5, 12]), np.array([5, 7, 3]), 8, align=True)
    >>> blocks.lo.tolist(), blocks.hi.tolist()
    ([0, 5, 12], [5, 12, 15])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from torchstore.errors import ResidencyError
from torchstore.samplers.philox import PhiloxStream
from torchstore.validation import positive_int, positive_number, size_string_bytes

__all__ = [
    "BLOCK_STREAM",
    "Blocks",
    "cut_blocks",
    "parse_budget",
    "RefillSchedule",
]

#: Philox sub-stream of the block order (rows use the rank or worker number: small ints)
BLOCK_STREAM = 1 << 62


def parse_budget(budget: Any) -> tuple[str, int | None]:
    """``("all", None)``, ``("rows", n)`` or ``("bytes", n)`` from a ``resident=`` value.

    Accepts ``"all"``, a positive int (rows) or a size string such as ``"8GiB"``,
    ``"512MB"`` or ``"1_000_000B"``.

    Raises:
        ResidencyError: for anything else.
    """
    if isinstance(budget, str) and budget.strip().lower() == "all":
        return "all", None
    if isinstance(budget, bool):
        raise ResidencyError(
            f"resident ({budget!r}) must be 'all', a row count or a size like '8GiB'"
        )
    if isinstance(budget, int):
        if budget < 1:
            raise ResidencyError(f"resident ({budget}) rows must be >= 1")
        return "rows", budget
    if isinstance(budget, str):
        size = size_string_bytes(budget)
        if size is not None:
            return "bytes", size
    raise ResidencyError(
        f"resident ({budget!r}) must be 'all', a row count or a size like '8GiB' or '512MB'"
    )


class Blocks(NamedTuple):
    """Blocks of contiguous rows ``[lo[i], hi[i])`` and the segments each one holds.

    Attributes:
        lo, hi: ``[nb]`` int64 first row and end of each block.
        seg_lo, seg_hi: ``[nb]`` first segment and end (exclusive) of the segments inside each
            block (with ``align=False`` a segment may be cut; the block holds a part of it).
    """

    lo: np.ndarray
    hi: np.ndarray
    seg_lo: np.ndarray
    seg_hi: np.ndarray

    def __len__(self) -> int:
        return len(self.lo)

    @property
    def rows(self) -> np.ndarray:
        return self.hi - self.lo


def cut_blocks(start: np.ndarray, length: np.ndarray, block_rows: int, *, align: bool) -> Blocks:
    """Cut segments (rows ``start[i] .. start[i] + length[i] - 1``, ascending) into blocks.

    Args:
        start, length: ``[S]`` segments in ascending row order (gaps allowed).
        block_rows: most rows a block holds (>= 1).
        align: keep every segment whole inside one block (greedy: a block takes whole
            segments while they fit); otherwise cut runs of contiguous rows every
            ``block_rows`` rows.

    Raises:
        ResidencyError: with ``align=True``, for a segment longer than ``block_rows``.
    """
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    block_rows = positive_int("block_rows", block_rows, error=ResidencyError)
    keep = length > 0
    idx = np.nonzero(keep)[0]
    lo: list[int] = []
    hi: list[int] = []
    s_lo: list[int] = []
    s_hi: list[int] = []
    if align:
        longest = int(length.max()) if len(length) else 0
        if longest > block_rows:
            raise ResidencyError(
                f"the longest training episode has {longest} rows, more than a block of the "
                f"resident budget holds ({block_rows} rows); windows need whole episodes "
                "resident: raise the budget or lower the number of resident blocks"
            )
        cur = -1
        for i in idx:
            a, n = int(start[i]), int(length[i])
            if cur >= 0 and a == hi[cur] and a + n - lo[cur] <= block_rows:
                hi[cur] = a + n
                s_hi[cur] = int(i) + 1
            else:
                lo.append(a)
                hi.append(a + n)
                s_lo.append(int(i))
                s_hi.append(int(i) + 1)
                cur += 1
    else:
        # runs of contiguous rows, each cut every block_rows rows
        runs: list[list[int]] = []  # [first row, end, first segment, end segment]
        for i in idx:
            a, n = int(start[i]), int(length[i])
            if runs and runs[-1][1] == a:
                runs[-1][1] = a + n
                runs[-1][3] = int(i) + 1
            else:
                runs.append([a, a + n, int(i), int(i) + 1])
        for a, b, _, _ in runs:
            for c in range(a, b, block_rows):
                d = min(c + block_rows, b)
                lo.append(c)
                hi.append(d)
                # segments overlapping [c, d)
                s_lo.append(int(np.searchsorted(start + length, c, side="right")))
                s_hi.append(int(np.searchsorted(start, d, side="left")))
    return Blocks(*(np.asarray(x, dtype=np.int64) for x in (lo, hi, s_lo, s_hi)))


class RefillSchedule:
    """Which blocks are resident in which phase, and how many batches each phase draws.

    Args:
        num_blocks: blocks of the store (all ranks together).
        resident_blocks: ``K``, blocks sampled from at once (capped at this rank's blocks
            per epoch).
        batch_size: draws per batch (``B``).
        seed: key of the Philox stream the block order is drawn from.
        rank, world_size: this rank takes blocks ``rank, rank + world_size, ...`` of every
            epoch's order.
        reuse: draws per unit of a block per time it is read (``c * K`` above; 1: a block is
            read once per pass of draws over its rows). Larger values read the store
            ``reuse`` times less often for the same draws, every row keeping the same
            expected frequency; consecutive batches then share blocks for longer.

    Raises:
        ResidencyError: when a rank would get no block.
    """

    def __init__(
        self,
        num_blocks: int,
        resident_blocks: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        reuse: float = 1.0,
    ):
        self.reuse = float(positive_number("reuse", reuse, error=ResidencyError))
        positive_int("resident_blocks", resident_blocks, error=ResidencyError)
        if num_blocks < world_size:
            raise ResidencyError(
                f"the store cuts into {num_blocks} blocks, fewer than the {world_size} ranks "
                "that read disjoint blocks; lower the resident budget or the number of ranks"
            )
        self.num_blocks = int(num_blocks)
        self.rank, self.world_size = int(rank), int(world_size)
        #: blocks this rank reads per epoch
        self.per_epoch = len(range(self.rank, self.num_blocks, self.world_size))
        self.k = min(int(resident_blocks), self.per_epoch)
        self.batch_size = int(batch_size)
        self._stream = PhiloxStream(seed, BLOCK_STREAM)
        self._orders: dict[int, np.ndarray] = {}
        self.phase = 0
        self.left = 0
        self.credit = 0.0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """This rank's blocks of epoch ``epoch``, in the order they are read."""
        order = self._orders.get(epoch)
        if order is None:
            self._stream.seek(epoch * self.num_blocks)
            keys = self._stream.uniform(self.num_blocks)
            perm = torch.argsort(keys, stable=True).numpy()
            order = perm[self.rank :: self.world_size].astype(np.int64)
            if len(self._orders) > 4:
                self._orders.clear()
            self._orders[epoch] = order
        return order

    def block_at(self, i: int) -> int:
        """Block ``i mod N`` of this rank's order for epoch ``i // N``.

        ``N`` is :attr:`per_epoch`.
        """
        epoch, j = divmod(i, self.per_epoch)
        return int(self.epoch_order(epoch)[j])

    def active(self, phase: int | None = None) -> list[int]:
        """The ``K`` blocks sampled from in ``phase`` (this one by default), oldest first.

        Phase ``j`` of epoch ``e`` takes blocks ``j .. j + K - 1`` of the epoch's order read
        as a cycle, so every block is active in exactly ``K`` phases of every epoch.
        """
        p = self.phase if phase is None else phase
        epoch, j = divmod(p, self.per_epoch)
        order = self.epoch_order(epoch)
        return [int(order[(j + i) % self.per_epoch]) for i in range(self.k)]

    def incoming(self, phase: int | None = None) -> int:
        """A block that enters when ``phase`` ends (the one to read in the background), or
        -1 when the next phase takes no block that ``phase`` does not hold.

        Inside an epoch one block enters; at an epoch's end the next epoch's first phase
        may bring up to ``K`` (this is the newest of them; the others are read then).
        """
        p = self.phase if phase is None else phase
        now = set(self.active(p))
        new = [b for b in self.active(p + 1) if b not in now]
        return new[-1] if new else -1

    def start_phase(self, weight: float) -> int:
        """Open the current phase with active weight ``weight``; its number of batches."""
        self.credit += self.reuse * float(weight) / (self.k * self.batch_size)
        n = int(self.credit)
        self.credit -= n
        self.left = n
        return n

    def take(self) -> None:
        """One batch of the current phase is drawn."""
        self.left -= 1

    def next_phase(self) -> None:
        self.phase += 1
        self.left = 0

    @property
    def epoch(self) -> int:
        """The epoch of the oldest active block."""
        return self.phase // self.per_epoch

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "left": self.left, "credit": self.credit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = int(state["phase"])
        self.left = int(state["left"])
        self.credit = float(state["credit"])

    def __repr__(self) -> str:
        return (
            f"RefillSchedule(blocks={self.num_blocks}, K={self.k}, rank={self.rank}/"
            f"{self.world_size}, phase={self.phase})"
        )
