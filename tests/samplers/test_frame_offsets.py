"""Frame offsets: LeRobot's delta_timestamps in frames, and the rows they select."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.errors import ArgumentError, ArgumentTypeError
from torchstore.samplers.frame_offsets import check_frame_offsets, offsets_of_timestamps
from torchstore.samplers.windows import context_windows, offset_rows


def lerobot_rule(seconds: list[float], fps: int, tolerance_s: float) -> list[int] | None:
    """lerobot 0.6's check_delta_timestamps + get_delta_indices, as its source reads."""
    if not all(abs(s * fps - round(s * fps)) / fps <= tolerance_s for s in seconds):
        return None
    return [round(s * fps) for s in seconds]


@settings(max_examples=200, deadline=None)
@given(
    fps=st.sampled_from([5, 10, 15, 30, 50, 60]),
    frames=st.lists(st.integers(-120, 120), min_size=1, max_size=8),
    jitter=st.lists(st.floats(-3e-4, 3e-4), min_size=8, max_size=8),
)
def test_seconds_become_frames_as_lerobot_converts_them(fps, frames, jitter):
    seconds = [f / fps + j for f, j in zip(frames, jitter)]
    want = lerobot_rule(seconds, fps, 1e-4)
    if want is None:
        with pytest.raises(ArgumentError, match=r"delta_timestamps\['k'\] holds .* s, which is"):
            offsets_of_timestamps({"k": seconds}, fps)
    else:
        assert offsets_of_timestamps({"k": seconds}, fps) == {"k": tuple(want)}


def test_tables_take_lists_ranges_arrays_and_tuple_keys():
    table = {"a": range(0, 10, 3), ("obs", "top"): np.array([-30, 0]), "b": torch.tensor([2])}
    assert check_frame_offsets(table) == {"a": (0, 3, 6, 9), "obs/top": (-30, 0), "b": (2,)}
    seconds = {"a": np.linspace(0, 1, 3), "b": torch.tensor([-0.5])}
    assert offsets_of_timestamps(seconds, fps=4) == {"a": (0, 2, 4), "b": (-2,)}


@pytest.mark.parametrize(
    ("table", "error", "match"),
    [
        ({"a": [True]}, ArgumentTypeError, r"holds True, not a whole number of frames"),
        ({"a": [1.0]}, ArgumentTypeError, "offsets in seconds go in delta_timestamps"),
        ({"a": "01"}, ArgumentTypeError, "must be a list of offsets"),
        ({"a": []}, ArgumentError, "at least one offset"),
        ({"": [0]}, ArgumentTypeError, "must be a column name"),
        ({"a/b": [0], ("a", "b"): [1]}, ArgumentError, "names column 'a/b' twice"),
        ({}, ArgumentTypeError, "non-empty mapping"),
    ],
)
def test_bad_frame_tables_are_refused(table, error, match):
    with pytest.raises(error, match=match):
        check_frame_offsets(table)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delta_timestamps": {"a": [float("nan")]}}, ArgumentError, "not a finite time"),
        ({"delta_timestamps": {"a": ["0.1"]}}, ArgumentTypeError, "not seconds"),
        ({"delta_timestamps": {"a": [0.0]}, "fps": 0}, ArgumentError, r"fps \(0\)"),
        ({"delta_timestamps": {"a": [0.0]}, "tolerance_s": -1}, ArgumentError, "tolerance_s"),
    ],
)
def test_bad_timestamps_are_refused(kwargs, error, match):
    kwargs.setdefault("fps", 10)
    with pytest.raises(error, match=match):
        offsets_of_timestamps(**kwargs)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    offsets=st.lists(st.integers(-12, 12), min_size=1, max_size=10),
    data=st.data(),
)
def test_offset_rows_never_leave_the_episode_and_pad_exactly_outside(lengths, offsets, data):
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    episode = torch.tensor(
        data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=1, max_size=20))
    )
    first = torch.as_tensor(starts)[episode]
    length = torch.as_tensor(lengths)[episode]
    step = torch.tensor([data.draw(st.integers(0, int(n) - 1)) for n in length])
    index, pad = offset_rows(first + step, first, length, torch.tensor(offsets))
    inside = (index >= first[:, None]) & (index < (first + length)[:, None])
    assert inside.all()  # never another episode's row
    want = step[:, None] + torch.tensor(offsets)
    assert torch.equal(pad, (want < 0) | (want >= length[:, None]))
    assert torch.equal(
        index, first[:, None] + torch.minimum(want.clamp(min=0), length[:, None] - 1)
    )


def test_context_windows_are_offset_rows_of_a_consecutive_table():
    row, first, length = torch.tensor([3, 9, 10]), torch.tensor([0, 8, 8]), torch.tensor([5, 3, 3])
    index, mask = context_windows(row, first, length, before=2, after=3)
    want_index, pad = offset_rows(row, first, length, torch.arange(-2, 4))
    assert torch.equal(index, want_index) and torch.equal(mask, ~pad)
