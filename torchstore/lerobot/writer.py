"""Record LeRobot v3.0 datasets with a checkpoint after every episode.

LeRobot's recorder keeps its Parquet files open (no footer) and buffers episode metadata,
so a hard kill loses every episode of the session.
:class:`LeRobotWriter` instead makes the folder a complete dataset each time
:meth:`~LeRobotWriter.save_episode` returns:

* the frames of the episode in progress stay in memory (numbers, PNG bytes) or stream into
  a scratch MP4 per camera under ``images/``, encoded on a worker thread per camera so
  ``add_frame`` returns at once (bounded memory);
* at save, the episode gets files of its own (a data Parquet, an episodes-table Parquet,
  an MP4 per camera), written under temporary names and renamed into place in an order
  that makes the episodes table the commit point: tasks, each camera's MP4, the data file,
  the episodes table, then ``info.json`` and ``stats.json`` (computed before the first
  rename, and aggregated incrementally);
* nothing written earlier is read or rewritten, so a save costs the same for the 500th
  episode as for the first; :meth:`~LeRobotWriter.close` merges the session's files into
  LeRobot-sized ones (:mod:`torchstore.lerobot.compaction`), once;
* a kill before the episodes-table rename leaves the previous episodes intact; files of
  the dead episode, or of a merge cut short, are trimmed by :meth:`LeRobotWriter.resume`
  before it records on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import DestinationExistsError, EpisodeError, LeRobotFormatError
from torchstore.io.durable import fsync_folder
from torchstore.io.records.parquet import require_pyarrow, write_table_atomically, write_tables
from torchstore.lerobot.bulk import BulkMixin
from torchstore.lerobot.cameras import CameraFile, CamerasMixin, encoder_settings
from torchstore.lerobot.compaction import SavedEpisode, compact_session
from torchstore.lerobot.episodes_table import EpisodeRow, episodes_table
from torchstore.lerobot.features import DEFAULT_FEATURES, encode_png
from torchstore.lerobot.frames import (
    camera_frames,
    data_table,
    features_from_user,
    numeric_values,
)
from torchstore.lerobot.info import info_features, new_info, read_info, write_json_atomically
from torchstore.lerobot.layout import (
    CODEBASE_VERSION,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_DATA_FILES_SIZE_MB,
    DEFAULT_VIDEO_FILES_SIZE_MB,
    INFO,
    LOCK_NAME,
    SCRATCH_DIR,
    STATS,
    TASKS,
    data_path,
    episodes_path,
    next_file,
    remove_lock_files,
    writer_lock,
)
from torchstore.lerobot.recovery import SESSION_LOCK, ResumeMixin, exists_message, lock_session
from torchstore.lerobot.rejected import RejectedEpisode, now_iso, read_rejected, write_rejected
from torchstore.lerobot.stats import (
    ImageStatsAccumulator,
    RunningStats,
    numeric_stats,
    stats_to_json,
)
from torchstore.validation import positive_int, positive_number

__all__ = ["LeRobotWriter"]

_MB = 1024 * 1024


class LeRobotWriter(CamerasMixin, ResumeMixin, BulkMixin):
    """Write a LeRobot v3.0 dataset episode by episode, each one a durable checkpoint.

    Args:
        root: the dataset folder to create (must not exist unless ``overwrite``).
        fps: frames per second (an int, as LeRobot requires).
        features: ``{name: {"dtype", "shape", "names"}}`` for the user features, as in
            LeRobot's ``create``; dtypes are numpy names, ``"image"``, ``"video"`` or
            ``"string"``. The five default features are added automatically.
        robot_type: free text, e.g. ``"so101_follower"``.
        video_encoder: a :class:`~torchstore.io.frames.video.EncoderSettings`, or its short name
            ``"av1"`` / ``"h264"``; AV1 (libsvtav1, yuv420p, g=2, crf=30) by default,
            ``EncoderSettings.h264()`` (``"h264"``) for H.264.
        chunks_size / data_files_size_in_mb / video_files_size_in_mb: file roll-over caps
            (LeRobot's defaults).
        durable: ``fsync`` every file at each checkpoint (survives power loss too; a kill
            is survived without it).
        overwrite: replace an existing folder.
        checkpoints: False for a folder nobody reads before it is complete (an export
            written aside and renamed): saves then only append to open files and keep
            the episode rows in memory, and :meth:`close` writes the metadata, so nothing
            is readable (or survives a kill) until it returns.

    Examples:
        >>> w = LeRobotWriter("ds", fps=10, features={"obs": {"dtype": "float32", "shape": [3]}})
        >>> w.add_frame({"obs": np.zeros(3, np.float32)}, task="reach")
        >>> w.save_episode()
        0
        >>> w.close()
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        fps: int,
        features: Mapping[str, Any],
        robot_type: str | None = None,
        video_encoder=None,
        chunks_size: int = DEFAULT_CHUNKS_SIZE,
        data_files_size_in_mb: int = DEFAULT_DATA_FILES_SIZE_MB,
        video_files_size_in_mb: int = DEFAULT_VIDEO_FILES_SIZE_MB,
        durable: bool = False,
        overwrite: bool = False,
        checkpoints: bool = True,
    ):
        fps = positive_int("fps", fps, error=LeRobotFormatError, hint=" (LeRobot stores an int)")
        for name, cap in (
            ("chunks_size", chunks_size),
            ("data_files_size_in_mb", data_files_size_in_mb),
            ("video_files_size_in_mb", video_files_size_in_mb),
        ):
            positive_number(name, cap, error=LeRobotFormatError)
        root = Path(root)
        user = features_from_user(features)
        video_encoder = encoder_settings(video_encoder)  # a bad name fails before any file
        if root.exists():
            if not overwrite:
                raise DestinationExistsError(exists_message(root))
            if (root / SESSION_LOCK).exists():
                fd = lock_session(root)  # refuses while another writer records there
                os.close(fd)
            shutil.rmtree(root)
        info = new_info(
            fps=fps,
            features=user,
            robot_type=robot_type,
            chunks_size=chunks_size,
            data_files_size_in_mb=data_files_size_in_mb,
            video_files_size_in_mb=video_files_size_in_mb,
        )
        (root / "meta").mkdir(parents=True)
        self._setup(root, info, video_encoder, durable)
        self._bulk = not checkpoints
        write_json_atomically(root / INFO, self.info, durable=durable)

    @classmethod
    def resume(
        cls, root: str | os.PathLike, *, video_encoder=None, durable: bool = False
    ) -> LeRobotWriter:
        """Continue a v3.0 dataset: after a kill, first trim what the dead episode left behind.

        Like LeRobot, new episodes go to new data, episodes-table and video files.
        """
        root = Path(root)
        info = read_info(root)
        if not str(info["codebase_version"]).startswith("v3."):
            raise LeRobotFormatError(
                f"{root}: resume needs a v3.x dataset, this one is {info['codebase_version']}"
            )
        self = cls.__new__(cls)
        self._setup(root, info, video_encoder, durable)
        self._load_existing()
        return self

    # ----------------------------------------------------------------- setup
    def _setup(self, root: Path, info: dict, video_encoder, durable: bool) -> None:
        self.root = root
        self.info = info
        self.fps = int(info["fps"])
        self._durable = durable
        self._encoder = encoder_settings(video_encoder)
        all_features = info_features(info, source=str(root / INFO))
        self.features = {n: f for n, f in all_features.items() if n not in DEFAULT_FEATURES}
        self._chunks = int(info.get("chunks_size") or DEFAULT_CHUNKS_SIZE)
        self._data_cap = (
            float(info.get("data_files_size_in_mb") or DEFAULT_DATA_FILES_SIZE_MB) * _MB
        )
        self._video_cap = (
            float(info.get("video_files_size_in_mb") or DEFAULT_VIDEO_FILES_SIZE_MB) * _MB
        )
        scratch = root / SCRATCH_DIR
        scratch.mkdir(parents=True, exist_ok=True)
        self._session_fd = lock_session(root)
        self.tasks: list[str] = []
        self._task_ids: dict[str, int] = {}
        self._tasks_unsaved = False
        self._running = RunningStats()  # dataset stats, one episode at a time
        self._session: list[SavedEpisode] = []  # saved by this writer: merged at close()
        self._num_episodes = 0
        self._num_frames = 0
        self._data_pos = (0, 0)  # where the next episode's own files go
        self._meta_pos = (0, 0)
        self._cameras = {k: CameraFile(k) for k, f in self.features.items() if f.is_video}
        # columns worth dictionary-encoding: integers, bools, strings (floats never repeat)
        self._dictionary = [
            n
            for n, f in {**self.features, **DEFAULT_FEATURES}.items()
            if f.dtype == "string" or f.dtype == "bool" or "int" in f.dtype
        ]
        self._bulk = False  # checkpoints=False: see _buffer_episode
        self._bulk_rows: list[EpisodeRow] = []
        self._bulk_scratch: list[dict[str, Path]] = []
        self._bulk_file: tuple[tuple[int, int], Any, int] | None = (
            None  # pos, ParquetWriter, frames
        )
        self._closed = False
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._buffer: dict[str, list] = {n: [] for n, f in self.features.items() if not f.is_video}
        self._frame_tasks: list[str | None] = []
        self._image_stats = {
            n: ImageStatsAccumulator() for n, f in self.features.items() if f.is_camera
        }
        self._abort_encoders()

    # ----------------------------------------------------------------- state
    @property
    def num_episodes(self) -> int:
        """Episodes saved so far (including those of earlier sessions)."""
        return self._num_episodes

    @property
    def num_frames(self) -> int:
        return self._num_frames

    @property
    def pending_frames(self) -> int:
        """Frames of the episode in progress."""
        return len(self._frame_tasks)

    # ----------------------------------------------------------------- recording
    def add_frame(self, frame: Mapping[str, Any], *, task: str | None = None) -> None:
        """Add one frame: every user feature, plus the task (here, as ``frame["task"]``, or at
        save)."""
        self._check_open()
        frame = dict(frame)
        task = frame.pop("task", None) if task is None else task
        frame.pop("task", None)
        self._check_keys(frame.keys())
        values = {}
        for name, feature in self.features.items():
            if feature.is_camera:
                values[name] = camera_frames(feature, frame[name], batched=False)
            elif feature.dtype == "string":
                if not isinstance(frame[name], str):
                    raise LeRobotFormatError(
                        f"feature {name!r} expects a string, got {type(frame[name]).__name__}"
                    )
                values[name] = frame[name]
            else:
                values[name] = numeric_values(feature, frame[name], rows=None)
        if task is not None and not isinstance(task, str):
            raise LeRobotFormatError(f"task must be a string, got {task!r}")
        for name, value in values.items():  # all checked: now record
            self._record(name, value)
        self._frame_tasks.append(task)

    def _preset_tasks(self, tasks: Sequence[str]) -> None:
        """Number ``tasks`` 0, 1, ... before the first save (an export keeps a store's task
        table)."""
        if self._num_episodes or self.tasks:
            raise EpisodeError("tasks can only be preset on a new, empty dataset")
        if len(set(tasks)) != len(tasks) or not all(isinstance(t, str) for t in tasks):
            raise LeRobotFormatError("preset tasks must be distinct strings")
        self.tasks = list(tasks)
        self._task_ids = {t: i for i, t in enumerate(self.tasks)}
        self._tasks_unsaved = True

    def _check_keys(self, keys) -> None:
        keys = set(keys)
        missing = [n for n in self.features if n not in keys]
        extra = sorted(keys - set(self.features))
        if missing or extra:
            raise LeRobotFormatError(
                f"frame keys do not match the features: missing {missing}, unexpected {extra}"
                + (
                    " (default features are filled in automatically)"
                    if set(extra) & set(DEFAULT_FEATURES)
                    else ""
                )
            )

    def _record(self, name: str, value: Any) -> None:
        feature = self.features[name]
        if feature.is_camera:
            self._image_stats[name].update(value)
        if feature.is_video:
            self._encode(name, value[None] if value.ndim == 3 else value)
        elif feature.dtype == "image":
            batch = value[None] if value.ndim == 3 else value
            self._buffer[name].extend(encode_png(f) for f in batch)
        else:
            self._buffer[name].append(value[None])  # one frame: a block of one row

    def add_episode(
        self,
        rows: Mapping[str, Any],
        *,
        task: str | Sequence[str],
        packets: Mapping[str, Any] | None = None,
    ) -> int:
        """Add and save a whole episode: ``rows[name]`` holds ``[n, ...]`` for every user feature.

        ``task`` is one string for the episode or one per frame. ``packets``: for video
        features, the episode already encoded (``{name: EncodedFrames}`` of AV1 / H.264
        packets, the frames of ``rows[name]``), muxed into the MP4 as they are instead of
        encoding ``rows[name]``, which then only feeds the stats. Returns the episode index.
        """
        self._check_open()
        if self.pending_frames:
            raise EpisodeError(
                f"{self.pending_frames} frames of an unsaved episode are pending; "
                "save or clear them first"
            )
        if hasattr(rows, "items") and not isinstance(rows, Mapping):  # a TensorDict
            rows = {
                (k if isinstance(k, str) else ".".join(k)): v
                for k, v in rows.items(include_nested=True, leaves_only=True)
            }
        self._check_keys(rows.keys())
        n = self._episode_length(rows)
        tasks = [task] * n if isinstance(task, str) else list(task)
        if len(tasks) != n or not all(isinstance(t, str) for t in tasks):
            raise LeRobotFormatError(f"task must be a string or {n} strings (one per frame)")
        checked = self._checked_rows(rows, n)
        packets = self._checked_packets(packets or {}, n)
        try:
            for name, value in checked.items():
                if name in packets:
                    self._image_stats[name].update(value)
                    self._copy_packets(name, packets[name])
                elif self.features[name].is_camera:
                    self._record(name, value)  # stats, then PNG bytes or the episode's MP4
                elif self.features[name].dtype == "string":
                    self._buffer[name].extend(value)  # one string per frame
                else:
                    self._buffer[name].append(value)  # the episode's rows as one block
            self._frame_tasks.extend(tasks)
        except BaseException:
            self.clear_episode_buffer()
            raise
        return self.save_episode()

    def _episode_length(self, rows: Mapping[str, Any]) -> int:
        """The rows every feature of an episode has (the same for all, at least one)."""
        lengths = {name: len(rows[name]) for name in self.features}
        n = next(iter(lengths.values()), 0)
        for name, length in lengths.items():
            if length != n:
                raise LeRobotFormatError(f"feature {name!r} has {length} rows, others have {n}")
        if not n:
            raise EpisodeError("an episode needs at least one frame")
        return n

    def _checked_rows(self, rows: Mapping[str, Any], n: int) -> dict[str, Any]:
        """Every feature's ``n`` rows checked against its dtype and shape, nothing recorded."""
        checked = {}
        for name, feature in self.features.items():
            if feature.is_camera:
                checked[name] = camera_frames(feature, rows[name], batched=True)
            elif feature.dtype == "string":
                values = list(rows[name])
                if not all(isinstance(v, str) for v in values):
                    raise LeRobotFormatError(f"feature {name!r} expects strings")
                checked[name] = values
            else:
                checked[name] = numeric_values(feature, rows[name], rows=n)
        return checked

    def _checked_packets(self, packets: Mapping[str, Any], n: int) -> dict[str, Any]:
        """Encoded episodes given for video features, checked against them."""
        from torchstore.io.frames.codec import EncodedFrames

        for name, encoded in packets.items():
            feature = self.features.get(name)
            if feature is None or not feature.is_video:
                raise LeRobotFormatError(f"packets given for {name!r}, which is no video feature")
            if not isinstance(encoded, EncodedFrames) or not encoded.codec.is_video:
                raise LeRobotFormatError(
                    f"packets of {name!r} must be AV1 or H.264 EncodedFrames, "
                    f"got {getattr(encoded, 'codec', type(encoded).__name__)}"
                )
            if len(encoded) != n or encoded.info.frame_shape != feature.hwc:
                raise LeRobotFormatError(
                    f"packets of {name!r} are {len(encoded)} frames of "
                    f"{list(encoded.info.frame_shape)}; the episode has {n} of {list(feature.hwc)}"
                )
        return dict(packets)

    def clear_episode_buffer(self) -> None:
        """Discard the episode in progress (LeRobot's "re-record")."""
        self._reset_buffer()

    # ----------------------------------------------------------------- saving
    def save_episode(self, *, task: str | None = None) -> int:
        """Write the episode in progress; when this returns, the folder is a complete dataset.

        ``task`` fills in the frames added without one. Returns the episode index.
        """
        self._check_open()
        n = self.pending_frames
        if n == 0:
            raise EpisodeError("save_episode() with no frames added")
        if task is not None and not isinstance(task, str):
            raise LeRobotFormatError(f"task must be a string, got {task!r}")
        frame_tasks = [t if t is not None else task for t in self._frame_tasks]
        if any(t is None for t in frame_tasks):
            raise LeRobotFormatError(
                "frames without a task: pass task= to add_frame or save_episode"
            )
        index = self._num_episodes
        new_tasks = [t for t in dict.fromkeys(frame_tasks) if t not in self._task_ids]
        for t in new_tasks:
            self._task_ids[t] = len(self.tasks)
            self.tasks.append(t)
        try:
            self._commit(index, n, frame_tasks, bool(new_tasks) or self._tasks_unsaved)
            self._tasks_unsaved = False
        except BaseException:
            for t in new_tasks:
                del self._task_ids[t]
                self.tasks.remove(t)
            self.clear_episode_buffer()
            raise
        self._reset_buffer()
        return index

    def _episode_columns(self, index: int, n: int, frame_tasks: list[str]) -> dict[str, np.ndarray]:
        frame_index = np.arange(n, dtype=np.int64)
        columns: dict[str, Any] = {}
        for name, feature in self.features.items():
            if feature.is_camera:
                continue
            if feature.dtype == "string":
                columns[name] = self._buffer[name]
            else:
                columns[name] = np.concatenate(self._buffer[name]).reshape(n, *feature.value_shape)
        columns["timestamp"] = (frame_index / self.fps).astype(np.float32)
        columns["frame_index"] = frame_index
        columns["episode_index"] = np.full(n, index, dtype=np.int64)
        columns["index"] = np.arange(self._num_frames, self._num_frames + n, dtype=np.int64)
        columns["task_index"] = np.array([self._task_ids[t] for t in frame_tasks], dtype=np.int64)
        return columns

    def _data_table(self, columns: dict[str, Any]):
        images = {n: self._buffer[n] for n, f in self.features.items() if f.dtype == "image"}
        return data_table(self.features, columns, images)

    def _stats(self, columns: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
        stats = {}
        for name, feature in {**self.features, **DEFAULT_FEATURES}.items():
            if feature.is_camera:
                stats[name] = self._image_stats[name].result()
            elif feature.dtype != "string":
                stats[name] = numeric_stats(columns[name])
        return stats

    def _commit(self, index: int, n: int, frame_tasks: list[str], tasks_changed: bool) -> None:
        """Save one episode into files of its own; the episodes table is the commit point.

        Nothing here reads or rewrites earlier episodes, so a save costs the same however
        many came before: the stats are aggregated incrementally and the session's
        one-episode files are merged once, at close (:mod:`torchstore.lerobot.compaction`).
        """
        columns = self._episode_columns(index, n, frame_tasks)
        for name, feature in self.features.items():
            if feature.is_video and self._image_stats[name].count != n:
                raise LeRobotFormatError(
                    f"camera {name!r} got {self._image_stats[name].count} frames, "
                    f"the episode has {n}"
                )
        # everything that can fail on the episode's content happens before any rename
        stats = self._stats(columns)
        running = self._running.plus(stats)
        table = self._data_table(columns)
        if self._bulk:  # a NaN fails at close(), where stats.json refuses it
            self._buffer_episode(index, n, frame_tasks, table, stats)
            self._running = running
            return
        stats_json = stats_to_json(running.result())
        staged: list[Path] = []  # the cameras' MP4s, then the data file, then the table
        try:
            videos = self._stage_videos(n, staged)
            episode = EpisodeRow(
                index,
                n,
                list(dict.fromkeys(frame_tasks)),
                self._data_pos,
                self._num_frames,
                stats,
                {key: (pos, start, end) for key, (_, _, pos, start, end) in videos.items()},
            )
            row = episodes_table([episode], self._meta_pos)
            data_file = self._stage(data_path(*self._data_pos), [table], self._dictionary, staged)
            meta_file = self._stage(episodes_path(*self._meta_pos), row, True, staged)
            if self._durable:
                for tmp in staged:
                    with open(tmp, "rb+") as f:
                        os.fsync(f.fileno())
            with writer_lock(self.root):
                if tasks_changed:
                    self._write_tasks()
                for tmp, target, *_ in videos.values():
                    os.replace(tmp, target)
                os.replace(staged[-2], data_file)
                os.replace(staged[-1], meta_file)  # the commit point
                self._sync_dirs(data_file, meta_file, *(v[1] for v in videos.values()))
                self._write_info(index + 1, self._num_frames + n)
                write_json_atomically(self.root / STATS, stats_json, durable=self._durable)
        finally:
            for tmp in staged:
                tmp.unlink(missing_ok=True)
            for cam in self._cameras.values():
                if cam.scratch is not None:
                    cam.scratch.unlink(missing_ok=True)
                cam.encoder, cam.scratch = None, None
        self._committed(SavedEpisode(index, self._data_pos, self._meta_pos, {}, row), n, videos)
        self._running = running

    def _stage(self, rel: str, tables, dictionary, staged: list[Path]) -> Path:
        """Write ``tables`` under a temporary name beside ``root / rel`` (added to ``staged``);
        returns the final path."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
        staged.append(tmp)
        write_tables(tmp, tables, use_dictionary=dictionary)
        return target

    def _committed(self, saved: SavedEpisode, n: int, videos: Mapping[str, tuple]) -> None:
        """Advance the in-memory state past a committed episode: its files are taken."""
        for key, (_, _, pos, _, _) in videos.items():
            cam = self._cameras[key]
            cam.chunk, cam.file = next_file(*pos, self._chunks)
            saved.videos[key] = pos
        self._data_pos = next_file(*saved.data, self._chunks)
        self._meta_pos = next_file(*saved.meta, self._chunks)
        self._session.append(saved)
        self._num_episodes, self._num_frames = saved.index + 1, self._num_frames + n

    def _sync_dirs(self, *files: Path) -> None:
        if not self._durable:
            return
        for folder in {f.parent for f in files}:
            fsync_folder(folder)

    def _write_tasks(self) -> None:
        pa = require_pyarrow()
        table = pa.table(
            {
                "task_index": pa.array(range(len(self.tasks)), pa.int64()),
                "task": pa.array(self.tasks, pa.string()),
            }
        )
        pandas_meta = (
            '{"index_columns": ["task"], "column_indexes": [], "columns": ['
            '{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", '
            '"numpy_type": "int64", "metadata": null}, '
            '{"name": "task", "field_name": "task", "pandas_type": "unicode", '
            '"numpy_type": "object", "metadata": null}], '
            '"creator": {"library": "torchstore"}, "pandas_version": "2.0.0"}'
        )
        table = table.replace_schema_metadata({b"pandas": pandas_meta.encode()})
        write_table_atomically(self.root / TASKS, table, durable=self._durable)

    def _write_info(self, episodes: int, frames: int | None) -> None:
        if frames is not None:
            self.info["total_episodes"] = episodes
            self.info["total_frames"] = frames
            self.info["total_tasks"] = len(self.tasks)
            self.info["splits"] = {"train": f"0:{episodes}"}
        write_json_atomically(self.root / INFO, self.info, durable=self._durable)

    # ----------------------------------------------------------------- rejection
    def reject_episode(self, index: int, reason: str) -> None:
        """Mark a saved episode rejected (``meta/rejected_episodes.json``); its data stays."""
        self._check_open()
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < self._num_episodes
        ):
            raise EpisodeError(f"episode {index!r} does not exist ({self._num_episodes} saved)")
        if not isinstance(reason, str) or not reason.strip():
            raise LeRobotFormatError("reject_episode needs a non-empty reason")
        with writer_lock(self.root):
            rejected = read_rejected(self.root)
            rejected[index] = RejectedEpisode(index, reason, now_iso())
            write_rejected(self.root, rejected)

    # ----------------------------------------------------------------- lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeError(f"the writer of {self.root} is closed")

    def close(self) -> None:
        """Discard an unsaved episode, merge this session's files, release the folder.

        Everything saved is already on disk; the merge only makes fewer, larger files (a
        kill during it loses nothing, and ``resume`` tidies up).
        """
        if self._closed:
            return
        self._reset_buffer()
        self._closed = True
        try:
            if self._bulk:
                self._finish_bulk()
            else:
                self._compact()
        finally:
            self._release()

    def _compact(self) -> None:
        """Merge this session's one-episode files (see :mod:`torchstore.lerobot.compaction`)."""
        session, self._session = self._session, []
        compact_session(
            self.root,
            session,
            cameras=list(self._cameras),
            data_cap=self._data_cap,
            video_cap=self._video_cap,
            durable=self._durable,
            use_dictionary=self._dictionary,
            split_streams=[key for key, cam in self._cameras.items() if cam.copied],
        )

    def _release(self) -> None:
        try:
            remove_lock_files(self.root, LOCK_NAME)
        finally:
            (self.root / SESSION_LOCK).unlink(missing_ok=True)  # while still holding it
            os.close(self._session_fd)
            remove_lock_files(self.root)  # the scratch folder, now empty

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LeRobotWriter({str(self.root)!r}, {self._num_episodes} episodes, "
            f"{self._num_frames} frames, {CODEBASE_VERSION})"
        )
