"""One writer per store, told apart from a dead one for certain, with real processes.

A live writer in another process holds the store's writer lock; every other way of
writing the file (a new writer, ``resume``, ``overwrite=True``, ``StoreReplay.dumps``,
the raw ``open_for_append``) is refused with a StoreLockedError naming the file and the
holder, and the live writer's commits, before and after, all read back exact. A writer
killed with SIGKILL holds nothing: its store resumes at once.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.forked import run_forked
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.replay.ring import REPLAY_FILE, StoreReplay
from torchstore.errors import (
    DestinationError,
    DestinationExistsError,
    StoreLockedError,
)
from torchstore.io.hdf5.files import open_for_append
from torchstore.io.hdf5.writer_lock import live_writer, lock_path

COLS = [ColumnSpec("x", torch.float32, (4,))]
EPISODES = 40


def _rows(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((50 + i, 4), i, np.float32)}


def _start_live_writer(path, *, resume: bool, episodes: int = EPISODES):
    """Fork a writer that commits ``episodes`` episodes (one every few ms), then waits for
    a byte on its go pipe before it closes; it writes "d" to ready_fd once all are
    committed. Returns (pid, go_fd, ready_fd)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(go_w)
            writer = (
                TrajectoryStoreWriter.resume(path) if resume else TrajectoryStoreWriter(path, COLS)
            )
            first = writer.num_episodes
            writer.add_episode(_rows(first))
            os.write(ready_w, b"o")
            for i in range(first + 1, first + episodes):
                writer.add_episode(_rows(i))
                time.sleep(0.002)
            os.write(ready_w, b"d")
            os.read(go_r, 1)
            writer.close()
            os._exit(0)
        finally:
            os._exit(1)
    os.close(ready_w)
    os.close(go_r)
    assert os.read(ready_r, 1) == b"o"
    return pid, go_w, ready_r


def _finish(pid: int, go_w: int, ready_r: int) -> None:
    os.write(go_w, b"g")
    _, status = os.waitpid(pid, 0)
    os.close(go_w)
    os.close(ready_r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the live writer failed ({status})"
    )


def _check_all(path, n: int) -> None:
    with TrajectoryStore(path) as store:
        assert store.num_episodes == n
        for i in range(n):
            assert np.array_equal(store.episode(i)["x"].numpy(), _rows(i)["x"])


def _store(path, episodes: int = 1):
    with TrajectoryStoreWriter(path, COLS) as w:
        for i in range(episodes):
            w.add_episode(_rows(i))
    return path


def test_every_second_writer_of_a_live_store_is_refused_and_nothing_is_lost(tmp_path):
    path = _store(tmp_path / "s.h5")
    pid, go, ready = _start_live_writer(path, resume=True)
    try:
        holder = live_writer(path)
        assert holder is not None and holder["pid"] == pid
        attempts = {
            "resume": lambda: TrajectoryStoreWriter.resume(path),
            "overwrite": lambda: TrajectoryStoreWriter(path, COLS, overwrite=True),
            "open_for_append": lambda: open_for_append(path),
        }
        for what, attempt in attempts.items():
            with pytest.raises(StoreLockedError, match=f"process {pid} on host") as info:
                attempt()
            assert str(path) in str(info.value), what
        with pytest.raises(DestinationExistsError, match="exists"):
            TrajectoryStoreWriter(path, COLS)
    finally:
        _finish(pid, go, ready)
    _check_all(path, 1 + EPISODES)
    assert live_writer(path) is None and not lock_path(path).exists()
    with TrajectoryStoreWriter.resume(path) as w:  # free again once its writer closed
        w.add_episode(_rows(1 + EPISODES))
    _check_all(path, 2 + EPISODES)


def test_a_sigkilled_writers_store_resumes_at_once(tmp_path):
    path = _store(tmp_path / "s.h5")
    pid, go, ready = _start_live_writer(path, resume=True, episodes=3)
    assert os.read(ready, 1) == b"d"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(go)
    os.close(ready)
    assert lock_path(path).exists() and live_writer(path) is None
    status, text = run_forked(_check_all, path, 4, timeout=120)
    assert status == "ok", text
    with TrajectoryStoreWriter.resume(path) as w:
        assert w.num_episodes == 4
        w.add_episode(_rows(4))
    _check_all(path, 5)


