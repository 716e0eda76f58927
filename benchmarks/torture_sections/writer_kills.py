"""Writer kills: SIGKILL at a random moment, inside a commit, or inside ``resume()``."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import struct
import sys
import time
from collections import Counter
from pathlib import Path

from torchstore.data import TrajectoryStoreWriter
from torture_sections.kit import (
    COLUMNS,
    check_committed,
    episode_rows,
    run_writer_child,
    short,
)

_TRAPS_COMMIT = [
    ("torchstore.io.hdf5.checksummed", "ChecksummedDataset", "seal"),
    ("h5py", "File", "flush"),
    ("torchstore.data.file.layout", "StoreDatasets", "write_commit"),
    ("torchstore.io.hdf5.checksummed", "ChecksummedDataset", "write_staged"),
]
_TRAPS_RESUME = [
    ("torchstore.io.hdf5.files", None, "_recover_after_kill"),
    ("torchstore.io.hdf5.files", None, "_open_swmr_writer"),
    ("torchstore.io.hdf5.checksummed", "ChecksummedDataset", "start_writing"),
    ("h5py", "File", "flush"),
]


def _arm(trap: tuple[str, str | None, str], when: str, nth: int) -> None:
    """Make the ``nth`` call of a function SIGKILL this process before or after it runs."""
    module = sys.modules.get(trap[0]) or __import__(trap[0], fromlist=["_"])
    owner = getattr(module, trap[1]) if trap[1] else module
    original = getattr(owner, trap[2])
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if calls[0] == nth and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, trap[2], wrapper)


def _writer_child(path: Path, first: int, progress_w: int, trap) -> None:
    """Resume ``path`` and commit episodes from ``first`` on, reporting each commit."""

    def body() -> None:
        if trap is not None and trap[0] == "resume":
            _arm(*trap[1:])
        os.write(progress_w, struct.pack("<q", -1))  # started
        with TrajectoryStoreWriter.resume(path) as w:
            if trap is not None and trap[0] == "commit":
                _arm(*trap[1:])
            for i in range(first, first + 400):
                w.add_episode(episode_rows(i), metadata={"i": i})
                os.write(progress_w, struct.pack("<q", i + 1))

    run_writer_child(progress_w, body)


def _fresh_kill_store(path: Path) -> int:
    """A store of 5 committed episodes at ``path``; returns 5."""
    path.unlink(missing_ok=True)
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i in range(5):
            w.add_episode(episode_rows(i), metadata={"i": i})
    return 5


def _kill_trap(kind: str, rng: random.Random) -> tuple | None:
    """Where the writer child kills itself: None for a kill from outside at a random time."""
    if kind == "inside commit":
        where = rng.choice(_TRAPS_COMMIT)
        return ("commit", where, rng.choice(["before", "after"]), rng.randrange(1, 40))
    if kind == "inside resume":
        where = rng.choice(_TRAPS_RESUME)
        return ("resume", where, rng.choice(["before", "after"]), rng.randrange(1, 4))
    return None


class _ChildReport:
    """What a writer child said through its pipe: started, its error kind, rows committed."""

    def __init__(self, committed: int):
        self.started: float | None = None
        self.writer_error: str | None = None
        self.committed = committed
        self._buf = b""

    def read(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            self._buf += os.read(fd, 4096)
        while len(self._buf) >= 8:
            (value,) = struct.unpack("<q", self._buf[:8])
            self._buf = self._buf[8:]
            if value == -1:
                self.started = time.monotonic()
            elif value in (-2, -3):
                self.writer_error = "torchstore" if value == -2 else "raw"
            else:
                self.committed = max(self.committed, value)


def _watch_writer(pid: int, fd: int, report: _ChildReport, kill_at: float | None):
    """Follow the child until it exits (its wait status), killing it ``kill_at`` s after it
    started; ``"hang"`` when it runs past a minute."""
    deadline = time.monotonic() + 60
    while True:
        report.read(fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        now = time.monotonic()
        if kill_at is not None and report.started is not None and now - report.started >= kill_at:
            os.kill(pid, signal.SIGKILL)
            kill_at = None
        if now > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang"
        time.sleep(0.0005)


_OUTCOME_LABELS = {"torchstore": "unopenable", "hang": "hang"}


def _kill_label(outcome: str, value: object, writer_error: str | None) -> str:
    """intact / lost / unopenable / raw / hang, from the reopen check and the writer's error."""
    if outcome == "ok":
        label = "intact" if str(value).startswith("intact") else "lost"
    else:
        label = _OUTCOME_LABELS.get(outcome, "raw")
    if writer_error == "raw":
        return "raw"
    if writer_error == "torchstore" and label == "intact":
        return "unopenable"  # resume refused a store it should have recovered
    return label


def _kill_one(path: Path, committed: int, kind: str, trap, rng: random.Random):
    """Run one writer child and kill it; returns (wait status or "hang", its report)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _writer_child(path, committed, w, trap)
    os.close(w)
    os.set_blocking(r, False)
    report = _ChildReport(committed)
    kill_at = rng.uniform(0.0, 0.4) if kind == "random" else None
    status = _watch_writer(pid, r, report, kill_at)
    report.read(r)
    os.close(r)
    return status, report


def writer_kills(workdir: Path, trials: int, rng: random.Random) -> dict[str, Counter]:
    path = workdir / "kills.h5"
    committed = _fresh_kill_store(path)
    kinds = ("random", "inside commit", "inside resume")
    results: dict[str, Counter] = {k: Counter() for k in kinds}
    notes: list[str] = []
    for trial in range(trials):
        kind = kinds[trial % 3]
        trap = _kill_trap(kind, rng)
        status, report = _kill_one(path, committed, kind, trap, rng)
        committed = report.committed
        if status == "hang":
            results[kind]["hang"] += 1
            notes.append(f"{kind} {trap}: the writer hung")
            continue
        outcome, value = check_committed(path, committed)
        if outcome == "ok" and str(value).startswith("intact"):
            committed = max(committed, int(str(value).split()[1]))
        label = _kill_label(outcome, value, report.writer_error)
        results[kind][label] += 1
        if label != "intact":
            notes.append(f"{kind} {trap}: {label}: {short(value)} (writer: {report.writer_error})")
        if label in ("unopenable", "raw", "lost"):
            # start over, so one bad file does not count many times
            committed = _fresh_kill_store(path)
    results["_notes"] = notes  # type: ignore[assignment]
    return results
