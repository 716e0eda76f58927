"""A real recorder process killed with SIGKILL loses at most the episode in progress."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from torchstore.data import TrajectoryStore
from torchstore.lerobot import LeRobotSource, LeRobotWriter, import_lerobot

REPO = Path(__file__).resolve().parents[2]

# Deterministic episode content, shared by the recorder (exec'd) and the checks.
ROWS_SOURCE = textwrap.dedent(
    """
    import numpy as np

    FEATURES = {
        "state": {"dtype": "float32", "shape": [4], "names": None},
        "wrist": {"dtype": "image", "shape": [6, 8, 3], "names": ["height", "width", "channels"]},
        "front": {"dtype": "video", "shape": [32, 48, 3], "names": ["height", "width", "channels"]},
    }

    def rows(e):
        rng = np.random.default_rng(1000 + e)
        n = int(rng.integers(4, 12))
        front = np.zeros((n, 32, 48, 3), np.uint8)
        front[..., 0] = np.linspace(0, 255, 48, dtype=np.uint8)[None, None]
        front[..., 1] = (17 * e) % 256
        for k in range(n):
            front[k, 8:16, (4 * k) % 40 : (4 * k) % 40 + 8] = 220
        return {
            "state": rng.standard_normal((n, 4)).astype(np.float32),
            "wrist": rng.integers(0, 256, (n, 6, 8, 3), dtype=np.uint8),
            "front": front,
        }
    """
)
_namespace: dict = {}
exec(ROWS_SOURCE, _namespace)
FEATURES, rows = _namespace["FEATURES"], _namespace["rows"]

RECORDER = ROWS_SOURCE + textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from torchstore.lerobot import LeRobotWriter

    root = Path(sys.argv[1])
    caps = dict(chunks_size=3, data_files_size_in_mb=0.004, video_files_size_in_mb=0.006)
    if root.exists():
        w = LeRobotWriter.resume(root)
    else:
        w = LeRobotWriter(root, fps=10, features=FEATURES, **caps)
    e = w.num_episodes
    while True:
        episode = rows(e)
        for k in range(len(episode["state"])):
            w.add_frame({name: value[k] for name, value in episode.items()}, task=f"task {e % 3}")
        print("saving", e, flush=True)
        w.save_episode()
        print("saved", e, flush=True)
        e += 1
    """
)


def record_until_killed(root: Path, saves: int, delay: float, *, during_save: bool) -> int:
    """Run a recorder and kill it ``delay`` s after its ``saves``-th save returned, or after
    the next save started (``during_save``); returns the saves it reported complete."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SVT_LOG": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORDER, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    reported = 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"recorder died after {reported} saves")
            reported += line.startswith("saved")
            if reported == saves and (not during_save or line.startswith("saving")):
                break
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    reported += sum(line.startswith("saved") for line in proc.stdout)
    return reported


def test_sigkill_loses_at_most_the_episode_in_progress(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "ds"
    confirmed = 0
    for trial in range(6):
        # even trials die inside save_episode (the commit window), odd ones between frames
        during_save = trial % 2 == 0
        delay = rng.uniform(0.0, 0.04 if during_save else 0.1)
        confirmed += record_until_killed(root, rng.randint(1, 2), delay, during_save=during_save)
        with LeRobotWriter.resume(root) as w:  # trims what the killed save left behind
            assert confirmed <= w.num_episodes <= confirmed + 1, trial
            confirmed = w.num_episodes
        with LeRobotSource(root) as src:  # a complete dataset again
            assert len(src.episodes) == confirmed
    info = json.loads((root / "meta/info.json").read_text())
    assert info["total_episodes"] == confirmed
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        assert store.num_episodes == confirmed
        tasks = store.manifest.metadata["lerobot"]["tasks"]
        for e in range(confirmed):
            want = rows(e)
            got = store.episode(e)
            np.testing.assert_array_equal(got["state"].numpy(), want["state"])
            np.testing.assert_array_equal(got["wrist"].numpy(), want["wrist"])
            err = np.abs(got["front"].numpy().astype(int) - want["front"]).mean()
            assert err < 3.0, (e, err)
            assert {tasks[i] for i in got["task_index"].tolist()} == {f"task {e % 3}"}
    assert len(list((root / "data").rglob("*.parquet"))) > 1  # roll-over happened across kills


def test_a_killed_recorder_leaves_a_loadable_folder_between_saves(tmp_path):
    """Killed while adding frames (not saving): the folder loads without any repair."""
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=10, features=FEATURES) as w:
        for e in range(2):
            w.add_episode(rows(e), task="t")
        episode = rows(2)
        w.add_frame({name: value[0] for name, value in episode.items()}, task="t")
        # a kill here: nothing of episode 2 is in the dataset files
        with LeRobotSource(root) as src:
            assert len(src.episodes) == 2
            assert src.num_frames == sum(len(rows(e)["state"]) for e in range(2))
