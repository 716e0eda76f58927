"""A replay buffer shared with a spawned process, on LazyTensorStorage and on StoreReplay.

torchrl's ``ReplayBuffer(shared=True)`` pickles its storage into a ``spawn`` child: the child
extends the buffer and the parent sees the rows, the length and the writer's cursor. Both
storages run the same case and must show the same results; StoreReplay's parent also
rebuilds its episode index from the rows the child wrote.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import UnsupportedError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _shared_writer  # noqa: E402

logging.getLogger("torchrl").setLevel(logging.WARNING)


def seen(rb) -> tuple:
    rows = rb.storage[:]
    return (
        len(rb),
        rb._writer._cursor,
        rows["obs"][:, 0].tolist(),
        rows["done"].reshape(-1).tolist(),
        tuple(rb.sample()["obs"].shape),
    )


@pytest.mark.slow  # one spawned interpreter importing torch and torchrl: several seconds
def test_a_spawned_writer_fills_the_parents_ring():
    storage = StoreReplay(10)
    buffers = [
        TensorDictReplayBuffer(storage=s, shared=True, batch_size=4)
        for s in (LazyTensorStorage(10), storage)
    ]
    _shared_writer.extend(buffers, 0, 6)  # initialised in the parent
    child = mp.get_context("spawn").Process(target=_shared_writer.extend, args=(buffers, 6, 8))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert int(storage.fill_level) == 10  # what samplers read, before any len()
    torchrl, ours = (seen(rb) for rb in buffers)
    assert ours == torchrl
    assert ours[:2] == (10, 4)
    # the parent's episode index follows the child's rows (oldest first from the cursor)
    start, length, _ = storage.episode_segments()
    assert (start.tolist(), length.tolist()) == ([4, 8, 2], [4, 4, 2])
    assert storage.cursor == 4


@pytest.mark.slow  # one spawned interpreter importing torch and torchrl: several seconds
def test_concurrent_writers_of_a_shared_ring_lose_no_write():
    """The parent and a spawned child write one row at a time into one shared ring at the
    same time (each its own rows): every write counts in the length, every row holds what
    was written, and the episode index is the one the end flags give."""
    n = 400
    storage = StoreReplay(1 + 2 * n)
    storage.set(torch.tensor([0]), _shared_writer.rows(0, 1))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    child = ctx.Process(target=_shared_writer.set_rows, args=(storage, barrier, 1 + n, n))
    child.start()
    _shared_writer.set_rows(storage, barrier, 1, n)
    child.join(120)
    assert child.exitcode == 0
    assert len(storage) == int(storage.fill_level) == 1 + 2 * n
    assert storage.get(torch.arange(1 + 2 * n))["obs"][:, 0].tolist() == list(range(1 + 2 * n))
    # the ring's cursor follows the last write, whichever process made it; the episode index
    # is what the end flags give read oldest first from that cursor (done every 4th row)
    cursor = storage.cursor
    assert cursor in (1 + n, 0)  # after the parent's last row (n) or the child's (2n)
    order = [*range(cursor, 1 + 2 * n), *range(cursor)]
    expected, run = [], 0
    for row in order:
        run += 1
        if row % 4 == 3:
            expected.append(run)
            run = 0
    expected += [run] if run else []
    _, length, _ = storage.episode_segments()
    assert length.tolist() == expected


def test_sharing_an_empty_ring_is_refused():
    storage = StoreReplay(10)
    rb = TensorDictReplayBuffer(storage=storage, shared=True)
    child = mp.get_context("spawn").Process(target=_shared_writer.extend, args=([rb], 0, 2))
    with pytest.raises(UnsupportedError, match="before sharing"):
        child.start()
    assert torch.equal(storage.fill_level, torch.tensor(0))
