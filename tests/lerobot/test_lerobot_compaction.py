"""Saves write one-episode files; close() merges them as LeRobot would, and a kill at any
point of the merge leaves a folder that resume() repairs with every episode intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torchstore.lerobot.compaction as compaction
from torchstore.lerobot import LeRobotSource, LeRobotWriter

REPO = Path(__file__).resolve().parents[2]

# Deterministic episode content, shared by the recorder subprocess (exec'd) and the checks.
ROWS_SOURCE = textwrap.dedent(
    """
    import numpy as np

    FEATURES = {
        "state": {"dtype": "float32", "shape": [3], "names": None},
        "wrist": {"dtype": "image", "shape": [6, 8, 3], "names": ["height", "width", "channels"]},
        "front": {"dtype": "video", "shape": [32, 48, 3], "names": ["height", "width", "channels"]},
    }

    def rows(e):
        rng = np.random.default_rng(e)
        n = 3 + e % 4
        front = np.zeros((n, 32, 48, 3), np.uint8)
        front[..., 0] = np.linspace(0, 255, 48, dtype=np.uint8)[None, None]
        front[..., 1] = 37 * e % 256
        return {
            "state": rng.standard_normal((n, 3)).astype(np.float32),
            "wrist": rng.integers(0, 256, (n, 6, 8, 3), dtype=np.uint8),
            "front": front,
        }
    """
)
_namespace: dict = {}
exec(ROWS_SOURCE, _namespace)
FEATURES, rows = _namespace["FEATURES"], _namespace["rows"]


def files(root: Path, pattern: str) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.glob(pattern))


def assert_lerobot_layout(root: Path, episodes: int) -> None:
    """What LeRobot's loader relies on: sorted data files give index 0..N-1, sorted
    episode tables give episodes 0..N-1, and the table's frame ranges match."""
    data = [
        pq.read_table(root / f, columns=["index", "episode_index"])
        for f in files(root, "data/*/*.parquet")
    ]
    meta = [pq.read_table(root / f) for f in files(root, "meta/episodes/*/*.parquet")]
    index = pa.concat_tables(data).column("index").to_numpy() if data else np.array([])
    table = pa.concat_tables(meta) if meta else None
    assert (table.num_rows if table is not None else 0) == episodes
    if table is not None:
        assert table.column("episode_index").to_pylist() == list(range(episodes))
        assert index.tolist() == list(range(table.column("dataset_to_index")[-1].as_py()))


def check_episodes(root: Path, episodes: int) -> None:
    assert_lerobot_layout(root, episodes)
    with LeRobotSource(root) as src:
        assert len(src.episodes) == episodes
        for entry in src.episodes:
            want = rows(entry.index)
            got = src.read_episode(entry, ["state", "wrist", "front"])
            np.testing.assert_array_equal(got["state"], want["state"])
            np.testing.assert_array_equal(got["wrist"], want["wrist"])
            assert np.abs(got["front"].astype(int) - want["front"]).mean() < 3.0


def test_each_save_adds_its_own_files_and_close_merges_them(tmp_path):
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=10, features=FEATURES) as w:
        for e in range(6):
            w.add_episode(rows(e), task="reach")
            # a complete dataset after every save, one file of each kind per episode
            assert len(files(root, "data/*/*.parquet")) == e + 1
            assert len(files(root, "videos/front/*/*.mp4")) == e + 1
            assert_lerobot_layout(root, e + 1)
    assert files(root, "data/*/*.parquet") == ["data/chunk-000/file-000.parquet"]
    assert files(root, "meta/episodes/*/*.parquet") == ["meta/episodes/chunk-000/file-000.parquet"]
    assert files(root, "videos/front/*/*.mp4") == ["videos/front/chunk-000/file-000.mp4"]
    meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    lengths = [len(rows(e)["state"]) for e in range(6)]
    ends = np.cumsum(lengths) / 10
    np.testing.assert_allclose(
        meta.column("videos/front/from_timestamp").to_numpy(), [0, *ends[:-1]]
    )
    np.testing.assert_allclose(meta.column("videos/front/to_timestamp").to_numpy(), ends)
    groups = pq.ParquetFile(root / "data/chunk-000/file-000.parquet").metadata.num_row_groups
    assert groups == 6  # one row group per episode, as LeRobot writes them
    check_episodes(root, 6)
    # a second session appends new files after the merged ones, and merges its own
    with LeRobotWriter.resume(root) as w:
        for e in range(6, 9):
            w.add_episode(rows(e), task="reach")
    assert files(root, "data/*/*.parquet") == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
    ]
    assert len(files(root, "meta/episodes/*/*.parquet")) == 2
    check_episodes(root, 9)


def test_merge_respects_the_size_caps_and_chunks(tmp_path):
    root = tmp_path / "ds"
    caps = dict(chunks_size=2, data_files_size_in_mb=0.01, video_files_size_in_mb=0.004)
    with LeRobotWriter(root, fps=10, features=FEATURES, **caps) as w:
        for e in range(10):
            w.add_episode(rows(e), task="reach")
    data = files(root, "data/*/*.parquet")
    videos = files(root, "videos/front/*/*.mp4")
    assert 1 < len(data) < 10 and 1 < len(videos) < 10
    for f in data:
        assert (root / f).stat().st_size < 0.01 * 2**20 * 1.5
    check_episodes(root, 10)


