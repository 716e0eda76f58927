"""torchrl's replay buffer over a window of a store larger than memory (read-only)."""

from __future__ import annotations

import pytest
import torch
from torchrl.data import TensorDictReplayBuffer

from torchstore.data.store.store import TrajectoryStore
from torchstore.demo import write_demo_store
from torchstore.errors import ReadOnlyStorageError, RowIndexError
from torchstore.window.window_storage import WindowSampler, WindowStorage


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(tmp_path_factory.mktemp("wstorage") / "demo.h5", episodes=20, steps=25)


@pytest.fixture(scope="module")
def rows(store_path):
    with TrajectoryStore(store_path) as store:
        return store.read_slab(0, store.num_rows)


def buffer(store_path, **kw):
    storage = WindowStorage(store_path, resident=50, resident_blocks=4, **kw)  # B: the call's
    return TensorDictReplayBuffer(
        storage=storage, sampler=WindowSampler(storage, seed=1), batch_size=16
    ), storage


def test_replay_buffer_samples_every_row_through_a_tenth_of_the_store(store_path, rows):
    rb, storage = buffer(store_path)
    seen = set()
    for _ in range(400):
        batch = rb.sample()
        index = batch["index"]
        assert torch.equal(batch["obs"], rows["obs"][index])
        assert torch.equal(batch["next", "obs"], rows["next", "obs"][index])
        seen.update(index.tolist())
    assert seen == set(range(500))
    assert storage.window.packed.capacity <= 50 and len(storage) == 500
    storage.close()


def test_prioritized_weights_and_updates(store_path):
    rb, storage = buffer(store_path, prioritized=True, beta=0.5)
    batch = rb.sample()
    assert torch.equal(batch["priority_weight"], torch.ones(16))
    rb.update_priority(batch["index"], torch.full((16,), 4.0))
    hot = set(batch["index"].tolist())
    counts = 0
    for _ in range(50):
        b = rb.sample()
        w = b["priority_weight"]
        high = torch.tensor([r in hot for r in b["index"].tolist()])
        counts += int(high.sum())
        if high.any():
            assert torch.allclose(w[high], w[high].min())
            assert float(w[high][0]) < 1.0  # a high priority row weighs less
    assert counts > 0
    storage.close()


def test_state_resumes_the_draws(store_path):
    rb, storage = buffer(store_path, prioritized=True)
    for _ in range(7):
        rb.update_priority(rb.sample()["index"], 2.0)
    state = rb._sampler.state_dict()
    ahead = [rb.sample()["index"] for _ in range(20)]
    storage.close()
    rb2, storage2 = buffer(store_path, prioritized=True)
    rb2._sampler.load_state_dict(state)
    assert all(torch.equal(a, rb2.sample()["index"]) for a in ahead)
    storage2.close()


def test_writes_and_rows_away_are_refused(store_path):
    rb, storage = buffer(store_path)
    rb.sample()
    with pytest.raises(ReadOnlyStorageError, match="read-only window"):
        rb.extend(rows_like := storage.get(torch.tensor([storage.window.active_blocks[0][0]])))
    del rows_like
    resident = {r for a, b in storage.window.active_blocks for r in range(a, b)}
    away = next(r for r in range(500) if r not in resident)
    with pytest.raises(RowIndexError, match=f"row {away} is not resident"):
        rb[torch.tensor([away])]
    with pytest.raises(TypeError, match="WindowStorage"):
        WindowSampler(object())
    storage.close()
