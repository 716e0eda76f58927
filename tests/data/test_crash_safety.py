"""A writer killed with SIGKILL at random moments leaves every committed episode exact.

Each trial forks a real writer process that appends episodes as fast as it can and
reports each commit through a pipe; the test SIGKILLs it after a random delay, then
checks the file in another forked process (so a hang or a crash would fail the test,
not block it): the visible episodes are the reported ones (or one more, if the kill
landed between the commit and its report), bit-exact, and nothing of the uncommitted
one. Every few trials the crashed file is resumed, appended to, and checked again.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import time

import numpy as np
import pytest
import torch

from tests.forked import run_forked
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter

COLUMNS = (
    ColumnSpec("obs", torch.float32, (26,)),
    ColumnSpec("action", torch.float32, (7,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
)
TRIALS = int(os.environ.get("TORCHSTORE_CRASH_TRIALS", "40"))


def episode_rows(i: int) -> dict[str, np.ndarray]:
    n = 300 + (i * 7919) % 3700
    rng = np.random.default_rng(i)
    done = np.zeros(n, dtype=bool)
    done[-1] = True
    return {
        "obs": rng.standard_normal((n, 26), dtype=np.float32),
        "action": rng.standard_normal((n, 7), dtype=np.float32),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "done": done,
    }


def _writer(path: str, report_fd: int, first: int) -> None:
    if first == 0:
        writer = TrajectoryStoreWriter(path, COLUMNS, env_id="crash-test")
    else:
        writer = TrajectoryStoreWriter.resume(path)
    i = first
    while True:
        rows = episode_rows(i)
        half = len(rows["reward"]) // 2  # two appends per episode: a kill can land between them
        writer.append({k: v[:half] for k, v in rows.items()})
        writer.append({k: v[half:] for k, v in rows.items()})
        writer.end_episode(metadata={"i": i})
        os.write(report_fd, struct.pack("<i", i + 1))
        i += 1


def _kill_writer(path: str, first: int, delay: float) -> int:
    """Fork a writer, SIGKILL it after ``delay`` s; returns the commits it reported."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _writer(path, write_end, first)
        finally:
            os._exit(1)
    os.close(write_end)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as r:
        data = r.read()
    reports = [v for (v,) in struct.iter_unpack("<i", data[: len(data) // 4 * 4])]
    return reports[-1] if reports else first


def _check(path: str, reported: int) -> None:
    if not os.path.exists(path):
        assert reported == 0, "the file vanished after commits were reported"
        return
    with TrajectoryStore(path) as store:
        n = store.num_episodes
        assert n in (reported, reported + 1), f"{n} episodes visible, {reported} reported"
        for i in range(n):
            expected = episode_rows(i)
            got = store.episode(i)
            assert store.episode_metadata(i) == {"i": i}
            for name, value in expected.items():
                assert np.array_equal(got[name].numpy(), value), f"episode {i} column {name} differs"
        assert store.num_rows == sum(len(episode_rows(i)["reward"]) for i in range(n))


def _resume_and_extend(path: str, have: int) -> None:
    with TrajectoryStoreWriter.resume(path) as w:
        assert w.num_episodes == have
        w.add_episode(episode_rows(have), metadata={"i": have})
        w.add_episode(episode_rows(have + 1), metadata={"i": have + 1})


def _episodes_in(path: str) -> int:
    with TrajectoryStore(path) as store:
        return store.num_episodes


@pytest.mark.slow
def test_sigkilled_writer_keeps_every_committed_episode(tmp_path):
    rng = random.Random(1234)
    outcomes = []
    for trial in range(TRIALS):
        path = str(tmp_path / f"crash{trial}.h5")
        # a few kills land during creation, most while episodes stream in
        delay = rng.uniform(0.0, 0.02) if trial % 8 == 0 else rng.uniform(0.05, 0.6)
        reported = _kill_writer(path, 0, delay)
        status, text = run_forked(_check, path, reported)
        assert status == "ok", f"trial {trial} (delay {delay:.3f}s, {reported} reported): {status}\n{text}"
        outcomes.append(reported)
        if os.path.exists(path) and trial % 3 == 0:
            # resume after the crash, get killed again, resume again, and verify everything
            visible = _episodes_in(path)
            reported = _kill_writer(path, visible, rng.uniform(0.05, 0.3))
            status, text = run_forked(_check, path, reported)
            assert status == "ok", f"trial {trial} after a resumed writer was killed: {status}\n{text}"
            have = _episodes_in(path)
            status, text = run_forked(_resume_and_extend, path, have)
            assert status == "ok", f"trial {trial} resume: {status}\n{text}"
            status, text = run_forked(_check, path, have + 2)
            assert status == "ok", f"trial {trial} after resume: {status}\n{text}"
    assert sum(1 for r in outcomes if r > 0) > TRIALS // 2  # most kills landed mid-stream
