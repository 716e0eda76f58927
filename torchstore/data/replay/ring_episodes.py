"""The episode index of a replay ring, kept up to date as rows are written.

A ring of ``capacity`` rows holds its rows in *age order*: from the oldest row to the
newest. When the ring is full the oldest row sits at the cursor (the physical row the
next write goes to); before that, rows ``0 .. rows-1`` are the valid ones, oldest first.

The index is a table of *segments* in age order, one per surviving (part of an) episode:
``(start, length, episode_id)``. The rows of a segment are
``(start + arange(length)) % capacity``; a segment never runs from the newest row into the
oldest (the wrap point), never crosses an episode end, and always includes the last
step of its episode when that step survives. The table is itself a ring of slots, so an
append touches only the rows written and the segments evicted: each write costs
``O(rows written + segments evicted)`` tensor work, never a scan of the ring.

Episode ids are global and increase with age: the ``k``-th episode ever started gets id
``k`` (``next_episode_id`` counts them). Ids are never reused. A rebuild (after a write
that changed end flags out of the append order) gives every surviving episode a fresh id.

The bookkeeping is small and sequential, so the slot table lives in NumPy arrays on the
host (a NumPy operation on a handful of numbers costs a fraction of a torch one, and an
append is a dozen of them); :meth:`RingEpisodes.segments` hands out tensors, which the
storage mirrors onto its device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torchstore.validation import positive_int

__all__ = ["RingEpisodes", "segments_from_ends", "age_rows"]

_MIN_SLOTS = 64
#: chunks with at most this many episode ends (and evictions of at most this many
#: segments) take scalar steps; more take the vectorised path
_SCALAR_ENDS = 8


def _flags(ends: torch.Tensor | np.ndarray) -> np.ndarray:
    """End flags as a 1-D numpy bool array (no copy for a CPU bool tensor)."""
    if isinstance(ends, np.ndarray):
        return ends.reshape(-1).astype(bool, copy=False)
    if ends.dtype is not torch.bool or not ends.is_cpu or ends.requires_grad:
        ends = ends.detach().to("cpu", torch.bool)
    return ends.numpy().reshape(-1)


def segments_from_ends(ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``n`` consecutive rows after every end flag.

    Args:
        ends: bool ``[n]``, True where a row is the last step of its episode.

    Returns:
        ``(offsets, lengths)``: int64 pieces covering ``0 .. n-1`` in order; the last
        piece is open (runs to ``n``) when ``ends[-1]`` is False.

    Examples:
        >>> segments_from_ends(torch.tensor([False, True, False, False, True, False]))
        (tensor([0, 2, 5]), tensor([2, 3, 1]))
    """
    n = ends.numel()
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    stops = torch.nonzero(ends.reshape(-1)).reshape(-1) + 1
    if stops.numel() == 0 or int(stops[-1]) != n:
        stops = torch.cat([stops, torch.tensor([n], dtype=torch.int64)])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), stops[:-1]])
    return offsets, stops - offsets


def age_rows(rows: int, cursor: int, capacity: int) -> torch.Tensor:
    """Physical rows of a ring from oldest to newest: from the cursor when full, else from 0."""
    oldest = cursor if rows == capacity else 0
    return (oldest + torch.arange(rows, dtype=torch.int64)) % capacity


