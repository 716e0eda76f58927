"""The episode index: ``ep_len`` and ``ep_offset`` (int64), checked and queried as tensors."""

from __future__ import annotations

import torch

from torchstore.errors import EpisodeError, StoreFormatError

__all__ = ["EpisodeIndex"]


class EpisodeIndex:
    """Episodes as contiguous, non-overlapping row ranges that cover the store exactly.

    Args:
        lengths: rows per episode (int64, each at least 1).
        offsets: first row of each episode; derived from ``lengths`` when omitted.
        num_rows: total rows the episodes must cover; ``lengths.sum()`` when omitted.

    Examples:
        >>> idx = EpisodeIndex(torch.tensor([3, 2]))
        >>> idx.episode_of(torch.tensor([0, 2, 3])).tolist()
        [0, 0, 1]
        >>> idx.range(1)
        (3, 5)
    """

    def __init__(
        self,
        lengths: torch.Tensor,
        offsets: torch.Tensor | None = None,
        *,
        num_rows: int | None = None,
    ):
        lengths = torch.as_tensor(lengths, dtype=torch.int64)
        if lengths.ndim != 1:
            raise StoreFormatError(f"episode lengths must be 1-D, got shape {list(lengths.shape)}")
        expected = torch.zeros_like(lengths)
        if len(lengths) > 1:
            expected[1:] = torch.cumsum(lengths[:-1], 0)
        if offsets is None:
            offsets = expected
        offsets = torch.as_tensor(offsets, dtype=torch.int64, device=lengths.device)
        if offsets.shape != lengths.shape:
            raise StoreFormatError(
                f"episode index has {len(lengths)} lengths but {len(offsets)} offsets"
            )
        if len(lengths) and bool((lengths < 1).any()):
            bad = int(torch.nonzero(lengths < 1)[0])
            raise StoreFormatError(
                f"episode {bad} has length {int(lengths[bad])}; lengths must be >= 1"
            )
        if not torch.equal(offsets, expected):
            bad = int(torch.nonzero(offsets != expected)[0])
            raise StoreFormatError(
                f"episode {bad} starts at row {int(offsets[bad])}, expected {int(expected[bad])}: "
                "episodes must be contiguous and non-overlapping"
            )
        total = int(lengths.sum())
        if num_rows is not None and total != num_rows:
            raise StoreFormatError(f"episodes cover {total} rows but the store holds {num_rows}")
        self.lengths = lengths
        self.offsets = offsets
        self.num_rows = total

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    def to(self, device: torch.device | str) -> EpisodeIndex:
        out = EpisodeIndex.__new__(EpisodeIndex)
        out.lengths = self.lengths.to(device)
        out.offsets = self.offsets.to(device)
        out.num_rows = self.num_rows
        return out

    def range(self, episode: int) -> tuple[int, int]:
        """``(start, stop)`` rows of one episode; negative numbers count from the end."""
        n = self.num_episodes
        if not -n <= episode < n:
            raise EpisodeError(f"episode ({episode}) is out of range for {n} episodes")
        episode %= n
        start = int(self.offsets[episode])
        return start, start + int(self.lengths[episode])

    def episode_of(self, rows: torch.Tensor | int) -> torch.Tensor:
        """Episode number of each row (vectorised ``searchsorted``)."""
        rows = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.num_rows):
            raise EpisodeError(
                f"rows must lie in [0, {self.num_rows}), got min {int(rows.min())}, "
                f"max {int(rows.max())}"
            )
        return torch.searchsorted(self.offsets, rows, right=True) - 1

    def __repr__(self) -> str:
        return (
            f"EpisodeIndex(episodes={self.num_episodes}, rows={self.num_rows}, "
            f"device={self.device})"
        )
