"""``export_lerobot``: a trajectory store to a LeRobot v3.0 folder.

A store imported from LeRobot keeps the original feature specs, fps, robot type and task
table in its metadata, so it exports back to the same features. Any other store maps
its columns: ``uint8 [H, W, 3]`` columns become cameras (``video`` by default, or
``image``), every other column a numeric feature (``/`` in a nested name becomes ``.``,
as LeRobot forbids ``/``). The folder is written under a temporary name and renamed into
place when complete.

A camera the store keeps as AV1 or H.264 packets (an import of LeRobot MP4s, or a column
encoded by the store's writer) is written back without re-encoding: each episode's stored
packets muxed into the MP4 as they are, episodes back to back in files as LeRobot lays
them out, and info.json describing the stream as stored (codec, pix_fmt, fps, and the
encoder settings where known). That holds when the codec asked for is the stored one
(``video_encoder`` left out, or naming that codec with the same pix_fmt; the stored GOP
and quality stay); any other is decoded and re-encoded.

What LeRobot's format cannot say about the store (column names with their nesting,
dtypes, quantisation, env id, seed, the manifest's metadata, each episode's metadata)
goes into ``meta/torchstore.json`` (:mod:`torchstore.lerobot.sidecar`), a file LeRobot
does not read; :func:`~torchstore.lerobot.import_lerobot` restores the store from it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.features import DEFAULT_FEATURES

__all__ = ["export_lerobot", "ExportSummary", "features_for_store"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExportSummary:
    path: Path
    episodes: int
    frames: int
    seconds: float

    def __str__(self) -> str:
        rate = self.frames / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"exported {self.episodes} episodes, {self.frames} frames to {self.path} "
            f"in {self.seconds:.1f} s ({rate:,.0f} frames/s)"
        )


def _is_camera(spec) -> bool:
    return (
        spec.dtype == torch.uint8
        and len(spec.shape) == 3
        and spec.shape[-1] == 3
        and spec.quantize is None
    )


def features_for_store(
    store, *, columns: Sequence[str] | None = None, cameras: str | None = None
) -> dict[str, tuple[str, dict]]:
    """``{store column: (feature name, feature spec)}`` for an export of ``store``.

    ``cameras``: ``"video"`` or ``"image"`` for every camera, or None (imported cameras
    as they were, the others as video).
    """
    if cameras not in (None, "video", "image"):
        raise ValueError(f"cameras must be 'video' or 'image', got {cameras!r}")
    lerobot = store.manifest.metadata.get("lerobot") or {}
    known = lerobot.get("features") or {}
    out: dict[str, tuple[str, dict]] = {}
    for spec in store.select_columns(columns):
        if spec.name in DEFAULT_FEATURES:
            if not lerobot:
                raise LeRobotFormatError(
                    f"column {spec.name!r} has the name of a LeRobot default feature, which the "
                    "export fills in itself; leave it out with columns=[...] (--columns)"
                )
            continue
        if spec.name in known and known[spec.name].get("dtype") == "language":
            log.warning(
                "column %r holds LeRobot language annotations, which are not exported", spec.name
            )
            continue
        info = known.get(spec.name, {}).get("info") or {}
        if info.get("is_depth_map") or info.get("video.is_depth_map"):
            log.warning("column %r holds a LeRobot depth map, which is not exported", spec.name)
            continue
        if spec.name in known:
            feature = {k: v for k, v in known[spec.name].items() if k != "info"}
            if cameras is not None and feature.get("dtype") in ("video", "image"):
                feature["dtype"] = cameras
            out[spec.name] = (spec.name, feature)
            continue
        name = spec.name.replace("/", ".")
        if _is_camera(spec):
            h, w, c = spec.shape
            feature = {
                "dtype": cameras or "video",
                "shape": [h, w, c],
                "names": ["height", "width", "channels"],
            }
        else:
            feature = {
                "dtype": str(spec.dtype).removeprefix("torch."),
                "shape": list(spec.shape) or [1],
                "names": None,
            }
        out[spec.name] = (name, feature)
    names = [n for n, _ in out.values()]
    if len(set(names)) != len(names):
        raise LeRobotFormatError(
            f"store columns map to clashing LeRobot feature names: {sorted(names)}"
        )
    if not out:
        raise LeRobotFormatError("no columns to export")
    return out


def export_lerobot(
    store,
    root: str | os.PathLike,
    *,
    fps: int | None = None,
    task: str | None = None,
    robot_type: str | None = None,
    columns: Sequence[str] | None = None,
    cameras: str | None = None,
    video_encoder=None,
    overwrite: bool = False,
    progress: bool = True,
    **caps: Any,
) -> ExportSummary:
    """Write the episodes of ``store`` (a path or an open TrajectoryStore) as a LeRobot v3.0 folder.

    Args:
        fps: frames per second; default: the fps a LeRobot import recorded, else required.
        task: the task string of every frame; default: the imported task table (through
            the ``task_index`` column), else the store's ``env_id``, else ``"default"``.
        robot_type: default: the imported one.
        columns: store columns to export (default: all).
        cameras: ``"video"`` (MP4, AV1 unless ``video_encoder`` says otherwise) or ``"image"``
            (PNG in Parquet) for every camera (``uint8 [H, W, 3]`` columns, and cameras
            imported from LeRobot); default: imported cameras as they were, others video.
        video_encoder: an :class:`~torchstore.io.frames.video.EncoderSettings`, ``"av1"`` or
            ``"h264"``; default: a camera stored as AV1 / H.264 packets keeps them, the
            others are encoded with AV1 (LeRobot's settings).
        caps: ``chunks_size``, ``data_files_size_in_mb``, ``video_files_size_in_mb``.
    """
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.io.destination import check_destination
    from torchstore.lerobot.cameras import encoder_settings

    started = time.perf_counter()
    requested = None if video_encoder is None else encoder_settings(video_encoder)
    video_encoder = encoder_settings(video_encoder)  # a bad name fails before any file
    own = not hasattr(store, "episode")
    source = Path(store) if own else store.path
    root = check_destination(root, sources=[source], overwrite=overwrite, what="folder")
    store = TrajectoryStore(store) if own else store
    try:
        lerobot = store.manifest.metadata.get("lerobot") or {}
        fps = fps if fps is not None else lerobot.get("fps")
        if fps is None:
            raise LeRobotFormatError(
                f"{source} records no frame rate: pass fps= (on the command line, --fps)"
            )
        mapping = features_for_store(store, columns=columns, cameras=cameras)
        plan = _Plan(
            mapping=mapping,
            packets=_packet_cameras(store, mapping, requested, int(fps), lerobot),
            lerobot=lerobot,
            task=task or store.manifest.env_id or "default",
            use_task_index=bool(
                task is None
                and lerobot.get("tasks")
                and "task_index" in {c.name for c in store.columns}
            ),
        )
        writer_args = {
            "fps": int(fps),
            "robot_type": robot_type if robot_type is not None else lerobot.get("robot_type"),
            "video_encoder": video_encoder,
            **caps,
        }
        frames = _write_aside(store, root, plan, writer_args, progress)
        return ExportSummary(root, store.num_episodes, frames, time.perf_counter() - started)
    finally:
        if own:
            store.close()


def _packet_cameras(store, mapping: dict, requested, fps: int, lerobot: dict) -> list[str]:
    """The columns whose packets are exported as they are; each one's feature gets the
    info.json ``info`` of its stored stream."""
    from torchstore.lerobot.video_columns import keeps_packets, packet_camera_info

    known = lerobot.get("features") or {}
    kept = []
    for column, (_, feature) in mapping.items():
        spec = store.column(column)
        if keeps_packets(spec, feature, requested):
            imported = (known.get(column) or {}).get("info")
            feature["info"] = packet_camera_info(spec, fps, imported)
            kept.append(column)
    return kept


@dataclass
class _Plan:
    """What an export writes: ``mapping`` ``{column: (feature name, spec)}``, the imported
    LeRobot metadata, and where each frame's task comes from."""

    mapping: dict[str, tuple[str, dict]]
    packets: list[str]  # columns whose stored packets are written as they are
    lerobot: dict[str, Any]
    task: str  # every frame's, unless use_task_index
    use_task_index: bool  # tasks from the task_index column and the imported task table

    def episode_rows(self, i: int, td) -> tuple[dict[str, Any], Any]:
        """Episode ``i``'s ``{feature: rows}`` and its task (one, or one per frame)."""
        rows = {name: _leaf(td, column) for column, (name, _) in self.mapping.items()}
        for column, (name, spec) in self.mapping.items():
            if spec["dtype"] == "string":  # codes back to the imported strings
                table = (self.lerobot.get("string_tables") or {}).get(column)
                if table is None:
                    raise LeRobotFormatError(
                        f"column {column!r}: no string table to export it with"
                    )
                rows[name] = [table[int(c)] for c in rows[name]]
        if not self.use_task_index:
            return rows, self.task
        tasks_table = self.lerobot["tasks"]
        idx = td["task_index"].numpy()
        if idx.min() < 0 or idx.max() >= len(tasks_table):
            raise LeRobotFormatError(f"episode {i}: task_index outside the imported task table")
        return rows, [tasks_table[j] for j in idx]


def _write_aside(store, root: Path, plan: _Plan, writer_args: dict, progress: bool) -> int:
    """Write the folder under a temporary name beside ``root``, rename it into place when
    complete; returns the frames written."""
    from torchstore.lerobot.importer import _bar
    from torchstore.lerobot.sidecar import write_sidecar
    from torchstore.lerobot.writer import LeRobotWriter

    partial = root.with_name(f".{root.name}.exporting")
    if partial.exists():
        shutil.rmtree(partial)
    bar = _bar(store.num_rows, progress, f"export {root.name}")
    frames = 0
    features = {name: spec for name, spec in plan.mapping.values()}
    try:
        # checkpoints=False: written aside, renamed when complete
        with LeRobotWriter(partial, features=features, checkpoints=False, **writer_args) as writer:
            if plan.use_task_index:  # task_index values stay those of the store
                writer._preset_tasks(plan.lerobot["tasks"])
            read = list(plan.mapping) + (["task_index"] if plan.use_task_index else [])
            for i, td in _episodes(store, read):
                rows, episode_task = plan.episode_rows(i, td)
                packets = {plan.mapping[c][0]: store.encoded_episode(c, i) for c in plan.packets}
                writer.add_episode(rows, task=episode_task, packets=packets)
                frames += td.batch_size[0]
                if bar is not None:
                    bar.update(td.batch_size[0])
        mapped = {column: name for column, (name, _) in plan.mapping.items()}
        write_sidecar(partial, store, mapped)
        if root.exists():
            shutil.rmtree(root)
        os.replace(partial, root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return frames


# Rows read from the store per read: one read for many small episodes (a read per
# episode costs more than its rows), bounded for memory.
_SLAB_BYTES = 64 * 2**20


def _episodes(store, columns: list[str]):
    """``(index, rows)`` of every episode, read a slab of consecutive episodes at a time."""
    row_bytes = sum(
        int(np.prod(store.column(c).shape, dtype=np.int64)) * store.column(c).dtype.itemsize
        for c in columns
    )
    budget = max(1, _SLAB_BYTES // max(row_bytes, 1))
    n = store.num_episodes
    bounds = [store.episodes.range(e) for e in range(n)]
    i = 0
    while i < n:
        first, stop = bounds[i]
        j = i + 1
        while j < n and bounds[j][1] - first <= budget:
            stop = bounds[j][1]
            j += 1
        slab = store.read_slab(first, stop, columns)
        for e in range(i, j):
            a, b = bounds[e]
            yield e, slab[a - first : b - first]
        i = j


def _leaf(td, column: str) -> np.ndarray:
    key: Any = tuple(column.split("/")) if "/" in column else column
    return td.get(key).numpy()
