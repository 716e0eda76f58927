"""``LeRobotWriter(checkpoints=False)``: a folder nobody reads before it is complete.

An export written aside and renamed needs no checkpoint per episode: each save appends the
episode's rows to the open data file (one row group per episode, LeRobot's roll-over rule
between files) and keeps its episode row and scratch MP4s; ``close()`` joins each camera's
scratch files into LeRobot-sized MP4s and writes the episodes table, tasks, info.json and
stats.json once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchstore.io.records.parquet import write_table_atomically
from torchstore.lerobot.episodes_table import EpisodeRow, episodes_table
from torchstore.lerobot.info import write_json_atomically
from torchstore.lerobot.layout import STATS, data_path, episodes_path, next_file, video_path
from torchstore.lerobot.stats import stats_to_json

__all__ = ["BulkMixin"]


class BulkMixin:
    """The writer's steps without checkpoints (state as set up by ``LeRobotWriter._setup``)."""

    def _buffer_episode(self, index: int, n: int, frame_tasks: list[str], table, stats) -> None:
        """The episode's rows go to the open data file, the rest waits for close()."""
        from torchstore.io.frames.video import probe_video

        scratch: dict[str, Path] = {}
        try:
            for key, cam in self._cameras.items():
                self._finish_encoding(key, cam, n)
                scratch[key], cam.encoder, cam.scratch = cam.scratch, None, None
                if self.features[key].info is None:
                    self._set_video_info(key, probe_video(scratch[key]))
            pos, writer, frames_in = self._bulk_data_file(table, n)
            writer.write_table(table, row_group_size=max(n, 1))  # one row group per episode
        except BaseException:
            for path in scratch.values():
                path.unlink(missing_ok=True)
            raise
        self._bulk_file = (pos, writer, frames_in + n)
        self._bulk_rows.append(
            EpisodeRow(index, n, list(dict.fromkeys(frame_tasks)), pos, self._num_frames, stats)
        )
        self._bulk_scratch.append(scratch)
        self._num_episodes, self._num_frames = index + 1, self._num_frames + n

    def _bulk_data_file(self, table, n: int) -> tuple[tuple[int, int], Any, int]:
        """``(position, ParquetWriter, frames in it)`` of the data file the next ``n`` rows
        go to: the open one, or a new one when they would take it past the size cap."""
        import pyarrow.parquet as pq

        if self._bulk_file is not None:  # LeRobot's roll-over rule, checked before appending
            pos, writer, frames_in = self._bulk_file
            size = (self.root / data_path(*pos)).stat().st_size
            if size + size / max(frames_in, 1) * n >= self._data_cap:
                writer.close()
                self._bulk_file = None
                self._data_pos = next_file(*pos, self._chunks)
        if self._bulk_file is None:
            path = self.root / data_path(*self._data_pos)
            path.parent.mkdir(parents=True, exist_ok=True)
            dictionary = [c for c in self._dictionary if c in table.schema.names]
            writer = pq.ParquetWriter(
                path, table.schema, compression="snappy", use_dictionary=dictionary
            )
            self._bulk_file = (self._data_pos, writer, 0)
        return self._bulk_file

    def _finish_bulk(self) -> None:
        """Close the data file, join the videos, write the metadata."""
        rows, scratch = self._bulk_rows, self._bulk_scratch
        self._bulk_rows, self._bulk_scratch = [], []
        try:
            if self._bulk_file is not None:
                self._bulk_file[1].close()
                self._bulk_file = None
            if not rows:
                return
            for key in self._cameras:
                self._join_videos(key, rows, scratch)
            write_table_atomically(
                self.root / episodes_path(*self._meta_pos),
                episodes_table(rows, self._meta_pos),
                durable=self._durable,
            )
            if self.tasks:
                self._write_tasks()
            self._write_info(self._num_episodes, self._num_frames)
            write_json_atomically(
                self.root / STATS, stats_to_json(self._running.result()), durable=self._durable
            )
        finally:
            for files in scratch:
                for path in files.values():
                    path.unlink(missing_ok=True)

    def _join_videos(self, key: str, rows: list[EpisodeRow], scratch: list[dict[str, Path]]):
        """Camera ``key``'s scratch MP4s concatenated into files below the size cap; each
        row learns where its episode lies."""
        from torchstore.io.frames.video import concat_videos
        from torchstore.lerobot.compaction import pack_by_size

        cam = self._cameras[key]
        pos = (cam.chunk, cam.file)
        by_index = {row.index: k for k, row in enumerate(rows)}
        groups = pack_by_size(
            rows,
            lambda r: scratch[by_index[r.index]][key],
            self._video_cap,
            split_streams=cam.copied,
        )
        for g, group in enumerate(groups):
            if g:
                pos = next_file(*pos, self._chunks)
            target = self.root / video_path(key, *pos)
            target.parent.mkdir(parents=True, exist_ok=True)
            spans = concat_videos([scratch[by_index[r.index]][key] for r in group], target)
            for row, (begin, end) in zip(group, spans, strict=True):
                row.videos[key] = (pos, begin, end)
