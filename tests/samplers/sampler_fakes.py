"""Minimal storages implementing what the samplers read (tests only).

``FakeRing`` is the sampler-facing interface of a ring store and nothing more: ``len``,
``capacity``, ``cursor``, ``device``, ``fill_level``/``cursor_tensor`` and
``episode_segments()``, with the episode of every physical row kept as ground truth so
tests can check windows against it. ``EpisodeLazyStorage`` adds the same interface to
torchrl's ``LazyTensorStorage`` (reading an ``"episode"`` column) so torchrl's buffers can
drive the window sampler.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torchrl.data import LazyTensorStorage


def segments_in_age_order(row_episode: list[int], cursor: int, rows: int, capacity: int):
    """Maximal runs of one episode, walking rows from oldest to newest."""
    first = cursor if rows == capacity else 0
    starts, lengths, ids = [], [], []
    for age in range(rows):
        row = (first + age) % capacity
        ep = row_episode[row]
        if lengths and ids[-1] == ep:
            lengths[-1] += 1
        else:
            starts.append(row)
            lengths.append(1)
            ids.append(ep)
    as_long = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return as_long(starts), as_long(lengths), as_long(ids)


class FakeRing:
    """A ring of ``capacity`` rows that records which episode each row holds."""

    ndim = 1

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.max_size = capacity
        self.device = torch.device("cpu")
        self.row_episode = [-1] * capacity
        self.cursor = 0
        self.rows = 0
        self.next_episode = 0

    def __len__(self) -> int:
        return self.rows

    @property
    def fill_level(self) -> torch.Tensor:
        return torch.tensor(self.rows)

    @property
    def cursor_tensor(self) -> torch.Tensor:
        return torch.tensor(self.cursor)

    def write(self, n: int, *, new_episode: bool = True) -> torch.Tensor:
        """Append ``n`` rows, as a new episode or continuing the last one; return the rows."""
        if new_episode or self.next_episode == 0:
            self.next_episode += 1
        ep = self.next_episode - 1
        rows = []
        for _ in range(n):
            self.row_episode[self.cursor] = ep
            rows.append(self.cursor)
            self.cursor = (self.cursor + 1) % self.capacity
            self.rows = min(self.rows + 1, self.capacity)
        return torch.tensor(rows, dtype=torch.int64)

    def age(self, row: int) -> int:
        """0 for the oldest row, ``rows - 1`` for the newest."""
        first = self.cursor if self.rows == self.capacity else 0
        return (row - first) % self.capacity

    def newest(self, count: int) -> set[int]:
        return {(self.cursor - count + j) % self.capacity for j in range(count)}

    def episode_segments(self):
        return segments_in_age_order(self.row_episode, self.cursor, self.rows, self.capacity)


class EpisodeLazyStorage(LazyTensorStorage):
    """``LazyTensorStorage`` plus ``capacity``/``cursor``/``episode_segments`` from an
    ``"episode"`` column (StoreReplay provides these natively)."""

    @property
    def capacity(self) -> int:
        return self.max_size

    @property
    def cursor(self) -> int:
        last = self._last_cursor_index
        return 0 if last is None else (int(last) + 1) % self.max_size

    def state_dict(self):
        # torchrl's TensorStorage.state_dict drops the cursor; a ring needs it.
        return {**super().state_dict(), "_ring_cursor": self._last_cursor_index}

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        cursor = state_dict.pop("_ring_cursor", None)
        super().load_state_dict(state_dict)
        self._set_last_cursor(cursor)

    def dumps(self, path):
        super().dumps(path)
        (Path(path) / "ring_cursor.json").write_text(json.dumps(self._last_cursor_index))

    def loads(self, path):
        super().loads(path)
        self._set_last_cursor(json.loads((Path(path) / "ring_cursor.json").read_text()))

    def episode_segments(self):
        n = len(self)
        episode = self._storage["episode"][:n].tolist() if n else []
        return segments_in_age_order(episode, self.cursor, n, self.max_size)