def test_dumps_onto_a_live_writers_store_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / REPLAY_FILE
    replay = StoreReplay(8)
    replay.set(torch.arange(3), TensorDict({"x": torch.ones(3, 4)}, batch_size=[3]))
    replay.dumps(folder)
    pid, go, ready = _start_live_writer(path, resume=True, episodes=5)
    try:
        with pytest.raises(StoreLockedError, match=f"process {pid}"):
            replay.dumps(folder)
    finally:
        _finish(pid, go, ready)
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 1 + 5  # the live writer's commits all kept


def test_overwrite_keeps_the_old_store_until_the_new_one_is_closed(tmp_path):
    path = _store(tmp_path / "s.h5", episodes=3)
    with TrajectoryStoreWriter(path, COLS, overwrite=True) as w:
        w.add_episode(_rows(7))
        with TrajectoryStore(path) as old:  # readers of the path still see the old store
            assert old.num_episodes == 3
    with TrajectoryStore(path) as new:
        assert new.num_episodes == 1
        assert np.array_equal(new.episode(0)["x"].numpy(), _rows(7)["x"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]


def test_an_overwrite_that_raises_leaves_the_old_store(tmp_path):
    path = _store(tmp_path / "s.h5", episodes=3)
    with pytest.raises(RuntimeError, match="import failed"):
        with TrajectoryStoreWriter(path, COLS, overwrite=True) as w:
            w.add_episode(_rows(7))
            raise RuntimeError("import failed half-way")
    _check_all(path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]
    w = TrajectoryStoreWriter(path, COLS, overwrite=True)
    w.abort()
    _check_all(path, 3)


def _overwrite_then_die(path) -> None:
    w = TrajectoryStoreWriter(path, COLS, overwrite=True)
    w.add_episode(_rows(9))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_overwrite_leaves_the_old_store_and_the_next_one_works(tmp_path):
    path = _store(tmp_path / "s.h5", episodes=3)
    status, _ = run_forked(_overwrite_then_die, path, timeout=120)
    assert status == "crashed"
    _check_all(path, 3)
    with TrajectoryStoreWriter(path, COLS, overwrite=True) as w:
        w.add_episode(_rows(0))
    _check_all(path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]


def test_overwrite_never_replaces_what_is_not_a_store(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    with pytest.raises(DestinationError, match="not a torchstore store"):
        TrajectoryStoreWriter(notes, COLS, overwrite=True)
    assert notes.read_text() == "keep me"
    with pytest.raises(DestinationError, match="is a directory"):
        TrajectoryStoreWriter(tmp_path, COLS, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_new_store_gets_missing_folders(tmp_path):
    path = tmp_path / "runs" / "a" / "s.h5"
    _store(path)
    _check_all(path, 1)


def test_recover_finishes_a_dead_writers_store_and_refuses_a_live_one(tmp_path):
    path = _store(tmp_path / "s.h5")
    pid, go, ready = _start_live_writer(path, resume=True, episodes=3)
    assert os.read(ready, 1) == b"d"
    with pytest.raises(StoreLockedError, match=f"process {pid}"):
        TrajectoryStoreWriter.recover(path)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(go)
    os.close(ready)
    assert open(path, "rb").read(12)[11] != 0  # still marked open by the dead writer
    rows = sum(len(_rows(i)["x"]) for i in range(4))
    assert TrajectoryStoreWriter.recover(path) == (4, rows)
    assert open(path, "rb").read(12)[11] == 0  # finished: marked closed
    assert not lock_path(path).exists()
    _check_all(path, 4)


def test_overwrite_while_this_process_reads_the_old_store(tmp_path):
    path = _store(tmp_path / "s.h5", episodes=3)
    with TrajectoryStore(path) as old:
        with TrajectoryStoreWriter(path, COLS, overwrite=True) as w:
            w.add_episode(_rows(7))
        assert old.num_episodes == 3  # an open reader keeps the file it opened
        assert np.array_equal(old.episode(2)["x"].numpy(), _rows(2)["x"])
    with TrajectoryStore(path) as new:
        assert new.num_episodes == 1


def test_a_new_store_clears_a_killed_overwrites_leftover(tmp_path):
    path = _store(tmp_path / "s.h5", episodes=3)
    assert run_forked(_overwrite_then_die, path, timeout=120)[0] == "crashed"
    assert (tmp_path / ".s.h5.partial").exists()
    path.unlink()
    _store(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]
    _check_all(path, 1)
