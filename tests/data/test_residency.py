from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import WALKER_COLUMNS, make_rows
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter


@pytest.fixture(scope="module")
def walker_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("res") / "w.h5"
    episodes = [make_rows(WALKER_COLUMNS, n, i) for i, n in enumerate([400, 1000, 250, 600])]
    with TrajectoryStoreWriter(path, WALKER_COLUMNS) as w:
        for rows in episodes:
            w.add_episode(rows)
    flat = {k: np.concatenate([e[k] for e in episodes]) for k in episodes[0]}
    return path, flat


def test_resident_gather_matches_the_written_rows(walker_store):
    path, flat = walker_store
    with TrajectoryStore(path) as store:
        view = store.resident()
        raw = store.resident(columns=["pixels", "reward"])
    assert len(view) == 2250 and view.episodes.lengths.tolist() == [400, 1000, 250, 600]
    index = torch.randint(0, 2250, (512,), generator=torch.Generator().manual_seed(0))
    batch = view.gather(index)
    assert batch.batch_size == (512,)
    for name in ("qpos", "qvel", "action", "reward", "done", "next/qpos"):
        key = tuple(name.split("/")) if "/" in name else name
        assert np.array_equal(batch[key].numpy(), flat[name][index.numpy()]), name
    q = WALKER_COLUMNS[-1].quantize
    assert batch["pixels"].dtype == torch.float32
    assert (
        batch["pixels"] - torch.from_numpy(flat["pixels"][index.numpy()])
    ).abs().max() <= q.step / 2 + 1e-6
    codes = view.gather(index, raw=True)["pixels"]
    assert codes.dtype == torch.uint8 and torch.equal(q.decode(codes), batch["pixels"])
    assert set(raw.gather(index).keys()) == {"pixels", "reward"}
    start, length, ids = view.episode_segments()
    assert start.tolist() == [0, 400, 1400, 1650] and length.tolist() == [400, 1000, 250, 600]
    assert ids.tolist() == [0, 1, 2, 3]


def test_window_refills_with_contiguous_reads(walker_store):
    path, flat = walker_store
    with TrajectoryStore(path) as store:
        win = store.window(500, columns=["qpos", "done"])
        assert (win.start, win.stop) == (0, 500)
        win.refill(1900)
        assert (win.start, win.stop, len(win)) == (1900, 2250, 350)
        index = torch.arange(1900, 2250, 7)
        assert np.array_equal(win.gather(index)["qpos"].numpy(), flat["qpos"][index.numpy()])
        with pytest.raises(IndexError, match=r"rows must lie in the window \[1900, 2250\)"):
            win.gather(torch.tensor([10]))
        with pytest.raises(IndexError, match="window start"):
            win.refill(5000)
        with pytest.raises(ValueError, match=r"rows \(0\) must be an int >= 1"):
            store.window(0)


def test_resident_view_is_a_read_only_torchrl_storage(walker_store, tmp_path):
    from tensordict import TensorDict
    from torchrl.data import ReplayBuffer, TensorDictReplayBuffer

    from torchstore.errors import ReadOnlyStorageError
    from torchstore.samplers import PrioritizedSampler, SequenceWindowSampler, UniformSampler

    path, flat = walker_store
    with TrajectoryStore(path) as store:
        view = store.resident(columns=["qpos", "reward", "done"])
    rb = TensorDictReplayBuffer(storage=view, sampler=UniformSampler(generator=0), batch_size=128)
    batch, info = rb.sample(return_info=True)
    assert np.array_equal(batch["qpos"].numpy(), flat["qpos"][info["index"].numpy()])
    prio = TensorDictReplayBuffer(
        storage=view, sampler=PrioritizedSampler(len(view)), batch_size=64
    )
    sample, info = prio.sample(return_info=True)
    assert "priority_weight" in sample.keys()
    prio.update_priority(info["index"], torch.rand(64))
    windows = ReplayBuffer(storage=view, sampler=SequenceWindowSampler(50), batch_size=200)
    w, info = windows.sample(return_info=True)
    index = info["index"].reshape(4, 50)
    assert torch.equal(w["reward"].reshape(4, 50), torch.from_numpy(flat["reward"])[index])
    assert bool((index[:, 1:] - index[:, :-1] == 1).all())  # consecutive rows
    assert len(list(zip(range(3), rb))) == 3  # iterating the buffer works
    rows = TensorDict(
        {
            "qpos": torch.zeros(2, 9),
            "reward": torch.zeros(2),
            "done": torch.zeros(2, dtype=torch.bool),
        },
        [2],
    )
    with pytest.raises(
        ReadOnlyStorageError, match="read-only view of .*w.h5.*StoreReplay.from_store"
    ):
        rb.extend(rows)
    with pytest.raises(ReadOnlyStorageError, match="cannot empty it"):
        rb.empty()
    rb.dumps(tmp_path / "ckpt")  # a checkpoint of the view is an ordinary store file
    with TrajectoryStore(tmp_path / "ckpt" / "storage" / "replay.h5") as copy:
        assert copy.num_rows == len(view) and copy.num_episodes == 4


