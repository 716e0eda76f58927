"""Readers following a writer that commits thousands of tiny episodes report no false alarm
(every block they verify is checked against a commit that held still), and still report
real corruption."""

from __future__ import annotations

import os
import select
import time

import numpy as np
import torch

from tests.forked import exit_code_by
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError, TorchstoreError

COLUMNS = [ColumnSpec("q", torch.float32, (4,)), ColumnSpec("done", torch.bool)]
EPISODES = 3000
READERS = 3
FOLLOW_S = 600.0  # a loaded machine's worst case; a hang fails after it, never blocks


def _episode(i: int) -> dict[str, np.ndarray]:
    n = 1 + i % 3
    return {"q": np.full((n, 4), i, np.float32), "done": np.arange(n) == n - 1}


def _writer(path, start: int, stop: int, ready_w: int, pause_at: int, go_r: int) -> None:
    """Resume the store, say so on ``ready_w``, commit episodes ``start..stop``; before
    episode ``pause_at`` say so again and wait for a byte on ``go_r`` (the file stays open:
    the writer is live), so a loaded machine cannot let it finish before the test looks."""
    status = 1
    try:
        with TrajectoryStoreWriter.resume(path) as w:
            os.write(ready_w, b"1")
            for i in range(start, stop):
                if i == pause_at:
                    os.write(ready_w, b"2")
                    assert os.read(go_r, 1) == b"g"
                w.add_episode(_episode(i), metadata={"i": i})
        status = 0
    finally:
        os._exit(status)


def _reader(path, result_w: int, ready_w: int) -> None:
    """Follow the writer; report (false alarms, wrong values, refreshes, error) through the
    pipe. A reader that cannot open the store, or sees no end within ``FOLLOW_S``, reports
    why instead of waiting forever."""
    alarms = wrong = refreshes = 0
    error = ""
    following = False
    try:
        with TrajectoryStore(path) as store:
            os.write(ready_w, b"r")  # open and about to follow: the writer may start
            following = True
            deadline = time.monotonic() + FOLLOW_S
            while True:
                done = store.num_episodes >= EPISODES
                try:
                    refreshes += store.refresh()
                    n, e = store.num_rows, store.num_episodes
                    q = store.read_slab(max(0, n - 3000), n)["q"][:, 0].numpy()
                    ends = store.episodes.offsets[-1].item() + store.episodes.lengths[-1].item()
                    last = store.episode(e - 1)["q"][:, 0].numpy()
                    wrong += int(ends != n or not (last == e - 1).all() or (np.diff(q) < 0).any())
                    wrong += store.episode_metadata(e - 1) != {"i": e - 1}
                except IntegrityError as exc:
                    alarms += 1
                    error = f"false alarm: {exc}"
                if done:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"saw {store.num_episodes} of {EPISODES} episodes in {FOLLOW_S:.0f} s"
                    )
    except BaseException as exc:  # anything else is a failure of the test
        error = f"reader failed: {exc!r}"
        if not following:
            os.write(ready_w, b"x")  # the test must not wait for this reader
    os.write(result_w, f"{alarms} {wrong} {refreshes} {error}\n".encode())
    os._exit(1 if error and not alarms else 0)


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    """Up to ``n`` bytes from ``fd``: fewer if it closes or ``deadline`` passes first."""
    got = b""
    while len(got) < n:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        part = os.read(fd, n - len(got))
        if not part:
            break
        got += part
    return got


def _results(result_r: int) -> list[tuple[int, int, int, str]]:
    with os.fdopen(result_r) as r:
        lines = r.read().splitlines()
    out = []
    for line in lines:
        a, w, n, *error = line.split(" ", 3)
        out.append((int(a), int(w), int(n), error[0] if error else ""))
    return out


def _fork(fn, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        finally:
            os._exit(1)
    return pid


def test_readers_following_thousands_of_tiny_commits_raise_no_false_alarm(tmp_path):
    path = tmp_path / "live.h5"
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        w.add_episode(_episode(0), metadata={"i": 0})
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    writer = _fork(_writer, path, 1, EPISODES, ready_w, 1, go_r)
    result_r, result_w = os.pipe()
    follow_r, follow_w = os.pipe()
    readers: list[int] = []
    codes: dict[int, int] = {}
    deadline = time.monotonic() + FOLLOW_S
    try:
        resumed = _read_exactly(ready_r, 2, deadline)
        assert resumed == b"12", f"the writer did not resume and wait ({resumed!r})"
        readers = [_fork(_reader, path, result_w, follow_w) for _ in range(READERS)]
        following = _read_exactly(follow_r, READERS, deadline)
        if following != b"r" * READERS:  # a reader failed to open: say why, never block
            codes.update((pid, exit_code_by(pid, time.monotonic() + 10)) for pid in readers)
            os.close(result_w)
            raise AssertionError(f"readers did not follow: {_results(result_r)}")
        os.write(go_w, b"g")
        codes[writer] = exit_code_by(writer, deadline)
        assert codes[writer] == 0, f"the writer exited with {codes[writer]}"
        codes.update((pid, exit_code_by(pid, deadline)) for pid in readers)
    finally:  # whatever failed, no child outlives the test
        for pid in {writer, *readers} - codes.keys():
            exit_code_by(pid, time.monotonic())
    os.close(result_w)
    results = _results(result_r)
    assert [codes[pid] for pid in readers] == [0] * READERS, results
    assert len(results) == READERS, results
    assert [a for a, _, _, _ in results] == [0] * READERS, results  # no false alarm
    assert [w for _, w, _, _ in results] == [0] * READERS, results  # no wrong value
    assert all(refreshes > 20 for _, _, refreshes, _ in results), results  # they followed
    with TrajectoryStore(path) as store:
        assert store.num_episodes == EPISODES


def test_a_live_reader_still_reports_real_corruption(tmp_path):
    path = tmp_path / "live.h5"
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        w.add_episode({"q": np.zeros((20000, 4), np.float32), "done": np.zeros(20000, bool)})
    with TrajectoryStore(path) as store:
        assert (
            store._ds.columns["q"].block_rows < 20000
        )  # block 0 is full: the writer never rewrites it
        offset = store._ds.columns["q"].data.id.get_chunk_info(0).byte_offset
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    writer = _fork(_writer, path, 2000, 3500, ready_w, 2100, go_r)
    code = None
    try:
        try:
            head = _read_exactly(ready_r, 2, time.monotonic() + FOLLOW_S)
            assert head == b"12", f"the writer did not reach episode 2100 ({head!r})"
            with open(path, "r+b") as f:  # damage a full, committed block of the live file
                f.seek(offset + 40)
                b = f.read(1)[0]
                f.seek(offset + 40)
                f.write(bytes([b ^ 0x01]))
            store = TrajectoryStore(path)
            assert store.num_episodes == 101  # opened while the writer holds the file
        finally:
            os.write(go_w, b"g")  # the writer commits the rest while the store is read
        with store:
            try:
                store.read_slab(0, 100)
            except IntegrityError as exc:
                assert "column 'q' rows 0.." in str(exc) and "fail their checksum" in str(exc)
            else:
                raise AssertionError("a flipped byte in committed rows was returned as data")
        code = exit_code_by(writer, time.monotonic() + FOLLOW_S)
    finally:
        if code is None:  # the test failed first: the writer must not outlive it
            exit_code_by(writer, time.monotonic())
    assert code == 0
    try:
        TrajectoryStore(path).read_slab(0, 10)
    except TorchstoreError:
        pass
    else:
        raise AssertionError("the damage went unnoticed after the writer closed")
