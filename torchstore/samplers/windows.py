"""Length-T windows inside episode segments, as pure tensor functions.

A *segment* is a run of consecutive ring rows from one episode: ``(start, length,
episode_id)``, its rows ``(start + arange(length)) % capacity``. The store keeps these on
write (``storage.episode_segments()``), so nothing here scans done flags. A segment never
crosses the ring's write cursor, so a window inside one segment crosses neither an episode
boundary nor the wrap point.

Choice of distribution: **uniform over all valid windows** in the buffer. A segment of
``length`` rows holds ``max(length - T + 1, 0)`` window starts, so segments are weighted by
that count (long episodes give proportionally more windows, every row of every long-enough
episode is reachable, the last one included). torchrl's ``SliceSampler`` instead picks an
episode uniformly first, which over-samples rows of short episodes.

With ``pad=True`` a segment shorter than ``T`` contributes one window, starting at its first
row; the missing steps repeat its last row and are ``False`` in the mask. Segments of ``T``
rows or more are never padded.

Examples:
    >>> import torch
    >>> start, length, ep = torch.tensor([0, 5]), torch.tensor([5, 3]), torch.tensor([7, 8])
    >>> w = choose_windows(start, length, ep, torch.tensor([0, 3, 4]), capacity=8, T=2)
    >>> w.index.tolist(), w.episode_id.tolist()
    ([[0, 1], [3, 4], [5, 6]], [7, 7, 8])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchstore.errors import EmptyStorageError
from torchstore.validation import non_negative_int, positive_int

__all__ = [
    "RowSet",
    "context_windows",
    "offset_rows",
    "Windows",
    "window_counts",
    "choose_windows",
    "windows_at",
    "offset_windows",
    "sample_windows",
    "clip_segments",
]


class Windows(NamedTuple):
    """A batch of ``n`` windows of ``T`` rows.

    Attributes:
        index: ``[n, T]`` int64 physical rows (modulo capacity).
        mask: ``[n, T]`` bool; ``False`` marks padding (always all ``True`` without pad).
        episode_id: ``[n]`` episode of each window.
        segment: ``[n]`` position of each window's segment in the segment tensors.
        start_step: ``[n]`` offset of the window's first row within its segment (the oldest
            surviving row of the episode is offset 0).
    """

    index: Tensor
    mask: Tensor
    episode_id: Tensor
    segment: Tensor
    start_step: Tensor


def window_counts(length: Tensor, T: int, *, pad: bool = False) -> Tensor:
    """Number of window starts each segment holds: ``max(length - T + 1, 0)``.

    With ``pad=True`` every non-empty segment holds at least one (padded) window.
    """
    counts = (length - T + 1).clamp(min=0)
    if pad:
        counts = torch.where(length > 0, counts.clamp(min=1), counts)
    return counts


def choose_windows(
    start: Tensor,
    length: Tensor,
    episode_id: Tensor,
    draws: Tensor,
    *,
    capacity: int,
    T: int,
    pad: bool = False,
) -> Windows:
    """Turn global window numbers into windows; no randomness, no host sync.

    Window number ``g`` in ``[0, window_counts(length, T, pad=pad).sum())`` is the
    ``g``-th valid window counting segment by segment. Draw ``g`` uniformly for uniform
    windows. Values outside that range are clamped into the first or last segment.

    Args:
        start, length, episode_id: ``[S]`` int64 segment tensors (``S >= 1``).
        draws: ``[n]`` int64 window numbers.
        capacity: ring capacity (the modulus of physical rows).
        T: window length.
        pad: allow padded windows in segments shorter than ``T``.

    Returns:
        The :class:`Windows`.
    """
    counts = window_counts(length, T, pad=pad)
    cum = counts.cumsum(0)
    seg = torch.searchsorted(cum, draws, right=True).clamp(0, counts.shape[0] - 1)
    offset = draws - (cum[seg] - counts[seg])
    return windows_at(start, length, episode_id, seg, offset, capacity=capacity, T=T)


def windows_at(
    start: Tensor,
    length: Tensor,
    episode_id: Tensor,
    segment: Tensor,
    offset: Tensor,
    *,
    capacity: int,
    T: int,
) -> Windows:
    """Build the windows starting ``offset`` rows into segments ``segment``.

    Offsets are clamped to ``[0, max(length - T, 0)]``; in a segment shorter than ``T`` the
    window starts at its first row and is padded (mask ``False``) past its last row.

    Args:
        start, length, episode_id: ``[S]`` int64 segment tensors.
        segment: ``[n]`` int64 positions into the segment tensors.
        offset: ``[n]`` int64 offsets of the first row within each segment.
        capacity: ring capacity.
        T: window length.
    """
    seg_len = length[segment]
    offset = torch.minimum(offset.clamp(min=0), (seg_len - T).clamp(min=0))
    steps = offset.unsqueeze(-1) + torch.arange(T, device=offset.device)
    last = (seg_len - 1).clamp(min=0).unsqueeze(-1)
    mask = steps <= last
    steps = torch.minimum(steps, last)
    index = (start[segment].unsqueeze(-1) + steps) % capacity
    return Windows(index, mask, episode_id[segment], segment, offset)


def offset_windows(
    start: Tensor,
    length: Tensor,
    episode_id: Tensor,
    segment: Tensor,
    step: Tensor,
    offsets: Tensor,
    *,
    capacity: int,
) -> Windows:
    """The rows ``step + offsets`` of segments ``segment``, clamped to each segment.

    LeRobot's frame selection over ring segments: :func:`offset_rows` in segment steps,
    then physical rows. An offset that leaves the segment takes its first or last row and
    is ``False`` in the mask.

    Args:
        start, length, episode_id: ``[S]`` int64 segment tensors.
        segment: ``[n]`` positions into the segment tensors.
        step: ``[n]`` the anchor's step within its segment (``0 .. length - 1``).
        offsets: ``[L]`` int64 frame offsets from the anchor.
        capacity: ring capacity.

    Returns:
        The :class:`Windows` (``[n, L]``); ``start_step`` holds the anchors' steps.
    """
    zero = torch.zeros_like(step)
    steps, pad = offset_rows(step, zero, length[segment], offsets.to(step.device))
    index = (start[segment].unsqueeze(-1) + steps) % capacity
    return Windows(index, ~pad, episode_id[segment], segment, step)


def sample_windows(
    start: Tensor,
    length: Tensor,
    episode_id: Tensor,
    *,
    capacity: int,
    T: int,
    n: int,
    pad: bool = False,
    generator: torch.Generator | None = None,
    stream: Any = None,
) -> Windows:
    """Draw ``n`` windows uniformly over all valid windows (see the module docstring).

    Args:
        start, length, episode_id: ``[S]`` int64 segment tensors, as
            ``storage.episode_segments()`` returns them.
        capacity: ring capacity.
        T: window length (>= 1).
        n: number of windows (>= 0).
        pad: allow padded windows in segments shorter than ``T``.
        generator: torch generator for the draws (the global one when ``None``).
        stream: a :class:`~torchstore.samplers.philox.PhiloxStream` to draw from instead
            (window number ``g`` is ``stream.randint(n, total)``).

    Returns:
        The :class:`Windows`, on the device of ``start``.

    Raises:
        ValueError: if ``T < 1``, ``n < 0`` or the segment tensors disagree in shape.
        EmptyStorageError: if the segments hold no rows, or (``pad=False``) no segment
            holds ``T`` rows.
    """
    T = positive_int("T", T, hint=" (the window length)")
    n = non_negative_int("n", n, hint=" (the number of windows)")
    if not (start.ndim == 1 and start.shape == length.shape == episode_id.shape):
        raise ValueError(
            "segment start, length and episode_id must be 1-D of one shape, got "
            f"{tuple(start.shape)}, {tuple(length.shape)}, {tuple(episode_id.shape)}"
        )
    longest = int(length.max()) if length.numel() else 0
    if longest <= 0:
        raise EmptyStorageError("Cannot sample windows from an empty storage (no episode rows)")
    total = int(window_counts(length, T, pad=pad).sum())
    if total == 0:
        raise EmptyStorageError(
            f"no episode holds a window of length T={T}: the longest episode has {longest} "
            "rows; pass pad=True or use a shorter window"
        )
    if stream is not None:
        draws = stream.randint(n, total)
    else:
        draw_device = generator.device if generator is not None else start.device
        draws = torch.randint(total, (n,), generator=generator, device=draw_device)
    return choose_windows(
        start, length, episode_id, draws.to(start.device), capacity=capacity, T=T, pad=pad
    )


def clip_segments(
    start: Tensor, length: Tensor, *, cursor: int | Tensor, count: int | Tensor, capacity: int
) -> tuple[Tensor, Tensor]:
    """Restrict segments to the newest ``count`` rows of a ring (ERE for windows).

    A row's age position is ``(row - cursor) % capacity`` (oldest 0, newest ``capacity -
    1`` once full); the newest ``count`` rows are those at positions ``>= capacity -
    count``. Segments never cross the cursor, so each one is contiguous in age positions
    and its clipped part is again one segment. Segments wholly older get length 0.

    Args:
        start, length: ``[S]`` int64 segment tensors.
        cursor: the ring's write cursor.
        count: how many of the newest rows to keep.
        capacity: ring capacity.

    Returns:
        ``(start, length)`` of the clipped segments (same ``S``; drop zero lengths if needed).
    """
    pos = (start - cursor) % capacity
    keep_from = capacity - count
    new_pos = torch.maximum(pos, torch.as_tensor(keep_from, device=pos.device))
    new_len = (pos + length - new_pos).clamp(min=0)
    return (new_pos + cursor) % capacity, new_len


class RowSet:
    """The rows of a set of episode segments, numbered ``0 .. total - 1`` segment by segment.

    The row set of the uniform policy over episodes (a DataModule's training or validation
    episodes): drawing ``g`` uniformly in ``[0, total)`` and calling :meth:`locate` gives a
    row uniform over all rows of the segments (a long episode weighs by its length). It is
    :func:`choose_windows` with ``T = 1``, kept as a class so the cumulative lengths are
    computed once.

    Args:
        start, length, episode_id: ``[S]`` int64 segment tensors (rows ``start ..
            start + length - 1``, not wrapping), on the device rows are drawn on.

    Examples:
        >>> rows = RowSet(torch.tensor([0, 10]), torch.tensor([3, 2]), torch.tensor([4, 5]))
        >>> row, seg = rows.locate(torch.tensor([0, 2, 3, 4]))
        >>> row.tolist(), seg.tolist(), len(rows)
        ([0, 2, 10, 11], [0, 0, 1, 1], 5)
    """

    def __init__(self, start: Tensor, length: Tensor, episode_id: Tensor):
        self.start = start.to(torch.int64)
        self.length = length.to(device=self.start.device, dtype=torch.int64)
        self.episode = episode_id.to(device=self.start.device, dtype=torch.int64)
        self.cum = torch.cumsum(self.length, 0)
        self.total = int(self.cum[-1]) if len(self.cum) else 0
        first = int(self.start[0]) if len(self.start) else 0
        contiguous = bool((self.start[1:] == (self.start + self.length)[:-1]).all())
        #: first row when the segments are one contiguous block of rows, else ``None``
        self.first_row = first if contiguous else None

    @classmethod
    def of_episodes(cls, episodes: Any, ids: Tensor) -> RowSet:
        """The rows of episodes ``ids`` of an episode index (``offsets``/``lengths`` tensors)."""
        ids = ids.to(device=episodes.offsets.device, dtype=torch.int64)
        return cls(episodes.offsets[ids], episodes.lengths[ids], ids)

    def __len__(self) -> int:
        return self.total

    def locate(self, g: Tensor) -> tuple[Tensor, Tensor]:
        """``(row, segment)`` of row numbers ``g``; ``segment`` indexes this set's segments."""
        seg = torch.searchsorted(self.cum, g, right=True)
        return self.start[seg] + g - (self.cum[seg] - self.length[seg]), seg

    def rows(self, g: Tensor) -> Tensor:
        """Rows of row numbers ``g`` (no segment lookup when the rows are contiguous)."""
        if self.first_row is not None:
            return g + self.first_row
        return self.locate(g)[0]

    def segment_of(self, row: Tensor) -> Tensor:
        """The segment holding each of ``row`` (rows must belong to the set)."""
        order = torch.argsort(self.start)
        pos = torch.searchsorted(self.start[order], row, right=True) - 1
        return order[pos.clamp(min=0)]


