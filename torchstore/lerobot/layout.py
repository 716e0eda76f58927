"""Where things live in a LeRobot dataset folder, and the writer's lock on it.

Paths follow shared/specs/lerobot-v3.md section 1 (v3.0) and section 13 (v2.1). Every
file the writer replaces is written under a temporary name and renamed into place, so
a consistent snapshot of the folder is a set of hard links taken while holding
:func:`writer_lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CODEBASE_VERSION",
    "DATA_PATH",
    "VIDEO_PATH",
    "EPISODES_PATH",
    "V21_DATA_PATH",
    "V21_VIDEO_PATH",
    "INFO",
    "STATS",
    "TASKS",
    "REJECTED",
    "SCRATCH_DIR",
    "LOCK_NAME",
    "DEFAULT_CHUNKS_SIZE",
    "DEFAULT_DATA_FILES_SIZE_MB",
    "DEFAULT_VIDEO_FILES_SIZE_MB",
    "data_path",
    "video_path",
    "episodes_path",
    "next_file",
    "writer_lock",
    "is_scratch",
]

CODEBASE_VERSION = "v3.0"

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

INFO = "meta/info.json"
STATS = "meta/stats.json"
TASKS = "meta/tasks.parquet"
REJECTED = "meta/rejected_episodes.json"

# The writer's scratch space (spec section 1: never part of the dataset, never uploaded).
SCRATCH_DIR = "images"
LOCK_NAME = f"{SCRATCH_DIR}/.torchstore-writer.lock"

DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_DATA_FILES_SIZE_MB = 100
DEFAULT_VIDEO_FILES_SIZE_MB = 200


def data_path(chunk: int, file: int) -> str:
    return DATA_PATH.format(chunk_index=chunk, file_index=file)


def video_path(video_key: str, chunk: int, file: int) -> str:
    return VIDEO_PATH.format(video_key=video_key, chunk_index=chunk, file_index=file)


def episodes_path(chunk: int, file: int) -> str:
    return EPISODES_PATH.format(chunk_index=chunk, file_index=file)


def next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after ``(chunk, file)``: file+1, or the next chunk's file 0."""
    if file + 1 >= chunks_size:
        return chunk + 1, 0
    return chunk, file + 1


def is_scratch(relpath: str) -> bool:
    """True for writer scratch and temporary files, which are never data."""
    parts = relpath.replace(os.sep, "/").split("/")
    return parts[0] == SCRATCH_DIR or any(p.startswith(".") for p in parts)


@contextlib.contextmanager
def writer_lock(root: str | os.PathLike, *, shared: bool = False) -> Iterator[None]:
    """Hold the folder's writer lock (``flock``) for the duration of the block.

    The writer holds it exclusively while it replaces files at the end of an episode;
    :func:`push_to_hub` takes it while it links a snapshot, so an upload never mixes
    two states of the folder. The lock lives in the scratch folder, which no reader
    or upload looks at. A folder that cannot hold the lock file (read-only) is
    treated as having no writer.
    """
    lock = Path(root) / LOCK_NAME
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if not shared:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
