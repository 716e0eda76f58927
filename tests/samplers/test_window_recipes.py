"""A window pickles as its recipe (store path, budget, seed, position), never its live slots.

torch's pickler (``DataLoader`` workers', ``torch.multiprocessing``'s) moves every tensor it
pickles into shared memory in place; a window pickled as it was would have moved its slots
and its stream's blocks from under their numpy views and let a child refill the parent's
slots. Pickled as its recipe, the copy opens its own store, slots and thread, and draws the
rows the original draws next.
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's tensor reductions
from torchrl.data import TensorDictReplayBuffer

from torchstore.data.store.store import TrajectoryStore
from torchstore.demo import write_demo_store
from torchstore.samplers.philox import PhiloxStream
from torchstore.window.block_window import BlockWindow
from torchstore.window.window_storage import WindowSampler, WindowStorage


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(tmp_path_factory.mktemp("recipes") / "demo.h5", episodes=12, steps=20)


def through_torch(obj):
    """``obj`` pickled by torch's pickler (what a worker receives) and loaded again."""
    return pickle.loads(ForkingPickler.dumps(obj))


@pytest.mark.parametrize("prioritized", [False, True])
def test_window_storage_and_sampler_continue_from_their_position(store_path, prioritized):
    storage = WindowStorage(store_path, resident=50, resident_blocks=3, prioritized=prioritized)
    sampler = WindowSampler(storage, seed=5)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=8)
    for _ in range(9):
        batch = rb.sample()
        if prioritized:
            rb.update_priority(batch["index"], batch["index"].double() % 3 + 1)
    their_storage, their_sampler = through_torch((storage, sampler))
    live = [sampler.philox._block_words, *storage.window.packed.blocks]
    assert not any(t.is_shared() for t in live)
    theirs = TensorDictReplayBuffer(storage=their_storage, sampler=their_sampler, batch_size=8)
    with TrajectoryStore(store_path) as store:
        rows = store.read_slab(0, store.num_rows)
    for _ in range(30):
        a, b = rb.sample(), theirs.sample()
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(b["obs"], rows["obs"][b["index"]])
        if prioritized:
            assert torch.equal(a["priority_weight"], b["priority_weight"])
    assert their_storage._owns_store  # opened from its path: closed with the storage
    their_storage.close()
    batch = rb.sample()  # the original reads on
    assert torch.equal(batch["obs"], rows["obs"][batch["index"]])
    storage.close()


def test_a_block_window_continues_from_its_position(store_path):
    with TrajectoryStore(store_path) as store:
        ep = store.episodes
        ids = torch.arange(len(ep.lengths))
        window = BlockWindow(
            store, None, segments=(ep.offsets, ep.lengths, ids), budget=60, resident_blocks=2,
            batch_size=8, seed=2,
        )  # fmt: skip
        mine = PhiloxStream(2, 0, "cpu")
        for _ in range(11):
            window.draw_plain(mine, 8)
        copy = through_torch(window)
        assert not any(t.is_shared() for t in window.packed.blocks)
        theirs = PhiloxStream(2, 0, "cpu")
        theirs.seek(int(mine.position))
        for _ in range(25):
            assert torch.equal(window.draw_plain(mine, 8)[1], copy.draw_plain(theirs, 8)[1])
        assert copy.store is not store and copy.state_dict() == window.state_dict()
        copy.close()
        window.close()


def test_a_windowed_store_copy_refills_memory_of_its_own(store_path):
    with TrajectoryStore(store_path) as store:
        window = store.window(50)
        window.refill(30)
        copy = through_torch(window)
        assert (copy.start, copy.stop) == (30, 80)
        copy.refill(150)
        rows = torch.arange(30, 80)
        assert torch.equal(window.gather(rows)["obs"], store.read_slab(30, 80)["obs"])
        assert torch.equal(copy.gather(torch.arange(150, 200))["obs"], store[150:200]["obs"])
        copy.store.close()
