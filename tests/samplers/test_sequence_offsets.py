"""SequenceWindowSampler(offsets=...): LeRobot's frame selection on the torchrl face.

An anchor row uniform over every row of the ring's episodes, the rows ``anchor + offsets``
clamped to its episode, and ``mask`` False exactly where an offset left it; over a wrapped
ring, with ERE, prioritized, and through torchrl's ReplayBuffer.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_fakes import EpisodeLazyStorage, FakeRing
from sampler_strategies import rings
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from torchstore.errors import ArgumentError, ArgumentTypeError
from torchstore.samplers import ERE, PrioritizedSampler, SequenceWindowSampler


def episode_rows(ring: FakeRing) -> dict[int, list[int]]:
    """Each surviving episode's rows, oldest first (ground truth from the fake ring)."""
    first = ring.cursor if ring.rows == ring.capacity else 0
    out: dict[int, list[int]] = {}
    for age in range(ring.rows):
        row = (first + age) % ring.capacity
        out.setdefault(ring.row_episode[row], []).append(row)
    return out


def check(ring: FakeRing, index: torch.Tensor, info: dict, offsets: list[int]) -> None:
    rows = episode_rows(ring)
    for w in range(index.shape[0]):
        episode = int(info["episode_id"][w])
        mine = rows[episode]
        anchor = int(info["start_step"][w])
        for k, offset in enumerate(offsets):
            step = anchor + offset
            inside = 0 <= step < len(mine)
            assert bool(info["mask"][w, k]) == inside
            assert int(index[w, k]) == mine[min(max(step, 0), len(mine) - 1)]


@settings(max_examples=80, deadline=None)
@given(
    ring=rings(),
    offsets=st.lists(st.integers(-8, 8), min_size=1, max_size=6),
    seed=st.integers(0, 100),
    prioritized=st.booleans(),
)
def test_offset_windows_never_cross_an_episode_and_mask_exactly_outside(
    ring, offsets, seed, prioritized
):
    kwargs = {"priority": PrioritizedSampler(ring.capacity)} if prioritized else {}
    sampler = SequenceWindowSampler(offsets=offsets, generator=seed, **kwargs)
    if prioritized:
        sampler.priority.update_priority(torch.arange(ring.capacity), 1.0)
    index, info = sampler.sample_windows(ring, 64)
    assert index.shape == (64, len(offsets))
    check(ring, index, info, offsets)


def test_every_row_is_an_anchor_uniformly():
    """Anchors are LeRobot's frames: every row of every episode, short episodes included."""
    ring = FakeRing(40)
    for n in (1, 3, 12, 20):
        ring.write(n)
    sampler = SequenceWindowSampler(offsets=[0], seed=3)
    index, info = sampler.sample_windows(ring, 40_000)
    counts = torch.bincount(index[:, 0], minlength=40).float()
    assert counts[36:].sum() == 0  # the ring holds 36 rows
    counts = counts[:36]
    assert (counts > 0).all() and counts.std() / counts.mean() < 0.1
    assert info["mask"].all()


def test_ere_keeps_anchors_and_rows_in_the_newest():
    ring = FakeRing(30)
    for n in (10, 10, 10, 8):
        ring.write(n)
    ere = ERE(c_min=12)
    ere.set_progress(1, 1)
    sampler = SequenceWindowSampler(offsets=[-20, 0, 20], generator=0, ere=ere)
    index, info = sampler.sample_windows(ring, 200)
    newest = ring.newest(12)
    assert set(index.reshape(-1).tolist()) <= newest


def test_through_torchrls_replay_buffer():
    storage = EpisodeLazyStorage(32)
    rb = TensorDictReplayBuffer(
        storage=storage, sampler=SequenceWindowSampler(offsets=[-2, 0, 3], generator=1)
    )
    episode = torch.tensor([0] * 5 + [1] * 9 + [2] * 4)
    step = torch.cat([torch.arange(5), torch.arange(9), torch.arange(4)])
    rb.extend(TensorDict({"episode": episode, "step": step}, batch_size=[18]))
    batch = rb.sample(8 * 3).reshape(8, 3)
    lengths = torch.tensor([5, 9, 4])[batch["episode"][:, 0]]
    anchor = batch["step"][:, 1]
    want = anchor[:, None] + torch.tensor([-2, 0, 3])
    assert (batch["episode"] == batch["episode"][:, :1]).all()
    assert torch.equal(batch["mask"], (want >= 0) & (want < lengths[:, None]))
    assert torch.equal(batch["step"], torch.minimum(want.clamp(min=0), lengths[:, None] - 1))


def test_state_dict_keeps_the_offsets():
    sampler = SequenceWindowSampler(offsets=[-1, 0, 5], num_windows=2)
    other = SequenceWindowSampler(3)
    other.load_state_dict(sampler.state_dict())
    assert other.offsets == (-1, 0, 5) and other.length == 3
    assert "offsets=[-1, 0, 5]" in repr(sampler)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ArgumentError, "needs length= .* or offsets="),
        ({"length": 2, "offsets": [0, 1, 2]}, ArgumentError, r"must be len\(offsets\) = 3"),
        ({"offsets": [0.5]}, ArgumentTypeError, "not a whole number of frames"),
        ({"offsets": []}, ArgumentError, "at least one offset"),
    ],
)
def test_bad_offsets_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        SequenceWindowSampler(**kwargs)
