"""Read a LeRobot dataset folder, v3.0 or v2.1, one episode at a time.

:class:`LeRobotSource` checks the folder against the invariants LeRobot's own loader
relies on and fails loudly, naming the file:
episodes ``0..N-1`` in order, frame ranges that tile ``0..total_frames``, info.json
totals that agree with the tables, Parquet files with footers, video files present.
Episodes are located through the episodes table, never through file names, and read
in order with bounded memory: one data file's table and one open decoder per camera.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import FrameCodecError, LeRobotFormatError, UnsafePathError, VideoError
from torchstore.io.paths import check_relpath, resolve_inside
from torchstore.io.records.parquet import require_pyarrow
from torchstore.lerobot.features import Feature, cell_text, decode_image
from torchstore.lerobot.info import codebase_major_minor, info_features, read_info, read_json
from torchstore.lerobot.layout import (
    DATA_PATH,
    STATS,
    TASKS,
    V21_DATA_PATH,
    V21_VIDEO_PATH,
    VIDEO_PATH,
)
from torchstore.lerobot.parquet_files import check_footer, read_table
from torchstore.lerobot.rejected import RejectedEpisode, read_rejected

__all__ = ["EpisodeEntry", "LeRobotSource"]


@dataclass(frozen=True)
class EpisodeEntry:
    """Where one episode's frames are: its data file and row range, and each camera's file."""

    index: int
    length: int
    tasks: tuple[str, ...]
    data_file: str
    from_index: int
    videos: Mapping[str, tuple[str, float]] = field(default_factory=dict)


def _format(template: str, what: str, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise LeRobotFormatError(
            f"info.json {what} template {template!r} cannot be filled ({exc})"
        ) from None


def _task_list(indices: list, texts: list, path: Path) -> list[str]:
    order = sorted(range(len(indices)), key=lambda i: indices[i])
    if [indices[i] for i in order] != list(range(len(indices))):
        raise LeRobotFormatError(
            f"{path}: task_index values must be 0..{len(indices) - 1}, got {sorted(indices)}"
        )
    if any(not isinstance(t, str) for t in texts):
        raise LeRobotFormatError(f"{path}: every task must be a string")
    return [texts[i] for i in order]


def read_tasks(path: Path) -> list[str]:
    """``meta/tasks.parquet`` as task strings by task index.

    lerobot 0.6 names the task column ``task`` (a pandas index named ``task``); lerobot
    0.4.x saves an unnamed index, which lands in the file as ``__index_level_0__``. The
    task column is ``task``, else the pandas metadata's index column.
    """
    table = read_table(path, what=str(path))
    names = table.column_names
    column = "task" if "task" in names else None
    if column is None and table.schema.metadata and b"pandas" in table.schema.metadata:
        try:
            index_columns = json.loads(table.schema.metadata[b"pandas"]).get("index_columns", [])
        except ValueError:
            index_columns = []
        column = next((c for c in index_columns if isinstance(c, str) and c in names), None)
    if "task_index" not in names or column is None:
        raise LeRobotFormatError(
            f"{path} needs a 'task_index' column and a 'task' column, has {sorted(names)}"
        )
    return _task_list(
        table.column("task_index").to_pylist(), table.column(column).to_pylist(), path
    )


class LeRobotSource:
    """A LeRobot dataset folder opened for reading (``meta/info.json`` at its root).

    Attributes:
        root: the folder.
        info: the parsed info.json.
        version: ``"v3.0"``-style codebase version string.
        features: ``{name: Feature}`` in info.json order.
        fps: frames per second.
        tasks: task strings, by task index.
        episodes: one :class:`EpisodeEntry` per episode, in order.
        rejected: episodes listed in ``meta/rejected_episodes.json``.
        stats: the parsed stats.json, or None.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.info = read_info(self.root)
        self.version = str(self.info["codebase_version"])
        self.features = info_features(self.info, source=f"{self.root}/meta/info.json")
        self.fps = self.info["fps"]
        major, _ = codebase_major_minor(self.version, source=str(self.root))
        if major == 3:
            self.tasks = self._read_tasks_v3()
            self.episodes = self._read_episodes_v3()
        else:
            self.tasks = self._read_tasks_v21()
            self.episodes = self._read_episodes_v21()
        self._check_totals()
        self.rejected: dict[int, RejectedEpisode] = read_rejected(self.root)
        self.stats = self._read_stats()
        self._table_file: str | None = None
        self._table = None
        self._readers: dict[str, Any] = {}

    # ----------------------------------------------------------------- metadata
    def _path(self, rel: str) -> Path:
        """``root / rel`` for a path the metadata names, refusing anything that leaves the folder.

        Symlinks are refused, except those of a huggingface_hub cache snapshot
        (``snapshots/<commit>/...`` linking into the repo's own ``blobs/``).
        """
        subject = f"file named by {self.root}/meta"
        try:
            return resolve_inside(self.root, rel, subject=subject)
        except UnsafePathError as exc:
            blobs = self.root.parent.parent / "blobs"
            if self.root.parent.name == "snapshots" and blobs.is_dir():
                try:
                    check_relpath(rel, subject=subject)
                except UnsafePathError:
                    raise LeRobotFormatError(str(exc)) from None
                target = (self.root / rel).resolve()
                if target.is_relative_to(blobs.resolve()) or target.is_relative_to(
                    self.root.resolve()
                ):
                    return self.root / rel
            raise LeRobotFormatError(str(exc)) from None

    def _read_stats(self) -> dict | None:
        data = read_json(self.root / STATS, missing=None)
        return data if isinstance(data, dict) else None

    def _is_empty_recording(self) -> bool:
        """A v3.0 folder whose recorder saved no episode: info.json only, 0 episodes."""
        return self.info.get("total_episodes") == 0 and not any(
            (self.root / "meta" / "episodes").glob("*/*.parquet")
        )

    def _read_tasks_v3(self) -> list[str]:
        if self._is_empty_recording() and not (self.root / TASKS).exists():
            return []
        return read_tasks(self.root / TASKS)

    def _read_tasks_v21(self) -> list[str]:
        path = self.root / "meta/tasks.jsonl"
        rows = self._jsonl(path)
        try:
            return _task_list([r["task_index"] for r in rows], [r["task"] for r in rows], path)
        except (KeyError, TypeError):
            raise LeRobotFormatError(f"{path}: every line needs 'task_index' and 'task'") from None

    @staticmethod
    def _jsonl(path: Path) -> list[dict]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise LeRobotFormatError(f"{path} is missing") from None
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise LeRobotFormatError(
                    f"{path} line {number} is not valid JSON ({exc})"
                ) from None
            if not isinstance(row, dict):
                raise LeRobotFormatError(f"{path} line {number} must be a JSON object")
            rows.append(row)
        return rows

    def _read_episodes_v3(self) -> list[EpisodeEntry]:
        pa = require_pyarrow()
        files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not files and self._is_empty_recording():
            return []
        if not files:
            raise LeRobotFormatError(
                f"{self.root}/meta/episodes/ holds no Parquet files: the dataset was never "
                "finalized (a LeRobot recording killed before finalize() leaves none)"
            )
        cameras = [n for n, f in self.features.items() if f.is_video]
        wanted = [
            "episode_index",
            "tasks",
            "length",
            "data/chunk_index",
            "data/file_index",
            "dataset_from_index",
            "dataset_to_index",
        ]
        for key in cameras:
            wanted += [
                f"videos/{key}/chunk_index",
                f"videos/{key}/file_index",
                f"videos/{key}/from_timestamp",
            ]
        tables = []
        for path in files:
            import pyarrow.parquet as pq

            check_footer(path, what=str(path))
            present = set(pq.read_schema(path).names)
            missing = [c for c in wanted if c not in present]
            if missing:
                raise LeRobotFormatError(f"{path} lacks episode columns {missing}")
            tables.append(read_table(path, columns=wanted, what=str(path)))
        table = (
            pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        )
        cols = {name: table.column(name).to_pylist() for name in wanted}
        data_template = self.info.get("data_path") or DATA_PATH
        video_template = self.info.get("video_path") or VIDEO_PATH
        entries = []
        for row in range(table.num_rows):
            videos = {
                key: (
                    _format(
                        video_template,
                        "video_path",
                        video_key=key,
                        chunk_index=cols[f"videos/{key}/chunk_index"][row],
                        file_index=cols[f"videos/{key}/file_index"][row],
                    ),
                    float(cols[f"videos/{key}/from_timestamp"][row]),
                )
                for key in cameras
            }
            length = cols["length"][row]
            frm, to = cols["dataset_from_index"][row], cols["dataset_to_index"][row]
            if None in (length, frm, to) or to - frm != length:
                raise LeRobotFormatError(
                    f"{self.root}/meta/episodes: episode row {row} has length {length} but "
                    f"dataset_from_index..dataset_to_index {frm}..{to}"
                )
            entries.append(
                EpisodeEntry(
                    index=cols["episode_index"][row],
                    length=length,
                    tasks=tuple(cols["tasks"][row] or ()),
                    data_file=_format(
                        data_template,
                        "data_path",
                        chunk_index=cols["data/chunk_index"][row],
                        file_index=cols["data/file_index"][row],
                    ),
                    from_index=frm,
                    videos=videos,
                )
            )
        self._check_order(entries, f"{self.root}/meta/episodes")
        return entries

    def _read_episodes_v21(self) -> list[EpisodeEntry]:
        path = self.root / "meta/episodes.jsonl"
        rows = sorted(self._jsonl(path), key=lambda r: r.get("episode_index", -1))
        chunks_size = self.info.get("chunks_size") or 1000
        data_template = self.info.get("data_path") or V21_DATA_PATH
        video_template = self.info.get("video_path") or V21_VIDEO_PATH
        cameras = [n for n, f in self.features.items() if f.is_video]
        entries, start = [], 0
        for row in rows:
            index, length = row.get("episode_index"), row.get("length")
            if not isinstance(index, int) or not isinstance(length, int) or length < 1:
                raise LeRobotFormatError(
                    f"{path}: {row!r} needs int 'episode_index' and a positive 'length'"
                )
            chunk = index // chunks_size
            videos = {
                key: (
                    _format(
                        video_template,
                        "video_path",
                        episode_chunk=chunk,
                        video_key=key,
                        episode_index=index,
                    ),
                    0.0,
                )
                for key in cameras
            }
            data = _format(data_template, "data_path", episode_chunk=chunk, episode_index=index)
            entries.append(
                EpisodeEntry(index, length, tuple(row.get("tasks") or ()), data, start, videos)
            )
            start += length
        self._check_order(entries, str(path))
        return entries

    def _check_order(self, entries: list[EpisodeEntry], where: str) -> None:
        expected_start = 0
        for position, entry in enumerate(entries):
            if entry.index != position:
                raise LeRobotFormatError(
                    f"{where}: episode indices must run 0..{len(entries) - 1} in order, found "
                    f"{entry.index} at position {position} (an episode index gap or reordering)"
                )
            if entry.from_index != expected_start:
                raise LeRobotFormatError(
                    f"{where}: episode {entry.index} starts at frame {entry.from_index}, expected "
                    f"{expected_start} (frame ranges must tile 0..total_frames)"
                )
            expected_start += entry.length

    def _check_totals(self) -> None:
        n, frames = len(self.episodes), sum(e.length for e in self.episodes)
        told_n, told_frames = self.info.get("total_episodes"), self.info.get("total_frames")
        if told_n is not None and told_n != n or told_frames is not None and told_frames != frames:
            raise LeRobotFormatError(
                f"{self.root}/meta/info.json says {told_n} episodes and {told_frames} frames, the "
                f"episode table holds {n} and {frames}: the recording was not finalized "
                "(for a torchstore recording, LeRobotWriter.resume() repairs it)"
            )

    # ----------------------------------------------------------------- frames
    @property
    def num_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    def _data_table(self, rel: str):
        if rel != self._table_file:
            self._table, self._table_file = None, None
            path = self._path(rel)
            if not path.exists():
                raise LeRobotFormatError(f"{path} is missing (named by the episode table)")
            self._table = read_table(path, what=str(path))
            self._table_file = rel
            self._table_index = self._column(self._table, "index", rel)
        return self._table

    def _column(self, table, name: str, rel: str) -> np.ndarray:
        if name not in table.column_names:
            raise LeRobotFormatError(f"{self.root / rel} has no column {name!r}")
        feature = self.features.get(name) or Feature(name, "int64", (1,))
        return feature.from_arrow(table.column(name), source=str(self.root / rel))

    def _rows_of(self, entry: EpisodeEntry) -> tuple[Any, int]:
        table = self._data_table(entry.data_file)
        index = self._table_index
        where = f"{self.root / entry.data_file}"
        guess = entry.from_index - int(index[0]) if len(index) else -1  # rows are in index order
        if 0 <= guess < len(index) and index[guess] == entry.from_index:
            hits = np.array([guess])
        else:
            hits = np.flatnonzero(index == entry.from_index)
        if len(hits) != 1 or hits[0] + entry.length > len(index):
            raise LeRobotFormatError(
                f"{where} does not hold frames "
                f"{entry.from_index}..{entry.from_index + entry.length - 1} "
                f"of episode {entry.index} (the episode table and the data disagree)"
            )
        start = int(hits[0])
        span = index[start : start + entry.length]
        if not np.array_equal(span, np.arange(entry.from_index, entry.from_index + entry.length)):
            raise LeRobotFormatError(
                f"{where}: the 'index' column of episode {entry.index} is not contiguous"
            )
        sliced = table.slice(start, entry.length)
        for name, expected in (
            ("episode_index", np.full(entry.length, entry.index)),
            ("frame_index", np.arange(entry.length)),
        ):
            if name in sliced.column_names and not np.array_equal(
                self._column(sliced, name, entry.data_file), expected
            ):
                raise LeRobotFormatError(
                    f"{where}: column {name!r} is wrong for episode {entry.index}"
                )
        return sliced, start

    def read_episode(
        self, entry: EpisodeEntry, names: Iterable[str], *, tolerance_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """The frames of one episode for the features ``names``, as numpy arrays."""
        rows, _ = self._rows_of(entry)
        out: dict[str, np.ndarray] = {}
        for name in names:
            feature = self.features[name]
            if feature.is_video:
                out[name] = self._video_frames(entry, feature, tolerance_s)
            elif feature.dtype == "image":
                out[name] = self._image_frames(rows, entry, feature)
            elif feature.is_text:
                out[name] = self._strings(rows, entry, feature)
            else:
                if name not in rows.column_names:
                    raise LeRobotFormatError(
                        f"{self.root / entry.data_file} has no column for feature {name!r}"
                    )
                out[name] = feature.from_arrow(
                    rows.column(name), source=str(self.root / entry.data_file)
                )
        return out

    def read_episodes(
        self,
        entries: Sequence[EpisodeEntry],
        names: Iterable[str],
        *,
        tolerance_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """The frames of consecutive ``entries`` concatenated, for the features ``names``.

        Episodes stored back to back in one data file are read as one slice (one Arrow
        conversion per column instead of one per episode), with the same checks as
        :meth:`read_episode`; anything else is read episode by episode.
        """
        names = list(names)
        entries = list(entries)
        contiguous = all(
            b.data_file == a.data_file and b.from_index == a.from_index + a.length
            for a, b in zip(entries, entries[1:])
        )
        if len(entries) == 1 or not contiguous:
            parts = [self.read_episode(e, names, tolerance_s=tolerance_s) for e in entries]
            return {n: np.concatenate([p[n] for p in parts]) for n in names}
        first, total = entries[0], sum(e.length for e in entries)
        span = EpisodeEntry(first.index, total, (), first.data_file, first.from_index)
        table = self._data_table(first.data_file)
        index = self._table_index
        start = first.from_index - int(index[0]) if len(index) else -1
        if not (0 <= start and start + total <= len(index)) or not np.array_equal(
            index[start : start + total], np.arange(first.from_index, first.from_index + total)
        ):
            parts = [
                self.read_episode(e, names, tolerance_s=tolerance_s) for e in entries
            ]  # precise errors
            return {n: np.concatenate([p[n] for p in parts]) for n in names}
        rows = table.slice(start, total)
        lengths = np.array([e.length for e in entries])
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        expected = {
            "episode_index": np.repeat([e.index for e in entries], lengths),
            "frame_index": np.arange(total) - np.repeat(offsets, lengths),
        }
        for name, want in expected.items():
            if name in rows.column_names and not np.array_equal(
                self._column(rows, name, first.data_file), want
            ):
                raise LeRobotFormatError(
                    f"{self.root / first.data_file}: column {name!r} is wrong for episodes "
                    f"{first.index}..{entries[-1].index}"
                )
        out: dict[str, np.ndarray] = {}
        for name in names:
            feature = self.features[name]
            if feature.is_numeric:
                if name not in rows.column_names:
                    raise LeRobotFormatError(
                        f"{self.root / first.data_file} has no column for feature {name!r}"
                    )
                out[name] = feature.from_arrow(
                    rows.column(name), source=str(self.root / first.data_file)
                )
            elif feature.is_video:
                out[name] = np.concatenate(
                    [self._video_frames(e, feature, tolerance_s) for e in entries]
                )
            elif feature.dtype == "image":
                out[name] = np.concatenate(
                    [
                        self._image_frames(rows.slice(o, e.length), e, feature)
                        for o, e in zip(offsets.tolist(), entries)
                    ]
                )
            else:
                out[name] = self._strings(rows, span, feature)
        return out

    def _image_frames(self, rows, entry: EpisodeEntry, feature: Feature) -> np.ndarray:
        where = self.root / entry.data_file
        if feature.name not in rows.column_names:
            raise LeRobotFormatError(f"{where} has no column for image feature {feature.name!r}")
        frames = np.empty((entry.length, *feature.hwc), dtype=np.uint8)
        for k, cell in enumerate(rows.column(feature.name).to_pylist()):
            what = f"{where} feature {feature.name!r} frame {k} of episode {entry.index}"
            if isinstance(cell, dict):
                data = cell.get("bytes")
                if data is None and cell.get("path"):
                    data = self._path(cell["path"]).read_bytes()
            else:
                data = cell
            if not isinstance(data, bytes | bytearray):
                raise LeRobotFormatError(f"{what} holds no image bytes")
            image = decode_image(bytes(data), what=what)
            if image.shape != feature.hwc:
                raise LeRobotFormatError(
                    f"{what} is {list(image.shape)}, "
                    f"info.json declares {list(feature.hwc)} (H, W, C)"
                )
            frames[k] = image
        return frames

    def _strings(self, rows, entry: EpisodeEntry, feature: Feature) -> np.ndarray:
        """Codes of a text feature's cells (``string``, or ``language`` as JSON) in its table."""
        if feature.name not in rows.column_names:
            raise LeRobotFormatError(
                f"{self.root / entry.data_file} has no column for feature {feature.name!r}"
            )
        table = self._string_tables.setdefault(feature.name, {})
        values = [cell_text(feature, v) for v in rows.column(feature.name).to_pylist()]
        return np.array([table.setdefault(v, len(table)) for v in values], dtype=np.int64)

    @property
    def _string_tables(self) -> dict[str, dict[str, int]]:
        if not hasattr(self, "_strings_seen"):
            self._strings_seen: dict[str, dict[str, int]] = {}
        return self._strings_seen

    def string_table(self, name: str) -> list[str]:
        """The strings of a ``string`` feature seen so far, by code."""
        return list(self._string_tables.get(name, {}))

    def _video_frames(
        self, entry: EpisodeEntry, feature: Feature, tolerance_s: float | None
    ) -> np.ndarray:
        from torchstore.io.frames.video import VideoFrameReader
        from torchstore.lerobot.depth import depth_coding, is_depth

        rel, from_ts = entry.videos[feature.name]
        path = self._path(rel)
        reader = self._readers.get(feature.name)
        if reader is None or reader[0] != rel:
            if reader is not None:
                reader[1].close()
            if not path.exists():
                raise LeRobotFormatError(
                    f"{path} is missing (video of episode {entry.index}, feature {feature.name!r})"
                )
            reader = (rel, VideoFrameReader(path, fps=self.fps, raw_luma=is_depth(feature)))
            self._readers[feature.name] = reader
        try:
            frames = reader[1].read(from_ts, entry.length, tolerance_s=tolerance_s)
        except VideoError as exc:
            raise VideoError(f"episode {entry.index}, feature {feature.name!r}: {exc}") from None
        if is_depth(feature):
            frames = depth_coding(feature, source=f"{self.root}/meta/info.json").metres(frames)
        if tuple(frames.shape[1:]) != feature.hwc:
            raise LeRobotFormatError(
                f"{path} frames are {list(frames.shape[1:])}, info.json declares "
                f"{list(feature.hwc)} (H, W, C) for {feature.name!r}"
            )
        return frames

    def video_packets(
        self,
        entry: EpisodeEntry,
        feature: Feature,
        codec: Any = None,
        *,
        tolerance_s: float | None = None,
    ):
        """One episode's frames of a video feature as the MP4's packets, bytes untouched (an
        :class:`~torchstore.io.frames.codec.EncodedFrames`), located as :meth:`read_episode`
        locates frames: the episode table's ``from_timestamp`` (within ``tolerance_s``,
        default a quarter of a frame period) then exactly the episode's row count of frames.
        ``codec``: the FrameCodec the packets are declared with (default: the stream's).
        A file that is missing, too short, or holds frames of another size is an error
        naming the episode and the camera."""
        from torchstore.io.frames.codec import packets_from_mp4

        rel, from_ts = entry.videos[feature.name]
        path = self._path(rel)
        if not path.exists():
            raise LeRobotFormatError(
                f"{path} is missing (video of episode {entry.index}, feature {feature.name!r})"
            )
        where = f"episode {entry.index}, feature {feature.name!r}"
        first = _grid_frame(path, from_ts, self.fps, tolerance_s, where)
        try:  # on the grid exactly: the episode's rows are its frames
            packets = packets_from_mp4(
                path, first / self.fps, (first + entry.length) / self.fps, self.fps, codec=codec
            )
        except FrameCodecError as exc:
            raise FrameCodecError(f"{where}: {exc}", exc.frame) from None
        except VideoError as exc:
            raise VideoError(f"{where}: {exc}") from None
        if len(packets) != entry.length:
            raise LeRobotFormatError(
                f"{path}: camera {feature.name!r} has {len(packets)} frames for episode "
                f"{entry.index}, which has {entry.length} rows"
            )
        if packets.info.frame_shape != feature.hwc:
            raise LeRobotFormatError(
                f"{path} frames are {list(packets.info.frame_shape)}, info.json declares "
                f"{list(feature.hwc)} (H, W, C) for {feature.name!r}"
            )
        return packets

    def close(self) -> None:
        for _, reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._table = self._table_file = None

    def __enter__(self) -> LeRobotSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LeRobotSource({str(self.root)!r}, {self.version}, {len(self.episodes)} episodes, "
            f"{self.num_frames} frames)"
        )


def _grid_frame(path: Path, t: float, fps: int, tolerance_s: float | None, where: str) -> int:
    """The frame shown at ``t`` seconds on the ``fps`` grid (as the frame reader maps an
    episode's ``from_timestamp``); VideoError naming ``where`` if ``t`` is off the grid."""
    tolerance = 0.25 / fps if tolerance_s is None else float(tolerance_s)
    t = float(t)
    number = max(math.floor(t * fps + 0.5), 0) if t == t else 0
    if not t >= -tolerance or abs(t - number / fps) > tolerance:
        raise VideoError(
            f"{where}: {path}: from_timestamp ({t!r} s) is not on the {fps} fps frame grid "
            f"within {tolerance:.3g} s"
        )
    return number


def select_features(source: LeRobotSource, columns: Sequence[str] | None) -> list[str]:
    """Feature names to import: ``columns`` checked against the dataset, or every importable one."""
    importable = list(source.features)
    if columns is None:
        return importable
    unknown = [c for c in columns if c not in source.features]
    if unknown:
        raise LeRobotFormatError(f"{source.root}: no features {unknown}; it has {importable}")
    return list(dict.fromkeys(columns))
