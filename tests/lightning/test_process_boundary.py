"""A windowed DataModule across a process boundary: it travels as its recipe, never shares.

``DataLoader`` workers (spawned: the DataModule pickled; forked: copied) draw the batches the
original would have drawn next, from a window, a file and threads of their own, and the
original's batches stay exactly those of an undisturbed run with the same seed. A process
forked at any stage of the window (before its first batch, with a block read in flight,
after several refills; raw and camera columns) gets correct batches within a deadline.
"""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest
import torch
from boundary_workers import NextBatches
from torch.utils.data import DataLoader

from tests.forked import run_forked
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.demo import write_demo_store
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule

H, W = 16, 16


def _frames(episode: int, n: int) -> np.ndarray:
    y, x = np.mgrid[0:H, 0:W]
    t = np.arange(n)[:, None, None]
    base = (x[None] * 6 + y[None] * 3 + t * 4 + episode * 17) % 256
    return np.stack([base, (base + 85) % 256, (255 - base)], axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A demo store and all its rows."""
    path = write_demo_store(tmp_path_factory.mktemp("boundary") / "demo.h5", episodes=10, steps=20)
    with TrajectoryStore(path) as store:
        return path, store.read_slab(0, store.num_rows)


@pytest.fixture(scope="module")
def camera(tmp_path_factory):
    """A store whose camera column is kept as AV1 packets, and all its rows decoded."""
    path = tmp_path_factory.mktemp("boundary") / "cam.h5"
    columns = [
        ColumnSpec("obs", torch.float32, (3,)),
        ColumnSpec("cam", torch.uint8, (H, W, 3), codec="av1"),
        ColumnSpec("action", torch.float32, (1,)),
    ]
    with TrajectoryStoreWriter(path, columns) as w:
        for e in range(8):
            steps = np.arange(20, dtype=np.float32) + 100 * e
            w.add_episode(
                {"obs": np.stack([steps] * 3, 1), "cam": _frames(e, 20), "action": steps[:, None]}
            )
    with TrajectoryStore(path) as store:
        return path, store.read_slab(0, store.num_rows)


def windowed(path, **kw) -> OfflineDataModule:
    """A DataModule over a window of 2 blocks of 15 rows (a refill every batch or two)."""
    return OfflineDataModule(
        path,
        batch_size=16,
        resident=45,
        resident_blocks=2,
        device="cpu",
        steps_per_epoch=200,
        output="dict",
        seed=3,
        **kw,
    )


def draws(dm, n: int) -> list[torch.Tensor]:
    """The store rows of ``dm``'s first ``n`` batches (then closes it)."""
    batches = iter(dm.train_dataloader())
    out = [next(batches)["index"].clone() for _ in range(n)]
    dm.close()
    return out


def holds(batch, index: torch.Tensor, rows) -> bool:
    """Whether ``batch`` holds exactly store rows ``index``: the rows and every column."""
    return torch.equal(batch["index"], index) and all(
        torch.equal(batch[name], rows[name][index]) for name in ("obs", "action", "cam")
        if name in batch
    )  # fmt: skip


# ------------------------------------------------------------------ DataLoader workers
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers_leave_the_parents_batches_alone(raw, context):
    """Spawned, the DataModule was pickled by torch's pickler, which moves tensors into shared
    memory in place: the parent's stream and slots moved under their numpy views, and
    afterwards up to 90 of its 100 batches held other rows than a run with the same seed
    (a row of -6e18 on a busy machine). Forked, the workers waited for ever on their copy
    of the refill thread."""
    path, rows = raw
    expected = draws(windowed(path), 100)
    dm = windowed(path)
    parent = iter(dm.train_dataloader())
    drawn = [next(parent) for _ in range(10)]
    loader = DataLoader(
        NextBatches(dm, 6),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
        timeout=120,
    )
    from_workers = list(loader)
    # nothing of the parent's went into shared memory (where its stream's and slots' numpy
    # views would no longer see it, and a worker could write)
    live = [dm.philox._block_words, dm.split.train, *dm.window.packed.blocks]
    assert not any(t.is_shared() for t in live)
    drawn += [next(parent) for _ in range(90)]
    wrong = [i for i, batch in enumerate(drawn) if not holds(batch, expected[i], rows)]
    assert wrong == [], f"{len(wrong)} of {len(drawn)} batches wrong"
    # each worker draws what the parent drew next from where it was when the workers began
    assert len(from_workers) == 12
    for j, batch in enumerate(from_workers):
        assert holds(batch, expected[10 + j // 2], rows), j
    dm.close()


# ------------------------------------------------------------------ fork at every stage
def _hold_refills(window) -> tuple[threading.Event, threading.Event]:
    """Make the refill thread's next read wait, in this process only, until ``release`` is
    set; ``entered`` is set once it waits (a block read is then in flight)."""
    parent, read = os.getpid(), window._read
    entered, release = threading.Event(), threading.Event()

    def held(*args, **kw):
        refill = threading.current_thread().name.startswith("torchstore-refill")
        if refill and os.getpid() == parent and not entered.is_set():
            entered.set()
            release.wait(120)
        return read(*args, **kw)

    window._read = held
    return entered, release


def _draw_in_child(batches, expected: list[torch.Tensor], rows) -> None:
    torch.set_num_threads(1)  # as in a DataLoader worker: torch's OpenMP threads are not here
    for i, index in enumerate(expected):
        batch = next(batches)
        assert holds(batch, index, rows), f"the child's batch {i} holds other rows"


@pytest.mark.parametrize("columns", ["raw", "camera"])
@pytest.mark.parametrize("stage", ["before the first batch", "mid-refill", "after refills"])
def test_a_forked_child_draws_the_batches_the_parent_draws_next(columns, stage, request):
    """Before the fix a child forked with a block read in flight, or after the refill
    thread had run, waited for ever on its copy of the thread pool (which has no thread)."""
    path, rows = request.getfixturevalue(columns)
    longer = {"resident_reuse": 4}  # phases of about 7 batches: a read stays in flight
    expected = draws(windowed(path, **longer), 50)
    dm = windowed(path, **longer)
    dm.setup("fit")
    parent = iter(dm.train_dataloader())
    release = threading.Event()
    drawn = []
    if stage == "mid-refill":
        entered, release = _hold_refills(dm.window)
        drawn.append(next(parent))  # the window starts and sends the next block's read off
        assert entered.wait(60) and not dm.window._pending.done()
    elif stage == "after refills":
        drawn += [next(parent) for _ in range(24)]
        assert dm.window.stats["refills"] >= dm.window.k + 2
    at = len(drawn)
    status, text = run_forked(_draw_in_child, parent, expected[at : at + 20], rows, timeout=120)
    release.set()
    drawn += [next(parent) for _ in range(50 - at)]
    assert (status, text) == ("ok", "")
    assert all(holds(b, expected[i], rows) for i, b in enumerate(drawn))
    dm.close()


def test_a_child_forked_while_a_read_held_the_readers_lock_reads_its_own(camera):
    """A refill thread holds the reader's lock while it reads a block's packets and plain
    columns (between its takes of the store's lock, which a fork waits for): forked then,
    the child's first read waited for ever on its copy of that lock."""
    path, rows = camera
    expected = draws(windowed(path), 30)
    dm = windowed(path)
    dm.setup("fit")
    parent = iter(dm.train_dataloader())
    drawn = [next(parent) for _ in range(5)]
    with dm.window._reader._reading:  # as a refill thread between two locked reads
        status, text = run_forked(_draw_in_child, parent, expected[5:25], rows, timeout=60)
    assert (status, text) == ("ok", "")
    drawn += [next(parent) for _ in range(25)]
    assert all(holds(b, expected[i], rows) for i, b in enumerate(drawn))
    dm.close()


# ------------------------------------------------------------------ the recipe
@pytest.mark.parametrize("module", ["offline", "demonstration"])
def test_a_pickled_datamodule_continues_from_its_position(raw, module):
    """Prioritized and windowed: stream, window schedule and priorities travel; the copy
    opens its own window and draws the batches the original draws next."""
    path, _ = raw
    if module == "offline":
        dm = windowed(path, sampler="prioritized")
    else:
        dm = DemonstrationDataModule(
            path, batch_size=16, obs_keys=["obs"], action_keys=["action"], action_horizon=3,
            resident=60, resident_blocks=2, device="cpu", output="dict", stats_cache=False,
            sampler="prioritized", steps_per_epoch=100,
        )  # fmt: skip
    batches = iter(dm.train_dataloader())
    for _ in range(7):
        index = next(batches)["index"]
        dm.update_priority(index, (index % 5 + 1).double())
    copy = pickle.loads(pickle.dumps(dm))
    assert copy.window is None and not copy._ready  # nothing live travelled
    theirs = iter(copy.train_dataloader())
    for _ in range(20):
        a, b = next(batches), next(theirs)
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["priority_weight"], b["priority_weight"])
    assert copy.window.packed.blocks[0].data_ptr() != dm.window.packed.blocks[0].data_ptr()
    dm.close()
    copy.close()


def test_a_copy_in_a_worker_draws_as_the_rank_that_pickled_it(raw):
    """Rank 1 of 2's copy, with no trainer or process group where it lands, reads rank 1's
    blocks from rank 1's position (a trainer or a process group there would say its rank)."""
    path, _ = raw

    class Rank1:
        global_rank, world_size = 1, 2

    dm = windowed(path)
    dm.trainer = Rank1()
    batches = iter(dm.train_dataloader())
    for _ in range(5):
        next(batches)
    copy = pickle.loads(pickle.dumps(dm))
    theirs = iter(copy.train_dataloader())
    assert (copy.rank, copy.world_size) == (1, 2)
    for _ in range(10):
        assert torch.equal(next(batches)["index"], next(theirs)["index"])
    dm.close()
    copy.close()
