"""A full disk inside HDF5's own write: the room check passed, then the write is refused.

Each trial forks a writer that resumes one store, skips the writer's room check (another
process took the space in between) and sets a file-size limit (``RLIMIT_FSIZE``, SIGXFSZ
ignored, so writes past it fail with EFBIG) at a random size inside the next episodes.
(A store's close rewrites two blocks in place and allocates nothing, so a full disk
cannot refuse it.) The writer must raise a ``StorageFullError``, ``close`` must work,
and the store must reopen with every committed episode; then, with room back, resume
(in the same process half of the time) and commit once more. Outcomes:
clean error, commits intact / the same but HDF5 kept the file in the writer's process, so
reopening it there is refused with a clear error / lost / unopenable / resume fails / raw /
crash / hang.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import struct
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

from torchstore.data import TrajectoryStoreWriter
from torchstore.errors import StorageFullError
from torture_sections.kit import check_committed, episode_rows, forked, short, wait_or_kill
from torture_sections.writer_kills import _fresh_kill_store

GOOD_OUTCOME = "clean error, commits intact"
#: HDF5 could not let go of the refused file in the writer's process: reopening it there is
#: refused with a StorageFullError (other processes open and resume it).
HELD_HERE = "same, reopen here refused"
OUTCOMES = [GOOD_OUTCOME, HELD_HERE, "lost", "unopenable", "resume fails", "raw", "crash", "hang"]
GOOD = {GOOD_OUTCOME, HELD_HERE}
_DEADLINE_S = 60.0
_LIMIT_SPAN = 96 * 1024  # limits fall up to this far past the file's size (several pages)
_RESTART_SIZE = 8 * 1024 * 1024  # a store this large is replaced by a fresh one


def _limit_at(path: Path, extra: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    limit = os.path.getsize(path) + extra
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def _fill(w: TrajectoryStoreWriter, rng: random.Random, fd: int) -> None:
    """Commit episodes (one at a time, in bulk, or appended in pieces) until the disk refuses."""
    for _ in range(5000):
        i = w.num_episodes
        way = rng.random()
        if way < 0.6:
            w.add_episode(episode_rows(i), metadata={"i": i})
        elif way < 0.8:
            rows = [episode_rows(i + k) for k in range(3)]
            w.add_episodes(
                {c: np.concatenate([r[c] for r in rows]) for c in rows[0]},
                [len(r["obs"]) for r in rows],
                [{"i": i + k} for k in range(3)],
            )
        else:
            rows = episode_rows(i)
            cut = len(rows["obs"]) // 2
            if cut:
                w.append({c: v[:cut] for c, v in rows.items()})
            w.append({c: v[cut:] for c, v in rows.items()})
            w.end_episode({"i": i})
        os.write(fd, struct.pack("<q", w.num_episodes))
    raise AssertionError("the file-size limit was never met")


def _child(path: Path, fd: int, seed: int) -> None:
    """The writer: meet the limit, close, then (room back) resume here or leave it."""
    rng = random.Random(seed)
    code = 0
    try:
        TrajectoryStoreWriter._check_room = lambda self, nbytes: None  # the race
        w = TrajectoryStoreWriter.resume(path)
        try:
            _limit_at(path, rng.randrange(0, _LIMIT_SPAN))
            _fill(w, rng, fd)
        except StorageFullError:
            os.write(fd, struct.pack("<q", -2))  # a clean error
        try:
            w.close()
        except StorageFullError:
            os.write(fd, struct.pack("<q", -2))
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        if rng.random() < 0.5:  # room is back: this process goes on with the store
            try:
                with TrajectoryStoreWriter.resume(path) as again:
                    i = again.num_episodes
                    again.add_episode(episode_rows(i), metadata={"i": i})
                    os.write(fd, struct.pack("<q", again.num_episodes))
            except StorageFullError as exc:
                if "cannot let go of it" not in str(exc):
                    raise
                os.write(fd, struct.pack("<q", -4))
    except BaseException:
        os.write(fd, struct.pack("<q", -3))
        traceback.print_exc()
        code = 3
    os._exit(code)


def _run_child(path: Path, seed: int, committed: int) -> tuple[object, int, set[int]]:
    """(wait status or "hang", the most episodes the child reported committed, its markers)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(path, w, seed)
    os.close(w)
    status = wait_or_kill(pid, time.monotonic() + _DEADLINE_S)
    if status is None:
        status = "hang"
    buf = b""
    while chunk := os.read(r, 65536):  # the child is gone: its writes are all there
        buf += chunk
    os.close(r)
    marks: set[int] = set()
    for k in range(0, len(buf) - len(buf) % 8, 8):
        (value,) = struct.unpack("<q", buf[k : k + 8])
        if value < 0:
            marks.add(value)
        else:
            committed = max(committed, value)
    return status, committed, marks


def _resume_and_commit(path: str) -> int:
    with TrajectoryStoreWriter.resume(path) as w:
        i = w.num_episodes
        w.add_episode(episode_rows(i), metadata={"i": i})
        return w.num_episodes


def _trial(path: Path, committed: int, rng: random.Random) -> tuple[str, int, str]:
    status, committed, marks = _run_child(path, rng.randrange(2**32), committed)
    if status == "hang":
        return "hang", committed, "the writer hung"
    if os.WIFSIGNALED(status):
        return "crash", committed, signal.Signals(os.WTERMSIG(status)).name
    if -3 in marks:
        return "raw", committed, "the writer raised an exception that is not a StorageFullError"
    if -2 not in marks:
        return "raw", committed, "the disk refused a write and the writer said nothing"
    outcome, value = check_committed(path, committed)
    if outcome != "ok":
        return ("hang" if outcome == "hang" else "unopenable"), committed, str(value)
    if not str(value).startswith("intact"):
        return "lost", committed, str(value)
    committed = int(str(value).split()[1])
    outcome, value = forked(lambda: _resume_and_commit(str(path)), timeout=_DEADLINE_S)
    if outcome != "ok":
        return "resume fails", committed, f"{outcome}: {value}"
    committed = int(value)
    outcome, value = check_committed(path, committed)
    if outcome != "ok" or not str(value).startswith("intact"):
        return "resume fails", committed, f"after resume: {outcome}: {value}"
    return (HELD_HERE if -4 in marks else GOOD_OUTCOME), int(str(value).split()[1]), ""


def run_section(workdir: Path, trials: int, rng: random.Random) -> tuple[Counter, list[str]]:
    """``trials`` refused writes on one store; the outcome of each and notes off target."""
    path = workdir / "disk_full.h5"
    committed = _fresh_kill_store(path)
    counts: Counter = Counter()
    notes: list[str] = []
    for _ in range(trials):
        sys.stdout.flush()  # a forked child must not repeat buffered output
        label, committed, text = _trial(path, committed, rng)
        counts[label] += 1
        if label not in GOOD:
            notes.append(f"disk full: {label}: {short(text)}")
        if label not in GOOD or path.stat().st_size > _RESTART_SIZE:
            committed = _fresh_kill_store(path)
    return counts, notes
