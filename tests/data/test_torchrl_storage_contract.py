"""The torchrl Storage contract, run on torchrl's LazyTensorStorage and on StoreReplay.

Every test does the same operations on each implementation and checks what torchrl's
buffers and samplers observe: length, gathered rows, overwrite order when the ring wraps,
``_last_cursor_index``, ``_mutation_revision`` and checkpoints.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)

from torchstore.data.replay.ring import StoreReplay

logging.getLogger("torchrl").setLevel(logging.WARNING)

CAPACITY = 10

STORAGES = {
    "LazyTensorStorage": lambda capacity=CAPACITY: LazyTensorStorage(capacity),
    "StoreReplay": lambda capacity=CAPACITY: StoreReplay(capacity),
}


@pytest.fixture(params=list(STORAGES))
def make_storage(request):
    return STORAGES[request.param]


def rows(n: int, start: int = 0) -> TensorDict:
    """Nested torchrl layout; values encode the global step so overwrite order is visible."""
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "observation": step.float().unsqueeze(-1).expand(n, 3).clone(),
            "action": (step % 3).to(torch.int64),
            "next": {
                "observation": (step + 1).float().unsqueeze(-1).expand(n, 3).clone(),
                "reward": step.float().unsqueeze(-1),
                "done": (step % 4 == 3).unsqueeze(-1),
            },
        },
        batch_size=[n],
    )


def steps(td: TensorDict) -> list[int]:
    return td["observation"][..., 0].long().reshape(-1).tolist()


def test_len_and_get_before_wrap(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(6))
    assert len(storage) == len(rb) == 6
    assert not storage._is_full
    assert steps(storage[:]) == list(range(6))
    assert steps(storage.get(torch.tensor([5, 0, 2]))) == [5, 0, 2]
    assert steps(storage.get((torch.tensor([1, 3]),))) == [1, 3]
    assert steps(storage.get(np.array([4, 4]))) == [4, 4]
    assert steps(storage.get([0, 1])) == [0, 1]
    assert steps(storage.get(-1)) == [5]
    assert steps(storage.get(torch.tensor([-1]))) == [5]
    assert steps(storage.get(slice(1, 5, 2))) == [1, 3]
    assert storage.get(2).batch_size == torch.Size([])
    assert storage.get(torch.tensor([1, 2])).batch_size == torch.Size([2])
    assert storage.shape == torch.Size([6])


def test_wrap_around_overwrites_oldest_rows_in_order(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(7))
    rb.extend(rows(7, start=7))
    assert len(storage) == CAPACITY and storage._is_full
    assert steps(storage[:]) == [10, 11, 12, 13, 4, 5, 6, 7, 8, 9]
    assert storage._last_cursor_index == 3
    rb.add(rows(1, start=14)[0])
    assert steps(storage[:])[4] == 14
    assert storage._last_cursor_index == 4
    assert storage.shape == torch.Size([CAPACITY])


def test_extend_longer_than_capacity_keeps_the_last_rows(make_storage):
    storage = make_storage(5)
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.arange(7))
    assert storage[:].tolist() == [5, 6, 2, 3, 4]
    assert storage._last_cursor_index == 1 and len(rb) == 5


def test_last_cursor_index_follows_adds(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    assert storage._last_cursor_index is None
    for i in range(12):
        rb.add(rows(1, start=i)[0])
        assert storage._last_cursor_index == i % CAPACITY
    assert len(storage) == CAPACITY


def test_mutation_revision_bumps_on_every_change(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    revisions = [storage._mutation_revision]
    rb.extend(rows(4))
    revisions.append(storage._mutation_revision)
    rb.add(rows(1, start=4)[0])
    revisions.append(storage._mutation_revision)
    patch = rows(1, start=40)
    patch["index"] = torch.tensor([0])
    rb[torch.tensor([0])] = patch
    revisions.append(storage._mutation_revision)
    state = storage.state_dict()
    storage.load_state_dict(state)
    revisions.append(storage._mutation_revision)
    rb.empty()
    revisions.append(storage._mutation_revision)
    assert all(b > a for a, b in zip(revisions[:-1], revisions[1:], strict=True)), revisions
    assert len(storage) == 0


def test_setitem_rewrites_in_place_without_moving_the_cursor(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(5))
    patch = rows(2, start=100)
    patch["index"] = torch.tensor([1, 3])
    rb[torch.tensor([1, 3])] = patch
    assert steps(storage[:]) == [0, 100, 2, 101, 4]
    assert len(storage) == 5 and storage._last_cursor_index == 4
    rb.extend(rows(1, start=5))
    assert steps(storage[:]) == [0, 100, 2, 101, 4, 5]


def test_get_out_of_range_raises_index_error(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(6))
    with pytest.raises(IndexError):
        storage.get(6)
    with pytest.raises(IndexError):
        storage.get(torch.tensor([1, 6]))


def test_state_dict_round_trip(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(13))
    state = storage.state_dict()
    assert state["_len"] == CAPACITY and state["initialized"]
    fresh = make_storage()
    fresh.load_state_dict(state)
    assert len(fresh) == CAPACITY
    assert (fresh[:] == storage[:]).all()


def test_dumps_loads_round_trip(make_storage, tmp_path):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(13))
    storage.dumps(tmp_path / "storage")
    fresh = make_storage()
    before = fresh._mutation_revision
    fresh.loads(tmp_path / "storage")
    assert fresh._mutation_revision > before
    assert len(fresh) == CAPACITY
    assert (fresh[:] == storage[:]).all()


def test_random_indices_lie_in_the_valid_prefix(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(4))
    storage._rng = torch.Generator().manual_seed(0)
    index = storage._rand_given_ndim(256)
    assert index.dtype == torch.int64 and int(index.min()) >= 0 and int(index.max()) < 4


def test_contains(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(rows(4))
    assert 3 in storage and 4 not in storage
    assert storage.contains(torch.tensor([0, 3, 7])).tolist() == [True, True, False]


def test_plain_tensor_rows(make_storage):
    storage = make_storage(4)
    rb = ReplayBuffer(storage=storage, batch_size=3)
    rb.extend(torch.arange(6.0).reshape(3, 2))
    rb.add(torch.tensor([10.0, 11.0]))
    assert storage[:].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [10.0, 11.0]]
    assert rb.sample().shape == torch.Size([3, 2])


def test_flat_layout_sampling_returns_the_same_rows(make_storage):
    storage = make_storage()
    rb = TensorDictReplayBuffer(
        storage=storage, batch_size=6, generator=torch.Generator().manual_seed(3)
    )
    n = 12
    rb.extend(
        TensorDict(
            {
                "obs": torch.arange(n).float().unsqueeze(-1),
                "next_obs": torch.arange(1, n + 1).float().unsqueeze(-1),
                "reward": torch.ones(n),
                "done": torch.arange(n) % 5 == 4,
            },
            batch_size=[n],
        )
    )
    sample = rb.sample()
    assert sample["obs"].shape == torch.Size([6, 1])
    assert torch.equal(sample["obs"].reshape(-1), storage.get(sample["index"])["obs"].reshape(-1))
    assert torch.equal(sample["next_obs"], sample["obs"] + 1)


@pytest.mark.parametrize(
    "make_sampler",
    [
        pytest.param(lambda: None, id="RandomSampler"),
        pytest.param(SamplerWithoutReplacement, id="WithoutReplacement"),
        pytest.param(
            lambda: SliceSampler(num_slices=2, end_key=("next", "done")), id="SliceSampler"
        ),
    ],
)
def test_same_generator_gives_the_same_samples_from_both(make_sampler):
    """The strongest contract: torchrl cannot tell the two storages apart when sampling."""
    samples = {}
    for name, make in STORAGES.items():
        sampler = make_sampler()
        kwargs = {} if sampler is None else {"sampler": sampler}
        rb = TensorDictReplayBuffer(
            storage=make(), batch_size=4, generator=torch.Generator().manual_seed(7), **kwargs
        )
        rb.extend(rows(7))
        rb.extend(rows(9, start=7))  # wraps
        samples[name] = torch.cat([rb.sample() for _ in range(5)])
    ours, theirs = samples["StoreReplay"], samples["LazyTensorStorage"]
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    assert (ours == theirs).all()
