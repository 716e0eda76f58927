"""Continuing a LeRobot dataset: the writer's session lock, and what ``resume`` repairs.

The episodes table is the commit point of a :class:`~torchstore.lerobot.writer.LeRobotWriter`
save, so on resume it is the truth: files a killed save or merge left behind are trimmed to
it (:func:`~torchstore.lerobot.compaction.trim_to_table`), a session killed before
``close()`` has its one-episode files merged
(:func:`~torchstore.lerobot.compaction.merge_trailing_run`), ``info.json`` and
``stats.json`` are rewritten from it, and new episodes go to new files past the last ones
in use, as LeRobot does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.compaction import drop_covered_tables, merge_trailing_run, trim_to_table
from torchstore.lerobot.episodes_table import concat_episode_tables
from torchstore.lerobot.info import read_info, write_json_atomically
from torchstore.lerobot.layout import SCRATCH_DIR, STATS, TASKS, lock_file, next_file, video_path
from torchstore.lerobot.stats import stats_to_json

__all__ = ["SESSION_LOCK", "lock_session", "exists_message", "row_stats", "ResumeMixin"]

SESSION_LOCK = f"{SCRATCH_DIR}/.torchstore-session.lock"


def lock_session(root: Path) -> int:
    """Take the folder's recording lock for this writer's lifetime; refuse a second writer."""
    try:
        return lock_file(root / SESSION_LOCK, blocking=False)
    except BlockingIOError:
        raise LeRobotFormatError(f"another LeRobotWriter is recording into {root}") from None


def exists_message(root: Path) -> str:
    """Why a new writer refuses an existing folder, and what to do instead."""
    try:
        info = read_info(root)
    except LeRobotFormatError:
        return f"{root} exists; pass overwrite=True to replace it"
    saved = info.get("total_episodes") or 0
    if not any((root / "meta" / "episodes").glob("*/*.parquet")):
        return (
            f"{root} holds a LeRobot dataset with no saved episode (a recording stopped before "
            "its first save_episode): continue it with LeRobotWriter.resume(root), or pass "
            "overwrite=True to start over"
        )
    return (
        f"{root} holds a LeRobot dataset ({saved} episodes): record more with "
        "LeRobotWriter.resume(root), or pass overwrite=True to replace it"
    )


def _feature_and_stat(column: str) -> tuple[str, str]:
    """``stats/<feature>/<stat>`` split; a feature name may hold ``/`` itself."""
    if column.count("/") == 2:
        _, feature, stat = column.rsplit("/", 2)
        return feature, stat
    feature, stat = column[len("stats/") :].rsplit("/", 1)
    return feature, stat


def row_stats(table, i: int) -> dict[str, dict[str, np.ndarray]]:
    """The stats of episode row ``i`` of an episodes table: count int64, the rest float64
    (a bool feature's min/max written as booleans, as lerobot 0.4 did, read as 0.0/1.0).
    Features lacking one of min, max, mean, std, count are left out."""
    stats: dict[str, dict[str, np.ndarray]] = {}
    for name in table.column_names:
        if not name.startswith("stats/"):
            continue
        feature, stat = _feature_and_stat(name)
        value = table.column(name)[i].as_py()
        if value is None:
            continue
        arr = np.asarray(value).astype(np.int64 if stat == "count" else np.float64)
        stats.setdefault(feature, {})[stat] = arr
    required = ("min", "max", "mean", "std", "count")
    return {f: s for f, s in stats.items() if all(k in s for k in required)}


def _last_file(table, prefix: str) -> tuple[int, int]:
    """The highest ``(chunk, file)`` the episodes table names under ``prefix``."""
    chunks = table.column(f"{prefix}chunk_index").to_pylist()
    files = table.column(f"{prefix}file_index").to_pylist()
    return max(zip(chunks, files, strict=True))


class ResumeMixin:
    """The writer's resume steps (state as set up by ``LeRobotWriter._setup``)."""

    def _load_existing(self) -> None:
        """Read back the committed episodes, trim leftovers of a killed save, start new files."""
        from torchstore.lerobot.source import LeRobotSource

        table = self._repaired_table()
        episodes = table.num_rows if table is not None else 0
        frames = int(sum(table.column("length").to_pylist())) if table is not None else 0
        self._probe_video_info(episodes)
        self._write_info(episodes, frames)
        if episodes:  # an empty dataset (nothing saved yet) has no tables to check
            LeRobotSource(self.root).close()  # full check of the repaired folder
        self._num_episodes, self._num_frames = episodes, frames
        for i in range(episodes):
            self._running = self._running.plus(row_stats(table, i))
        write_json_atomically(
            self.root / STATS,
            stats_to_json(self._running.result()) if episodes else {},
            durable=self._durable,
        )
        if table is not None:  # like LeRobot, a new session starts new files past the last
            self._data_pos = next_file(*_last_file(table, "data/"), self._chunks)
            self._meta_pos = next_file(*_last_file(table, "meta/episodes/"), self._chunks)
            for key, cam in self._cameras.items():
                cam.chunk, cam.file = next_file(*_last_file(table, f"videos/{key}/"), self._chunks)

    def _committed_tables(self) -> list[Any]:
        return drop_covered_tables(sorted((self.root / "meta" / "episodes").glob("*/*.parquet")))

    def _repaired_table(self):
        """The committed episodes table (None: none saved), with every file made to match it."""
        from torchstore.lerobot.source import read_tasks

        rows = self._committed_tables()
        table = concat_episode_tables(rows) if rows else None
        if table is not None:  # the committed state; repair everything else to match it
            self.info["total_episodes"] = table.num_rows
            self.info["total_frames"] = int(sum(table.column("length").to_pylist()))
        else:
            self.info["total_episodes"], self.info["total_frames"] = 0, 0
        tasks_path = self.root / TASKS
        if tasks_path.exists():
            self.tasks = read_tasks(tasks_path)
            self._task_ids = {t: i for i, t in enumerate(self.tasks)}
        self.info["total_tasks"] = len(self.tasks)
        cameras = list(self._cameras)
        trim_to_table(
            self.root, table, cameras, durable=self._durable, use_dictionary=self._dictionary
        )
        if merge_trailing_run(  # a session killed before close() merged it
            self.root,
            rows,
            cameras,
            data_cap=self._data_cap,
            video_cap=self._video_cap,
            durable=self._durable,
            use_dictionary=self._dictionary,
        ):
            table = concat_episode_tables(self._committed_tables())
        return table

    def _probe_video_info(self, episodes: int) -> None:
        """Stream facts of a video feature whose info.json entry lacks them (a recording
        killed before its first save wrote them)."""
        if not episodes:
            return
        from torchstore.io.frames.video import probe_video

        for name, feature in list(self.features.items()):
            first = self.root / video_path(name, 0, 0)
            if feature.is_video and feature.info is None and first.exists():
                self._set_video_info(name, probe_video(first))