class RingEpisodes:
    """Incremental episode index of a ring of ``capacity`` rows.

    Args:
        capacity: rows in the ring.

    Examples:
        >>> index = RingEpisodes(4)
        >>> index.append(torch.tensor([False, True, False]))
        >>> index.append(torch.tensor([False, False]))  # wraps: overwrites row 0
        >>> index.segments()
        (tensor([1, 2]), tensor([1, 3]), tensor([0, 1]))
    """

    def __init__(self, capacity: int):
        self.capacity = positive_int("capacity", capacity)
        self.next_episode_id = 0
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every row (the id counter keeps counting, so ids are never reused)."""
        self.rows = 0
        self.cursor = 0
        self.is_open = False
        self._head = 0
        self._count = 0
        self._slots = 0
        self._start = np.zeros(0, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)
        self._id = np.zeros(0, dtype=np.int64)
        self.version = getattr(self, "version", 0) + 1

    @property
    def is_full(self) -> bool:
        return self.rows == self.capacity

    @property
    def num_segments(self) -> int:
        return self._count

    @property
    def oldest(self) -> int:
        """Physical row of the oldest valid row."""
        return self.cursor if self.is_full else 0

    def accepts_append(self, first_row: int) -> bool:
        """Whether rows written from physical ``first_row`` on extend the age order."""
        return first_row == self.cursor and (self.is_full or self.cursor == self.rows)

    def age_rows(self) -> torch.Tensor:
        """Physical rows ``[rows]`` from oldest to newest."""
        return age_rows(self.rows, self.cursor, self.capacity)

    # ----------------------------------------------------------------- writes
    def append(self, ends: torch.Tensor | np.ndarray) -> None:
        """Record ``n`` rows written at the cursor, in order, with their end flags.

        Rows beyond ``capacity`` overwrite the oldest ones (a chunk longer than the ring
        keeps only its last ``capacity`` rows); episodes that lose every row leave the
        index, a partly overwritten one keeps its surviving rows.

        A chunk with few episode ends (the common case: a collector's chunk is shorter
        than an episode) is recorded with scalar steps, a few microseconds whatever its
        length; many ends take the vectorised path. Both leave the same table.
        """
        flags = _flags(ends)
        # np.flatnonzero's wrappers cost several times more
        self.append_stops(flags.nonzero()[0], flags.shape[0])

    def append_stops(self, stops: np.ndarray, n: int) -> None:
        """:meth:`append` of ``n`` rows given where their end flags are: ``stops``, the
        increasing positions (int64, in ``[0, n)``) of the rows that end an episode."""
        if n == 0:
            return
        k = stops.shape[0]
        if k == 0 and self.is_open and self._count:  # the open episode goes on
            self._length[(self._head + self._count - 1) % self._slots] += n
        elif k > _SCALAR_ENDS:
            self._append_many(n, stops)
        else:
            self._append_few(stops.tolist(), n)
        total = self.rows + n
        self._evict(max(0, total - self.capacity))
        self.rows = min(total, self.capacity)
        self.cursor = (self.cursor + n) % self.capacity
        self.is_open = k == 0 or int(stops[k - 1]) != n - 1
        self.version += 1

    def _append_few(self, ends: list[int], n: int) -> None:
        """Pieces of a chunk whose end rows are ``ends`` (few), one scalar step each."""
        offset = 0
        pieces = [e + 1 for e in ends]
        if not pieces or pieces[-1] != n:
            pieces.append(n)
        for stop in pieces:
            length = stop - offset
            if offset == 0 and self.is_open and self._count:
                last = (self._head + self._count - 1) % self._slots
                self._length[last] += length
            else:
                self._push_one((self.cursor + offset) % self.capacity, length)
            offset = stop

    def _append_many(self, n: int, stops: np.ndarray) -> None:
        stops = stops + 1
        if stops[-1] != n:
            stops = np.append(stops, n)
        offsets = np.empty_like(stops)
        offsets[0] = 0
        offsets[1:] = stops[:-1]
        lengths = stops - offsets
        starts = (self.cursor + offsets) % self.capacity
        if self.is_open and self._count:
            last = (self._head + self._count - 1) % self._slots
            self._length[last] += lengths[0]
            starts, lengths = starts[1:], lengths[1:]
        k = lengths.shape[0]
        if k:
            ids = np.arange(self.next_episode_id, self.next_episode_id + k, dtype=np.int64)
            self.next_episode_id += k
            self._push(starts, lengths, ids)

    def rebuild(self, ends: torch.Tensor, *, rows: int, cursor: int) -> None:
        """Recompute the table from the end flags of the valid rows, in age order.

        Used after writes outside the append order. Every surviving episode gets a fresh
        id (ids stay unique and increasing with age).

        Args:
            ends: bool ``[rows]``, end flags oldest to newest.
            rows: number of valid rows.
            cursor: physical row the next write goes to.
        """
        ends = ends.reshape(-1).to("cpu", torch.bool)
        if ends.numel() != rows:
            raise ValueError(f"rebuild needs {rows} end flags, got {ends.numel()}")
        self._check_position(rows, cursor)
        next_id = self.next_episode_id
        self.reset()
        self.next_episode_id = next_id
        self.rows, self.cursor = rows, cursor
        if rows == 0:
            return
        offsets, lengths = segments_from_ends(ends)
        ids = next_id + torch.arange(lengths.numel(), dtype=torch.int64)
        self.next_episode_id = next_id + lengths.numel()
        self._push((self.oldest + offsets) % self.capacity, lengths, ids)
        self.is_open = not bool(ends[-1])

    def load(
        self,
        lengths: torch.Tensor,
        ids: torch.Tensor,
        *,
        rows: int,
        cursor: int,
        is_open: bool,
        next_episode_id: int,
    ) -> None:
        """Set the table from explicit episode lengths in age order (restore, prefill)."""
        lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1).cpu()
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1).cpu()
        self._check_position(rows, cursor)
        if lengths.numel() != ids.numel():
            raise ValueError(f"got {lengths.numel()} episode lengths but {ids.numel()} ids")
        if int(lengths.sum()) != rows or bool((lengths <= 0).any()):
            raise ValueError(f"episode lengths must be positive and sum to rows ({rows})")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("episode ids must increase with age")
        if ids.numel() and int(ids[-1]) >= next_episode_id:
            raise ValueError(
                f"next_episode_id ({next_episode_id}) must exceed the newest id ({int(ids[-1])})"
            )
        self.reset()
        self.rows, self.cursor = rows, cursor
        self.next_episode_id = int(next_episode_id)
        offsets = torch.cumsum(lengths, 0) - lengths
        if rows:
            self._push((self.oldest + offsets) % self.capacity, lengths, ids)
        self.is_open = bool(is_open) and rows > 0

    def _check_position(self, rows: int, cursor: int) -> None:
        if not 0 <= rows <= self.capacity:
            raise ValueError(f"rows ({rows}) must be in [0, {self.capacity}]")
        if not 0 <= cursor < self.capacity:
            raise ValueError(f"cursor ({cursor}) must be in [0, {self.capacity})")

    # -------------------------------------------------------------- the table
    def _push(self, starts: Any, lengths: Any, ids: Any) -> None:
        starts, lengths, ids = (np.asarray(x, dtype=np.int64) for x in (starts, lengths, ids))
        k = lengths.shape[0]
        self._reserve(self._count + k)
        pos = (self._head + self._count + np.arange(k, dtype=np.int64)) % self._slots
        self._start[pos] = starts
        self._length[pos] = lengths
        self._id[pos] = ids
        self._count += k

    def _push_one(self, start: int, length: int) -> None:
        """Push one new episode's segment (the next id)."""
        self._reserve(self._count + 1)
        pos = (self._head + self._count) % self._slots
        self._start[pos] = start
        self._length[pos] = length
        self._id[pos] = self.next_episode_id
        self.next_episode_id += 1
        self._count += 1

    def _reserve(self, needed: int) -> None:
        if needed <= self._slots:
            return
        slots = max(_MIN_SLOTS, 1 << (needed - 1).bit_length())
        order = self._order()
        for name in ("_start", "_length", "_id"):
            old = getattr(self, name)
            new = np.zeros(slots, dtype=np.int64)
            new[: self._count] = old[order]
            setattr(self, name, new)
        self._head, self._slots = 0, slots

    def _order(self) -> np.ndarray:
        return (self._head + np.arange(self._count, dtype=np.int64)) % max(self._slots, 1)

    def _evict(self, k: int) -> None:
        """Drop the ``k`` oldest rows: whole segments first, then trim the next one."""
        # A write usually evicts a segment or two: scalar steps; many take the vector path.
        for _ in range(_SCALAR_ENDS):
            if k <= 0:
                return
            head = self._head
            length = int(self._length[head])
            if length > k:
                self._start[head] = (int(self._start[head]) + k) % self.capacity
                self._length[head] = length - k
                return
            self._head = (head + 1) % self._slots
            self._count -= 1
            k -= length
        if k > 0:
            self._evict_many(k)

    def _evict_many(self, k: int) -> None:
        m = min(self._count, k + 1)
        pos = (self._head + np.arange(m, dtype=np.int64)) % self._slots
        cum = np.cumsum(self._length[pos])
        whole = int(np.searchsorted(cum, k, side="right"))
        removed = int(cum[whole - 1]) if whole else 0
        self._head = (self._head + whole) % self._slots
        self._count -= whole
        rest = k - removed
        if rest:
            self._start[self._head] = (self._start[self._head] + rest) % self.capacity
            self._length[self._head] -= rest

    # ------------------------------------------------------------------ reads
    def segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start, length, episode_id)``: int64 ``[num_segments]`` copies, oldest first."""
        order = self._order()
        return (
            torch.from_numpy(self._start[order]),
            torch.from_numpy(self._length[order]),
            torch.from_numpy(self._id[order]),
        )

    def state_dict(self) -> dict[str, Any]:
        start, length, ids = self.segments()
        return {
            "capacity": self.capacity,
            "rows": self.rows,
            "cursor": self.cursor,
            "is_open": self.is_open,
            "next_episode_id": self.next_episode_id,
            "start": start,
            "length": length,
            "episode_id": ids,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"episode index capacity ({self.capacity}) differs from the saved one "
                f"({int(state['capacity'])})"
            )
        self.load(
            state["length"],
            state["episode_id"],
            rows=int(state["rows"]),
            cursor=int(state["cursor"]),
            is_open=bool(state["is_open"]),
            next_episode_id=int(state["next_episode_id"]),
        )
        start, _, _ = self.segments()
        saved = torch.as_tensor(state["start"], dtype=torch.int64).cpu()
        if not torch.equal(start, saved):
            raise ValueError("saved segment starts do not match the saved rows and cursor")

    def __repr__(self) -> str:
        return (
            f"RingEpisodes(capacity={self.capacity}, rows={self.rows}, cursor={self.cursor}, "
            f"segments={self._count}, open={self.is_open}, next_episode_id={self.next_episode_id})"
        )