def offset_rows(
    row: Tensor, first: Tensor, length: Tensor, offsets: Tensor
) -> tuple[Tensor, Tensor]:
    """Rows ``row + offsets`` clamped to each row's episode, and where that clamped.

    LeRobot's frame selection (``delta_timestamps`` as frame offsets): an offset that
    leaves the episode takes its first or last row instead and is marked as padding, so a
    window never crosses an episode. Any offsets: negative (history), strided, repeated,
    unsorted.

    Args:
        row: ``[n]`` int64 rows.
        first, length: ``[n]`` first row and length (>= 1) of each row's episode.
        offsets: ``[L]`` int64 frame offsets, on ``row``'s device.

    Returns:
        ``(index, pad)``, both ``[n, L]``: the rows, and ``True`` where ``row + offset``
        was outside the episode.

    Examples:
        >>> index, pad = offset_rows(torch.tensor([5]), torch.tensor([4]),
        ...                          torch.tensor([3]), torch.tensor([-2, 0, 1, 4]))
        >>> index.tolist(), pad.tolist()
        ([[4, 5, 6, 6]], [[True, False, False, True]])
    """
    lo = first.unsqueeze(1)
    hi = lo + length.unsqueeze(1) - 1
    index = row.unsqueeze(1) + offsets
    pad = (index < lo) | (index > hi)
    return torch.minimum(torch.maximum(index, lo), hi), pad


