"""The disk fills between the writer's room check and HDF5's own write.

Another process can take the last free space after the writer checked for room; then HDF5's
own write is refused. A file-size limit (``RLIMIT_FSIZE`` with SIGXFSZ ignored, so writes
past it fail with EFBIG) in a forked writer plays that disk, with the room check skipped.
The writer must raise a ``StorageFullError``, write nothing more to the file, close without
an error, and the store must reopen with every committed episode; with room back, the same
process resumes it.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal

import pytest

import torchstore.io.hdf5 as hdf5
from tests.data.test_crash_safety import COLUMNS, _check, episode_rows
from tests.forked import run_forked
from torchstore.data import TrajectoryStoreWriter
from torchstore.errors import StorageFullError


def _store(path: str, episodes: int) -> None:
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i in range(episodes):
            w.add_episode(episode_rows(i), metadata={"i": i})


def _fill_past_a_limit(path: str, extra: int, report: str) -> None:
    """In a forked child: resume, meet the limit inside HDF5's write, close, room back."""
    TrajectoryStoreWriter._check_room = lambda self, nbytes: None  # the space went meanwhile
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    out: dict = {}
    w = TrajectoryStoreWriter.resume(path)
    resource.setrlimit(
        resource.RLIMIT_FSIZE, (os.path.getsize(path) + extra, resource.RLIM_INFINITY)
    )
    try:
        for i in range(w.num_episodes, w.num_episodes + 10_000):
            rows = episode_rows(i)
            half = len(rows["reward"]) // 2  # a refusal may come in an append or a commit
            w.append({k: v[:half] for k, v in rows.items()})
            w.append({k: v[half:] for k, v in rows.items()})
            w.end_episode({"i": i})
    except StorageFullError as exc:
        out["error"] = [exc.errno, exc.filename, str(exc)]
    out["committed"] = w.num_episodes
    left = open(path, "rb").read()
    try:
        w.add_episode(episode_rows(0))
    except StorageFullError as exc:
        out["again"] = str(exc)
    w.close()  # must not raise, and must not write
    out["untouched"] = open(path, "rb").read() == left
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)  # room is back
    with TrajectoryStoreWriter.resume(path) as again:
        n = again.num_episodes
        again.add_episode(episode_rows(n), metadata={"i": n})
    out["after"] = n + 1
    with open(report, "w") as f:
        json.dump(out, f)


@pytest.mark.parametrize("extra", [0, 5_000, 150_000, 1_000_003])
def test_a_write_refused_inside_hdf5_loses_nothing_committed(tmp_path, extra):
    path, report = str(tmp_path / "s.h5"), str(tmp_path / "report.json")
    _store(path, 3)
    status, text = run_forked(_fill_past_a_limit, path, extra, report, timeout=120)
    assert status == "ok", f"{status}: {text}"
    out = json.load(open(report))
    code, filename, message = out["error"]
    committed = out["committed"]
    assert code == 27 and filename == path  # EFBIG, naming the store
    assert f"the {committed} committed episodes" in message and "are intact" in message
    assert "resume()" in message
    assert "stopped after a refused write" in out["again"]
    assert out["untouched"], "the writer wrote to the file after the disk refused a write"
    assert out["after"] == committed + 1
    _check(path, committed + 1)  # every committed episode, bit for bit, in a new process


def test_a_refused_write_leaves_a_store_that_readers_open_before_any_resume(tmp_path):
    path, report = str(tmp_path / "s.h5"), str(tmp_path / "report.json")
    _store(path, 2)

    def refuse_and_leave() -> None:
        TrajectoryStoreWriter._check_room = lambda self, nbytes: None
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        w = TrajectoryStoreWriter.resume(path)
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (os.path.getsize(path) + 70_000, resource.RLIM_INFINITY)
        )
        with pytest.raises(StorageFullError):
            for i in range(2, 10_000):
                w.add_episode(episode_rows(i), metadata={"i": i})
        with open(report, "w") as f:
            json.dump(w.num_episodes, f)
        w.close()

    status, text = run_forked(refuse_and_leave, timeout=120)
    assert status == "ok", f"{status}: {text}"
    committed = json.load(open(report))
    assert committed >= 2
    status, text = run_forked(_check, path, committed)  # no resume in between
    assert status == "ok", f"{status}: {text}"


def test_a_writer_stopped_by_a_full_disk_never_writes_over_the_next_writer(tmp_path):
    """After the refusal the failed writer's process lives on. Another process resumes the
    store once there is room and commits; when the first process then lets go of HDF5 (as
    it does at exit: every file still open is closed), nothing of its stale state may reach
    the file."""
    path = str(tmp_path / "s.h5")
    _store(path, 2)
    closed_r, closed_w = os.pipe()
    resumed_r, resumed_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer the disk stops; it exits only after the next one is done
        code = 1
        try:
            TrajectoryStoreWriter._check_room = lambda self, nbytes: None
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            w = TrajectoryStoreWriter.resume(path)
            limit = os.path.getsize(path) + 70_000
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            try:
                for i in range(2, 10_000):
                    w.add_episode(episode_rows(i), metadata={"i": i})
            except StorageFullError:
                pass
            w.close()
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            os.write(closed_w, json.dumps(w.num_episodes).encode())
            os.read(resumed_r, 1)
            del w
            gc.collect()
            hdf5._lib().H5close()  # what HDF5 does at a normal exit: close what is open
            code = 0
        finally:
            os._exit(code)
    committed = json.loads(os.read(closed_r, 100))

    def go_on() -> None:
        with TrajectoryStoreWriter.resume(path) as w:
            assert w.num_episodes == committed
            for i in range(committed, committed + 2):
                w.add_episode(episode_rows(i), metadata={"i": i})

    status, text = run_forked(go_on, timeout=120)
    os.write(resumed_w, b"x")
    _, wait = os.waitpid(pid, 0)
    assert status == "ok", f"{status}: {text}"
    assert os.WIFEXITED(wait) and os.WEXITSTATUS(wait) == 0, wait
    status, text = run_forked(_check, path, committed + 2)
    assert status == "ok", f"{status}: {text}"
