"""A recording that saved nothing resumes as an empty dataset; close() leaves no lock files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from torchstore.errors import DestinationExistsError
from torchstore.lerobot import LeRobotSource, LeRobotWriter, import_lerobot

REPO = Path(__file__).resolve().parents[2]

FEATURES = {
    "state": {"dtype": "float32", "shape": [3], "names": None},
    "wrist": {"dtype": "image", "shape": [6, 8, 3], "names": ["height", "width", "channels"]},
    "front": {"dtype": "video", "shape": [32, 48, 3], "names": ["height", "width", "channels"]},
}


def rows(e: int, n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(e)
    return {
        "state": rng.standard_normal((n, 3)).astype(np.float32),
        "wrist": rng.integers(0, 256, (n, 6, 8, 3), dtype=np.uint8),
        "front": np.full((n, 32, 48, 3), 40 * e % 256, np.uint8),
    }


# A recorder that adds frames of its first episode and never saves it.
UNSAVED = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from torchstore.lerobot import LeRobotWriter

    features = {features!r}
    w = LeRobotWriter(sys.argv[1], fps=10, features=features)
    for k in range(4):
        w.add_frame({{
            "state": np.zeros(3, np.float32),
            "wrist": np.zeros((6, 8, 3), np.uint8),
            "front": np.zeros((32, 48, 3), np.uint8),
        }}, task="t")
    print("frames added", flush=True)
    time.sleep(60)
    """
).format(features=FEATURES)


def kill_before_first_save(root: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SVT_LOG": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", UNSAVED, str(root)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and not line:
            line = proc.stdout.readline()
            if proc.poll() is not None and not line:
                raise AssertionError("the recorder died before adding frames")
        assert line.startswith("frames added"), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def lock_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".torchstore-*.lock"))


def test_recorder_killed_before_its_first_save_resumes_empty(tmp_path):
    root = tmp_path / "ds"
    kill_before_first_save(root)
    with pytest.raises(DestinationExistsError, match=r"no saved episode.*LeRobotWriter\.resume"):
        LeRobotWriter(root, fps=10, features=FEATURES)
    with LeRobotSource(root) as src:  # an empty dataset, not a broken one
        assert src.episodes == [] and src.num_frames == 0
    with LeRobotWriter.resume(root) as w:
        assert w.num_episodes == 0 and w.pending_frames == 0
        for e in range(2):
            assert w.add_episode(rows(e), task="reach") == e
    assert lock_files(root) == []
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    with LeRobotSource(root) as src:
        assert [e.length for e in src.episodes] == [6, 6]
        got = src.read_episode(src.episodes[1], ["state", "wrist"])
        np.testing.assert_array_equal(got["state"], rows(1)["state"])
        np.testing.assert_array_equal(got["wrist"], rows(1)["wrist"])


def test_created_then_closed_resumes_empty(tmp_path):
    root = tmp_path / "ds"
    LeRobotWriter(root, fps=10, features=FEATURES).close()
    assert lock_files(root) == [] and not (root / "images").exists()
    with pytest.raises(DestinationExistsError, match="no saved episode"):
        LeRobotWriter(root, fps=10, features=FEATURES)
    with LeRobotWriter.resume(root) as w:
        assert w.num_episodes == 0
        w.add_episode(rows(0), task="reach")
    with LeRobotSource(root) as src:
        assert len(src.episodes) == 1


def test_a_new_writer_on_a_recorded_folder_names_resume(tmp_path):
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=10, features=FEATURES) as w:
        w.add_episode(rows(0), task="reach")
    with pytest.raises(DestinationExistsError, match=r"\(1 episodes\).*LeRobotWriter\.resume"):
        LeRobotWriter(root, fps=10, features=FEATURES)
    with pytest.raises(FileExistsError):  # the builtin a caller already catches
        LeRobotWriter(root, fps=10, features=FEATURES)


def test_close_removes_lock_files_and_a_new_writer_can_lock(tmp_path):
    root = tmp_path / "ds"
    w = LeRobotWriter(root, fps=10, features=FEATURES)
    w.add_episode(rows(0), task="reach")
    assert lock_files(root) != []  # held while recording
    w.close()
    assert lock_files(root) == []
    with LeRobotWriter.resume(root) as again:  # the lock is taken afresh
        again.add_episode(rows(1), task="reach")
        with pytest.raises(ValueError, match="another LeRobotWriter"):
            LeRobotWriter.resume(root)
    assert lock_files(root) == []
