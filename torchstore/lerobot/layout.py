"""Where things live in a LeRobot dataset folder, and the writer's lock on it.

Paths follow LeRobot's v3.0 layout (and v2.1's, which is read too). Every
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
    "lock_file",
    "remove_lock_files",
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


def lock_file(path: str | os.PathLike, *, shared: bool = False, blocking: bool = True) -> int:
    """Open ``path`` (created if needed) and ``flock`` it; returns the descriptor.

    Lock files are removed when their holder is done (:func:`remove_lock_files`), so a
    process that opened the file just before it was unlinked may lock a dead inode; the
    lock is only taken once the locked descriptor is still the file at ``path``.
    Raises BlockingIOError when ``blocking`` is false and another holder has it.
    """
    path = Path(path)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the empty scratch folder was just removed: again
            continue
        try:
            fcntl.flock(fd, mode)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # unlinked by its last holder while we waited: lock the new file


def remove_lock_files(root: str | os.PathLike, *names: str) -> None:
    """Delete the writer's lock files (each while holding it) and the scratch folder if empty."""
    root = Path(root)
    for name in names:
        try:
            fd = lock_file(root / name)
        except OSError:
            continue
        try:
            (root / name).unlink(missing_ok=True)
        finally:
            os.close(fd)
    scratch = root / SCRATCH_DIR
    if scratch.is_dir():
        for folder in sorted(scratch.rglob("*"), reverse=True):
            if folder.is_dir():
                with contextlib.suppress(OSError):
                    folder.rmdir()
        with contextlib.suppress(OSError):
            scratch.rmdir()


@contextlib.contextmanager
def writer_lock(root: str | os.PathLike, *, shared: bool = False) -> Iterator[None]:
    """Hold the folder's writer lock (``flock``) for the duration of the block.

    The writer holds it exclusively while it replaces files at the end of an episode;
    :func:`push_to_hub` takes it while it links a snapshot, so an upload never mixes
    two states of the folder. The lock lives in the scratch folder, which no reader
    or upload looks at. A folder that cannot hold the lock file (read-only) is
    treated as having no writer.
    """
    try:
        fd = lock_file(Path(root) / LOCK_NAME, shared=shared)
    except OSError:
        if not shared:
            raise
        yield
        return
    try:
        yield
    finally:
        os.close(fd)
