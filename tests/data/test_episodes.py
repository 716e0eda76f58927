from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchstore.data import EpisodeIndex
from torchstore.errors import EpisodeError, StoreFormatError


def test_lookup_and_ranges():
    idx = EpisodeIndex(torch.tensor([3, 1, 4]))
    assert idx.offsets.tolist() == [0, 3, 4]
    assert idx.num_rows == 8 and len(idx) == 3
    assert idx.episode_of(torch.arange(8)).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert idx.range(-1) == (4, 8)
    with pytest.raises(EpisodeError, match=r"episode \(3\) is out of range for 3 episodes"):
        idx.range(3)
    with pytest.raises(EpisodeError, match=r"rows must lie in \[0, 8\)"):
        idx.episode_of(8)


@pytest.mark.parametrize(
    "lengths, offsets, rows, match",
    [
        ([3, 2], [0, 4], None, "episode 1 starts at row 4, expected 3"),
        ([3, 0], None, None, "episode 1 has length 0"),
        ([3, 2], None, 6, "episodes cover 5 rows but the store holds 6"),
        ([3, 2], [0], None, "2 lengths but 1 offsets"),
    ],
)
def test_invalid_indexes_are_rejected(lengths, offsets, rows, match):
    with pytest.raises(StoreFormatError, match=match):
        EpisodeIndex(
            torch.tensor(lengths), None if offsets is None else torch.tensor(offsets), num_rows=rows
        )


@given(st.lists(st.integers(1, 50), min_size=1, max_size=40))
def test_every_row_maps_back_into_its_episode(lengths):
    idx = EpisodeIndex(torch.tensor(lengths))
    eps = idx.episode_of(torch.arange(idx.num_rows))
    for e in range(len(lengths)):
        start, stop = idx.range(e)
        assert bool((eps[start:stop] == e).all())
