"""The disk fills between the writer's room check and HDF5's own write.

Another process can take the last free space after the writer checked for room; then HDF5's
own write is refused. A file-size limit (``RLIMIT_FSIZE`` with SIGXFSZ ignored, so writes
past it fail with EFBIG) in a forked writer plays that disk, with the room check skipped.
The writer must raise a ``StorageFullError``, write nothing more to the file, close without
an error, and the store must reopen with every committed episode; with room back, the same
process resumes it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.test_crash_safety import COLUMNS, _check, episode_rows
from tests.forked import run_forked
from torchstore.data import TrajectoryStoreWriter
from torchstore.errors import StorageFullError

ROOT = Path(__file__).resolve().parents[2]


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


# The writer the disk stops, in an interpreter of its own: it exits the way a program does
# (HDF5 closes every file still open at exit), and only after the next writer is done. A
# fresh interpreter, not a fork of the test worker: a fork would also close at exit whatever
# HDF5 objects earlier tests in that worker left open.
STOPPED_WRITER = """
import json, os, resource, signal, sys
from tests.data.test_crash_safety import episode_rows
from torchstore.data import TrajectoryStoreWriter
from torchstore.errors import StorageFullError

path, closed_w, resumed_r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
TrajectoryStoreWriter._check_room = lambda self, nbytes: None  # the space went meanwhile
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
"""


def test_a_writer_stopped_by_a_full_disk_never_writes_over_the_next_writer(tmp_path):
    """After the refusal the failed writer's process lives on. Another process resumes the
    store once there is room and commits; when the first process then exits (HDF5 closes
    every file still open), nothing of its stale state may reach the file."""
    path = str(tmp_path / "s.h5")
    _store(path, 2)
    closed_r, closed_w = os.pipe()
    resumed_r, resumed_w = os.pipe()
    stopped = subprocess.Popen(
        [sys.executable, "-c", STOPPED_WRITER, path, str(closed_w), str(resumed_r)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        pass_fds=(closed_w, resumed_r),
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(closed_w)
    os.close(resumed_r)
    try:
        said = os.read(closed_r, 100)
        assert said, f"the stopped writer exited early: {stopped.communicate(timeout=60)[1]}"
        committed = json.loads(said)

        def go_on() -> None:
            with TrajectoryStoreWriter.resume(path) as w:
                assert w.num_episodes == committed
                for i in range(committed, committed + 2):
                    w.add_episode(episode_rows(i), metadata={"i": i})

        status, text = run_forked(go_on, timeout=120)
        os.write(resumed_w, b"x")
        _, err = stopped.communicate(timeout=120)
    finally:
        if stopped.poll() is None:
            stopped.kill()
            stopped.wait()
        os.close(closed_r)
        os.close(resumed_w)
    assert status == "ok", f"{status}: {text}"
    assert stopped.returncode == 0, err
    status, text = run_forked(_check, path, committed + 2)
    assert status == "ok", f"{status}: {text}"