def context_windows(
    row: Tensor, first: Tensor, length: Tensor, *, before: int, after: int
) -> tuple[Tensor, Tensor]:
    """Rows ``row - before .. row + after`` clamped to each row's episode, with a mask.

    The window of history and chunk padding: an observation history of ``before + 1``
    steps ends at ``row`` and an action chunk of ``after + 1`` steps starts there. Steps
    before the episode's first row repeat the first row, steps after its last row repeat
    the last row, and the mask is ``False`` on them (:func:`offset_rows` of the offsets
    ``-before .. after``, its pad inverted).

    Args:
        row: ``[n]`` int64 rows.
        first, length: ``[n]`` first row and length of each row's episode.
        before, after: steps of context before and after ``row`` (>= 0).

    Returns:
        ``(index, mask)``, both ``[n, before + after + 1]``; column ``before`` is ``row``.

    Examples:
        >>> index, mask = context_windows(torch.tensor([5]), torch.tensor([4]),
        ...                               torch.tensor([3]), before=2, after=2)
        >>> index.tolist(), mask.tolist()
        ([[4, 4, 5, 6, 6]], [[False, True, True, True, False]])
    """
    steps = torch.arange(-before, after + 1, device=row.device)
    index, pad = offset_rows(row, first, length, steps)
    return index, ~pad