class Killed(BaseException):
    """Stands in for SIGKILL at one exact step of the merge."""


@pytest.mark.parametrize("step", range(16))  # 4 renames, 11 deletions, and done
def test_a_merge_killed_at_any_step_resumes_with_every_episode(tmp_path, monkeypatch, step):
    root = tmp_path / "ds"
    caps = dict(data_files_size_in_mb=0.02, video_files_size_in_mb=0.01)
    w = LeRobotWriter(root, fps=10, features=FEATURES, **caps)
    for e in range(5):
        w.add_episode(rows(e), task="reach")
    count = {"n": 0}
    real_replace, real_unlink = os.replace, Path.unlink

    def tick():
        count["n"] += 1
        if count["n"] > step:
            raise Killed

    def replace(a, b):
        tick()
        real_replace(a, b)

    def unlink(self, missing_ok=False):
        # deleting staged files is cleanup, and lock files are the kernel's job after a kill
        if ".compact.tmp" not in self.name and "images" not in self.parts:
            tick()
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(compaction.os, "replace", replace)
    monkeypatch.setattr(compaction.Path, "unlink", unlink)
    try:
        w.close()
    except Killed:
        pass
    monkeypatch.undo()
    with LeRobotWriter.resume(root) as again:
        assert again.num_episodes == 5
    check_episodes(root, 5)


SESSION = ROWS_SOURCE + textwrap.dedent(
    """
    import sys
    from torchstore.lerobot import LeRobotWriter

    w = LeRobotWriter(sys.argv[1], fps=10, features=FEATURES)
    for e in range(12):
        w.add_episode(rows(e), task="reach")
    print("closing", flush=True)
    w.close()
    print("closed", flush=True)
    """
)


def test_sigkill_during_close_loses_nothing(tmp_path):
    for trial, delay in enumerate((0.0, 0.05, 0.15, 0.3)):
        root = tmp_path / f"ds{trial}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "SVT_LOG": "0"}
        proc = subprocess.Popen(
            [sys.executable, "-c", SESSION, str(root)], stdout=subprocess.PIPE, env=env, text=True
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line or line.startswith("closing"):
                    break
            assert line.startswith("closing"), f"recorder died early: {line!r}"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with LeRobotWriter.resume(root) as w:
            assert w.num_episodes == 12, trial
        check_episodes(root, 12)


def test_without_checkpoints_the_folder_is_the_same_dataset(tmp_path):
    """checkpoints=False (what an export uses) writes the same dataset, all at close()."""
    caps = dict(data_files_size_in_mb=0.01, video_files_size_in_mb=0.004)
    with LeRobotWriter(tmp_path / "a", fps=10, features=FEATURES, **caps) as w:
        for e in range(7):
            w.add_episode(rows(e), task=f"task {e % 2}")
    w = LeRobotWriter(tmp_path / "b", fps=10, features=FEATURES, checkpoints=False, **caps)
    for e in range(7):
        w.add_episode(rows(e), task=f"task {e % 2}")
    assert files(tmp_path / "b", "meta/episodes/*/*.parquet") == []  # nothing readable yet
    w.close()
    check_episodes(tmp_path / "b", 7)
    assert len(files(tmp_path / "b", "data/*/*.parquet")) > 1  # the caps still roll files over
    a, b = (pq.read_table(next((tmp_path / d / "meta/episodes").rglob("*.parquet"))) for d in "ab")
    assert a.schema == b.schema
    for name in a.column_names:
        if not name.startswith(("data/", "videos/", "meta/")):  # file positions may differ
            assert a.column(name).to_pylist() == b.column(name).to_pylist(), name
    for meta in ("info.json", "stats.json"):
        assert (tmp_path / "a/meta" / meta).read_text() == (tmp_path / "b/meta" / meta).read_text()
    assert pq.read_table(tmp_path / "a/meta/tasks.parquet").equals(
        pq.read_table(tmp_path / "b/meta/tasks.parquet")
    )
    assert not (tmp_path / "b/images").exists()


KILLED_SESSION = ROWS_SOURCE + textwrap.dedent(
    """
    import sys, time
    from torchstore.lerobot import LeRobotWriter

    w = LeRobotWriter(sys.argv[1], fps=10, features=FEATURES)
    for e in range(8):
        w.add_episode(rows(e), task="reach")
    print("saved all", flush=True)
    time.sleep(120)
    """
)


def test_resume_merges_the_files_of_a_session_killed_before_close(tmp_path):
    root = tmp_path / "ds"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SVT_LOG": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SESSION, str(root)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("saved all"), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(files(root, "data/*/*.parquet")) == 8  # one file per saved episode
    check_episodes(root, 8)  # a complete dataset as it is
    with LeRobotWriter.resume(root) as w:
        assert w.num_episodes == 8
        assert files(root, "data/*/*.parquet") == ["data/chunk-000/file-000.parquet"]
        assert len(files(root, "videos/front/*/*.mp4")) == 1
        w.add_episode(rows(8), task="reach")
    check_episodes(root, 9)
    assert len(files(root, "data/*/*.parquet")) == 2
