"""The torchrl Storage contract on the read-only window face (WindowStorage + WindowSampler).

The part of the StoreReplay contract (``test_torchrl_storage_contract.py``) that a read-only
window over a store larger than memory can keep: built as torchrl storages are (no batch
size), driven by torchrl's own ``ReplayBuffer`` and ``TensorDictReplayBuffer`` as a user
types them, ``len``/``shape``, ``get`` of the rows it holds with the index types torchrl
passes, ``contains``, state dicts and checkpoints, and clear errors for what it cannot do
(writes, rows not resident, torchrl's whole-store samplers).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

from torchstore.data.store.store import TrajectoryStore
from torchstore.demo import write_demo_store
from torchstore.errors import ReadOnlyStorageError, RowIndexError, UnsupportedError
from torchstore.window.window_storage import WindowSampler, WindowStorage

logging.getLogger("torchrl").setLevel(logging.WARNING)

ROWS = 500  # 20 episodes of 25 steps
BLOCK = 10  # resident=50 rows over K + 1 = 5 slots
BUFFERS = {"ReplayBuffer": ReplayBuffer, "TensorDictReplayBuffer": TensorDictReplayBuffer}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("window_contract") / "demo.h5"
    return write_demo_store(path, episodes=20, steps=25)


@pytest.fixture(scope="module")
def rows(store_path):
    with TrajectoryStore(store_path) as store:
        return store.read_slab(0, store.num_rows)


@pytest.fixture
def window(store_path):
    """What a torchrl user types, with LazyTensorStorage(n) swapped for a window."""
    made = []

    def make(buffer="TensorDictReplayBuffer", batch_size=16, seed=1, sized=None, **kw):
        """``batch_size``: the buffer's; ``sized``: the storage's (the old way, optional)."""
        storage = WindowStorage(store_path, resident=50, resident_blocks=4, batch_size=sized, **kw)
        made.append(storage)
        rb = BUFFERS[buffer](
            storage=storage, sampler=WindowSampler(storage, seed=seed), batch_size=batch_size
        )
        return rb, storage

    yield make
    for storage in made:
        storage.close()


def resident_rows(storage) -> list[int]:
    return [r for lo, hi in storage.window.active_blocks for r in range(lo, hi)]


# --------------------------------------------------------------------- what a user types
@pytest.mark.parametrize("buffer", list(BUFFERS))
def test_torchrl_buffers_sample_with_the_batch_size_of_the_call(window, rows, buffer):
    rb, storage = window(buffer)
    assert storage.batch_size is None  # nothing asked for one before the first sample
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == torch.Size([16]) and storage.batch_size == 16
    assert torch.equal(batch["obs"], rows["obs"][info["index"]])
    assert torch.equal(batch["next", "obs"], rows["next", "obs"][info["index"]])
    if buffer == "TensorDictReplayBuffer":
        assert torch.equal(batch["index"], info["index"])


def test_rb_sample_of_any_size_works_and_the_size_may_change(window, rows):
    rb, storage = window(batch_size=None)
    for size in (8, 8, 3, 64, 1, 8):
        batch = rb.sample(size)
        assert batch.batch_size == torch.Size([size]) and storage.batch_size == size
        assert torch.equal(batch["obs"], rows["obs"][batch["index"]])
    assert storage.window.schedule.batch_size == 8


def test_batch_size_at_construction_still_works_and_draws_the_same_rows(window):
    rb, storage = window()
    legacy, legacy_storage = window(sized=16)
    assert legacy_storage.batch_size == 16
    for _ in range(30):
        assert torch.equal(rb.sample()["index"], legacy.sample()["index"])
    assert storage.window.schedule.state_dict() == legacy_storage.window.schedule.state_dict()


def test_another_batch_size_keeps_the_rows_drawn_per_phase(window):
    """A phase draws reuse * (K blocks of 10 rows) / K = 10 rows whatever the batch sizes:
    after D rows drawn the schedule has moved D / 10 phases (counted in calls instead, the
    mix below would move about 5 times too slowly)."""
    rb, storage = window(batch_size=None)
    sizes = [3, 16, 40, 7] * 60
    drawn = 0
    for size in sizes:
        rb.sample(size)
        drawn += size
        expected = drawn / BLOCK
        assert abs(storage.window.schedule.phase - expected) <= 40 / BLOCK + 1


def test_a_batch_larger_than_the_window_still_samples(window, rows):
    rb, _ = window(batch_size=None)
    batch = rb.sample(200)  # four times the resident rows: phases carry it over
    assert batch.batch_size == torch.Size([200])
    assert torch.equal(batch["obs"], rows["obs"][batch["index"]])


# --------------------------------------------------------------------- reads
def test_len_and_shape_are_the_stores(window):
    rb, storage = window()
    assert len(storage) == len(rb) == ROWS
    assert storage.shape == torch.Size([ROWS])
    assert storage._is_full and storage.ndim == 1


def test_get_of_resident_rows_takes_the_index_types_torchrl_passes(window, rows):
    rb, storage = window()
    rb.sample()
    lo, hi = storage.window.active_blocks[0]

    def obs(index):
        return rows["obs"][index].tolist()

    picks = [hi - 1, lo, lo + 2]
    assert storage.get(torch.tensor(picks))["obs"].tolist() == obs(picks)
    assert storage.get((torch.tensor(picks),))["obs"].tolist() == obs(picks)
    assert storage.get(np.array(picks))["obs"].tolist() == obs(picks)
    assert storage.get(picks)["obs"].tolist() == obs(picks)
    assert storage.get(slice(lo, hi, 3))["obs"].tolist() == obs(list(range(lo, hi, 3)))
    assert storage.get(range(lo, lo + 2))["obs"].tolist() == obs([lo, lo + 1])
    assert storage.get(lo).batch_size == torch.Size([])
    assert storage.get(lo)["obs"].tolist() == obs(lo)
    assert storage.get(torch.tensor(lo)).batch_size == torch.Size([])
    assert storage.get(lo - ROWS)["obs"].tolist() == obs(lo)  # negative: from the end
    mask = torch.zeros(ROWS, dtype=torch.bool)
    mask[[lo, hi - 1]] = True
    assert storage.get(mask)["obs"].tolist() == obs([lo, hi - 1])
    assert rb[torch.tensor(picks)]["obs"].tolist() == obs(picks)  # via numpy, as rb passes
    assert storage[lo : lo + 1]["obs"].tolist() == obs([lo])


def test_rows_out_of_range_or_not_resident_raise_index_errors_naming_them(window):
    rb, storage = window()
    rb.sample()
    lo = storage.window.active_blocks[0][0]
    away = next(r for r in range(ROWS) if r not in set(resident_rows(storage)))
    for index in (ROWS, torch.tensor([lo, ROWS]), -ROWS - 1):
        with pytest.raises(RowIndexError, match=f"out of range: the store holds {ROWS} rows"):
            storage.get(index)
    with pytest.raises(IndexError, match=rf"row {away} is not resident.*WindowSampler"):
        storage.get(torch.tensor([lo, away]))
    with pytest.raises(IndexError, match="not resident"):
        storage[:]  # the whole store is not resident
    with pytest.raises(RowIndexError, match="integers"):
        storage.get(torch.tensor([1.0]))
    with pytest.raises(UnsupportedError, match="store row number"):
        storage.get("obs")


def test_contains_is_what_get_can_read(window):
    rb, storage = window()
    assert 0 not in storage  # nothing resident before the first sample
    rb.sample()
    lo, hi = storage.window.active_blocks[0]
    away = next(r for r in range(ROWS) if r not in set(resident_rows(storage)))
    assert lo in storage and (hi - 1) in storage and away not in storage
    assert storage.contains(torch.tensor([lo, away, ROWS])).tolist() == [True, False, False]


# --------------------------------------------------------------------- read-only
def test_writes_are_refused_naming_the_writable_alternative(window):
    rb, storage = window()
    batch = rb.sample()
    torchrl = LazyTensorStorage(4)
    ReplayBuffer(storage=torchrl).extend(torch.arange(4))
    torchrl_state = torchrl.state_dict()
    writes = {
        "extend": lambda: rb.extend(batch),
        "add": lambda: rb.add(batch[0]),
        "setitem": lambda: rb.__setitem__(torch.tensor([0]), batch[:1]),
        "set": lambda: storage.set(0, batch[0]),
        "empty": rb.empty,
        "load rows": lambda: storage.load_state_dict(torchrl_state),
    }
    for name, write in writes.items():
        with pytest.raises(ReadOnlyStorageError, match="read-only window.*StoreReplay.from_store"):
            write()
        assert len(storage) == ROWS, name


def test_torchrl_samplers_over_the_whole_store_are_refused_naming_the_remedy(store_path):
    storage = WindowStorage(store_path, resident=50)
    try:
        rb = ReplayBuffer(storage=storage, batch_size=4)  # the default RandomSampler
        with pytest.raises(UnsupportedError, match=r"sampler=WindowSampler\(storage\)"):
            rb.sample()
        with pytest.raises(TypeError, match="WindowStorage"):
            WindowSampler(LazyTensorStorage(4))
    finally:
        storage.close()


def test_bad_batch_sizes_are_refused(store_path, window):
    from torchstore.errors import ArgumentError

    with pytest.raises(ArgumentError, match="batch_size"):
        WindowStorage(store_path, resident=50, batch_size=0)
    rb, _ = window(batch_size=None)
    with pytest.raises(ArgumentError, match="batch_size"):
        rb._sampler.sample(rb.storage, 0)


# --------------------------------------------------------------------- state and checkpoints
def test_storage_state_dict_and_dumps_hold_nothing_and_load_back(window, tmp_path):
    _, storage = window()
    state = storage.state_dict()
    assert state == {}
    _, fresh = window()
    fresh.load_state_dict(state)
    storage.dumps(tmp_path / "storage")
    fresh.loads(tmp_path / "storage")
    assert len(fresh) == ROWS


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_buffer_checkpoint_resumes_the_same_batches(window, tmp_path, prioritized, how):
    rb, _ = window(batch_size=None, prioritized=prioritized)
    for size in (16, 16, 5):  # the checkpoint's unit is the last size: 5
        batch = rb.sample(size)
        if prioritized:
            rb.update_priority(batch["index"], torch.full((size,), 3.0))
    if how == "dumps":
        rb.dumps(tmp_path / "ckpt")
    else:
        state = rb.state_dict()
    ahead = [rb.sample(size) for size in (16, 16, 9, 16) * 5]
    resumed, storage = window(batch_size=None, prioritized=prioritized)
    if how == "dumps":
        resumed.loads(tmp_path / "ckpt")
    else:
        resumed.load_state_dict(state)
    assert storage.batch_size == 5
    for want in ahead:
        got = resumed.sample(want.shape[0])
        assert torch.equal(got["index"], want["index"])
        if prioritized:
            assert torch.equal(got["priority_weight"], want["priority_weight"])


def test_a_sampler_state_from_before_batch_sizes_were_saved_still_resumes(window):
    rb, _ = window(sized=16)
    for _ in range(5):
        rb.sample()
    state = rb._sampler.state_dict()
    del state["batch_size"]  # what an older checkpoint holds
    ahead = [rb.sample()["index"] for _ in range(20)]
    for sized in (16, None):  # sized as the checkpoint was, or by the first call
        resumed, _ = window(sized=sized)
        resumed._sampler.load_state_dict(state)
        assert all(torch.equal(a, resumed.sample(16)["index"]) for a in ahead)


def test_td_rows_come_back_as_a_tensordict_of_the_store_columns(window, rows):
    rb, _ = window("ReplayBuffer")
    batch = rb.sample()
    assert isinstance(batch, TensorDict)
    assert set(batch.keys(True, True)) >= {"obs", "action", ("next", "obs")}
