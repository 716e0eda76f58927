"""``meta/info.json``: read it with checks, build a new one, write it atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchstore.errors import LeRobotFormatError
from torchstore.io.records.parquet import replace_atomically
from torchstore.lerobot.features import DEFAULT_FEATURES, Feature, features_to_json, parse_features
from torchstore.lerobot.layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_DATA_FILES_SIZE_MB,
    DEFAULT_VIDEO_FILES_SIZE_MB,
    INFO,
    VIDEO_PATH,
)
from torchstore.validation import non_negative_int, positive_number

__all__ = [
    "read_info",
    "read_json",
    "new_info",
    "write_json_atomically",
    "codebase_major_minor",
    "info_features",
    "video_feature_info",
]


def codebase_major_minor(version: Any, *, source: str) -> tuple[int, int]:
    """``"v3.0"`` as ``(3, 0)``; anything else is a format error."""
    if not isinstance(version, str) or not version.startswith("v"):
        raise LeRobotFormatError(f"{source}: codebase_version {version!r} is not like 'v3.0'")
    try:
        major, minor = (int(p) for p in version[1:].split(".")[:2])
    except ValueError:
        raise LeRobotFormatError(
            f"{source}: codebase_version {version!r} is not like 'v3.0'"
        ) from None
    return major, minor


_MISSING = object()


def read_json(path: Path, *, missing: Any = _MISSING, why_needed: str = "") -> Any:
    """Parsed JSON from ``path``; ``missing`` if the file is absent (else an error)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing is not _MISSING:
            return missing
        raise LeRobotFormatError(f"{path} is missing{why_needed}") from None
    except UnicodeDecodeError as exc:
        raise LeRobotFormatError(f"{path} is not UTF-8 text ({exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise LeRobotFormatError(f"{path} is not valid JSON ({exc})") from None


def read_info(root: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``meta/info.json`` of a LeRobot folder, with the keys every reader needs
    checked."""
    path = Path(root) / INFO
    info = read_json(path, why_needed=f": {root} is not a LeRobot dataset")
    if not isinstance(info, dict):
        raise LeRobotFormatError(f"{path} must hold a JSON object, got {type(info).__name__}")
    for key in ("codebase_version", "fps", "features"):
        if key not in info:
            raise LeRobotFormatError(f"{path} has no {key!r} key")
    major, _ = codebase_major_minor(info["codebase_version"], source=str(path))
    if major not in (2, 3):
        raise LeRobotFormatError(
            f"{path}: codebase_version {info['codebase_version']!r} is not supported "
            "(torchstore reads LeRobot v2.0, v2.1 and v3.x)"
        )
    fps = info["fps"]
    positive_number(f"{path}: fps", fps, error=LeRobotFormatError)
    if fps != int(fps):
        raise LeRobotFormatError(
            f"{path}: fps {fps!r} is not a whole number (LeRobot stores an int; "
            "video frames are located on the 1/fps grid)"
        )
    info["fps"] = int(fps)  # v2.1 files may say 30.0
    parse_features(info["features"], source=str(path))
    for key in ("total_episodes", "total_frames"):
        non_negative_int(f"{path}: {key}", info.get(key), allow_none=True, error=LeRobotFormatError)
    return info


def info_features(info: Mapping[str, Any], *, source: str = "info.json") -> dict[str, Feature]:
    return parse_features(info["features"], source=source)


def new_info(
    *,
    fps: int,
    features: Mapping[str, Feature],
    robot_type: str | None,
    chunks_size: int = DEFAULT_CHUNKS_SIZE,
    data_files_size_in_mb: int = DEFAULT_DATA_FILES_SIZE_MB,
    video_files_size_in_mb: int = DEFAULT_VIDEO_FILES_SIZE_MB,
) -> dict[str, Any]:
    """A v3.0 info.json for an empty dataset: user features then the five default ones."""
    all_features = {**features, **DEFAULT_FEATURES}
    has_video = any(f.is_video for f in features.values())
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": 0,
        "total_frames": 0,
        "total_tasks": 0,
        "chunks_size": chunks_size,
        "data_files_size_in_mb": data_files_size_in_mb,
        "video_files_size_in_mb": video_files_size_in_mb,
        "fps": fps,
        "splits": {},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if has_video else None,
        "features": features_to_json(all_features),
    }


def write_json_atomically(path: str | os.PathLike, data: Any, *, durable: bool = False) -> None:
    """Write JSON (4-space indent, non-ASCII kept, like LeRobot) by write-then-rename."""
    text = json.dumps(data, indent=4, ensure_ascii=False, allow_nan=False) + "\n"
    replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), durable=durable)


def video_feature_info(probed: Any, *, encoder: Any = None) -> dict[str, Any]:
    """A video feature's ``features[key]["info"]`` in info.json, as LeRobot writes it (spec
    section 3), from the stream facts of its first file (a
    :class:`~torchstore.io.frames.video.VideoInfo`) and, when given, the
    :class:`~torchstore.io.frames.video.EncoderSettings` that encoded it."""
    info: dict[str, Any] = {
        "video.height": probed.height,
        "video.width": probed.width,
        "video.codec": probed.codec,
        "video.pix_fmt": probed.pix_fmt,
        "video.fps": round(probed.fps),
        "video.channels": probed.channels,
        "has_audio": probed.has_audio,
    }
    if encoder is not None:
        info |= {
            "video.g": encoder.g,
            "video.crf": encoder.crf,
            "video.preset": encoder.preset,
            "video.fast_decode": encoder.fast_decode,
            "video.video_backend": "pyav",
            "video.extra_options": {},
            "is_depth_map": False,
        }
    return info
