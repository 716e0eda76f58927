"""A reader opened while a writer appends sees every committed episode, exactly, as it lands."""

from __future__ import annotations

import os
import time

import numpy as np

from tests.data.test_crash_safety import COLUMNS, episode_rows
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter

EPISODES = 25


def test_reader_follows_a_live_writer(tmp_path):
    path = tmp_path / "live.h5"
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        w.add_episode(episode_rows(0), metadata={"i": 0})
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            with TrajectoryStoreWriter.resume(path) as w:
                os.write(ready_w, b"1")  # SWMR: live readers open after the writer
                for i in range(1, EPISODES):
                    rows = episode_rows(i)
                    w.append({k: v[:100] for k, v in rows.items()})
                    time.sleep(0.01)  # a reader may look while an episode is half written
                    w.append({k: v[100:] for k, v in rows.items()})
                    w.end_episode(metadata={"i": i})
            status = 0
        finally:
            os._exit(status)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1", "the writer failed to open the store"
    seen = 0
    refreshes = 0
    deadline = time.monotonic() + 20
    with TrajectoryStore(path) as store:
        while seen < EPISODES and time.monotonic() < deadline:
            refreshes += store.refresh()
            for i in range(seen, store.num_episodes):
                got = store.episode(i)
                for name, value in episode_rows(i).items():
                    assert np.array_equal(got[name].numpy(), value), f"episode {i} column {name}"
                assert store.episode_metadata(i) == {"i": i}
            seen = store.num_episodes
            time.sleep(0.003)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert seen == EPISODES
    assert refreshes > 3  # the reader really watched episodes arrive one by one