def test_gather_out_of_range_names_the_index_and_the_row_count(walker_store):
    from torchstore.errors import RowIndexError

    path, flat = walker_store
    n = len(flat["qpos"])
    with TrajectoryStore(path) as store:
        view = store.resident(columns=["qpos"])
    for bad in ([0, n], [-1, 3]):
        named = bad[0] if bad[0] < 0 else n
        with pytest.raises(
            RowIndexError, match=rf"gather index {named} is out of range .* it holds {n} rows"
        ):
            view.gather(torch.tensor(bad))
    with pytest.raises(IndexError):  # the builtin a user catches
        view.gather(torch.tensor([n + 100]))
    # int32 or list indices are taken as rows too
    assert np.array_equal(
        view.gather(torch.tensor([3, 1], dtype=torch.int32))["qpos"].numpy(), flat["qpos"][[3, 1]]
    )
    assert view.gather(torch.tensor([], dtype=torch.int64))["qpos"].shape == (0, 9)


def test_resident_storage_is_a_face_over_the_resident_store(walker_store):
    """The torchrl storage shares the resident store's blocks; the store itself is torchrl-free."""
    from torchstore import ResidentStorage, ResidentStore, StoreReplay

    path, flat = walker_store
    with TrajectoryStore(path) as store:
        view = store.resident(columns=["qpos", "done"])
        plain = ResidentStore.load(store, columns=["qpos", "done"])
    assert isinstance(view, ResidentStorage) and isinstance(view, StoreReplay)
    assert isinstance(view.resident, ResidentStore) and not isinstance(plain, StoreReplay)
    assert view.packed is view.resident.packed  # rows held once, not copied
    assert view.episodes is view.resident.episodes and view.source == path
    index = torch.tensor([0, 399, 400, 2249])
    assert torch.equal(plain.gather(index)["qpos"], view.gather(index)["qpos"])
    assert np.array_equal(plain.gather(index)["qpos"].numpy(), flat["qpos"][index.numpy()])
    for got, want in zip(plain.episode_segments(), view.episode_segments(), strict=True):
        assert torch.equal(got, want)
    assert (len(plain), plain.num_rows, plain.columns) == (2250, 2250, view.columns)
    assert "ResidentStore(" in repr(plain) and "rows=2250, episodes=4" in repr(view)


def test_ring_state_round_trips_into_a_ring_over_the_same_rows(walker_store):
    from torchstore import StoreReplay
    from torchstore.errors import UnsupportedError

    path, _ = walker_store
    ring = StoreReplay.from_store(path, 1000, columns=["qpos", "done"])
    state = ring.ring_state()
    assert (state["rows"], state["cursor"], state["open"]) == (1000, 0, False)
    assert state["episode_ids"] == [1, 2, 3]  # the newest 1000 rows: part of 1, then 2 and 3
    copy = StoreReplay(1000, device="cpu")
    copy.adopt_columns(ring.packed)  # the same blocks, no copy
    copy.restore_ring(ring.episode_segments()[1], state)
    assert copy.packed is ring.packed and len(copy) == 1000
    for got, want in zip(copy.episode_segments(), ring.episode_segments(), strict=True):
        assert torch.equal(got, want)
    assert int(copy.fill_level) == 1000 and copy.next_episode_id == ring.next_episode_id
    with pytest.raises(ValueError, match="packed columns of 1000 rows cannot become"):
        StoreReplay(999).adopt_columns(ring.packed)
    with pytest.raises(UnsupportedError, match="ndim=2"):
        StoreReplay(8, ndim=2).ring_state()
