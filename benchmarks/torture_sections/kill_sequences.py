"""Kill sequences: 2-4 SIGKILLs in a row on one store, then one check.

A single kill is followed by a clean resume in the writer-kills section; here the resume
that recovers a killed writer's file is itself killed, and the next one, and so on: at a
random moment, at a trap inside ``resume()`` or a commit, at a random moment inside
``close`` or inside the recovery of the previous kill. Only after the whole sequence is the
store checked: every committed episode intact and the file opened by a fresh reader. The
sequences run one after another on the same store (its history grows), and a store that
fails its check is replaced by a fresh one so one bad file is not counted many times.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import time
from collections import Counter
from pathlib import Path

from torchstore.data import TrajectoryStoreWriter
from torture_sections.kit import check_committed, episode_rows, run_writer_child, short
from torture_sections.writer_kills import (
    _TRAPS_COMMIT,
    _TRAPS_RESUME,
    _arm,
    _ChildReport,
    _fresh_kill_store,
    _kill_label,
)

OUTCOMES = ["intact", "lost", "unopenable", "hang", "raw"]
GOOD = {"intact"}

#: Where one kill of a sequence lands.
KILL_KINDS = ("random", "inside resume", "inside commit", "inside close", "inside recovery")
#: Traps inside the recovery of a killed writer's file (before or after each step).
_TRAPS_RECOVERY = [
    ("torchstore.io.hdf5.files", None, "_raise_stored_eoa_to_eof"),
    ("torchstore.io.hdf5.files", None, "_recover_after_kill"),
]
_PHASE = -4  # the child is entering the phase it is to be killed in
_PHASE_DONE = -5
_DEADLINE_S = 60.0


def _phase_marker(fd: int, module, name: str) -> None:
    """Report entering and leaving ``module.name`` through ``fd`` (the parent times a kill)."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        os.write(fd, struct.pack("<q", _PHASE))
        result = original(*args, **kwargs)
        os.write(fd, struct.pack("<q", _PHASE_DONE))
        return result

    setattr(module, name, wrapper)


def _child(path: Path, fd: int, plan: tuple) -> None:
    """Resume ``path`` and commit up to ``plan``'s episode count, then close; killed on the way."""
    kind, trap, episodes = plan

    def body() -> None:
        import torchstore.io.hdf5.files as hdf5

        if kind == "inside recovery" and trap is None:
            _phase_marker(fd, hdf5, "_recover_after_kill")
        elif kind in ("inside resume", "inside recovery"):
            _arm(*trap)
        os.write(fd, struct.pack("<q", -1))  # started
        w = TrajectoryStoreWriter.resume(path)
        if kind == "inside commit":
            _arm(*trap)
        first = w.num_episodes  # the parent may not have heard of the last commit
        for i in range(first, first + episodes):
            w.add_episode(episode_rows(i), metadata={"i": i})
            os.write(fd, struct.pack("<q", i + 1))
        if kind == "inside close":
            os.write(fd, struct.pack("<q", _PHASE))
        w.close()
        os.write(fd, struct.pack("<q", _PHASE_DONE))

    run_writer_child(fd, body)


class _Report(_ChildReport):
    """The writer-kills report plus when the child entered and left the timed phase."""

    def __init__(self, committed: int):
        super().__init__(committed)
        self.phase_start: float | None = None
        self.phase_span: float | None = None

    def read(self, fd: int) -> None:
        try:
            self._buf += os.read(fd, 4096)
        except BlockingIOError:
            pass
        while len(self._buf) >= 8:
            (value,) = struct.unpack("<q", self._buf[:8])
            self._buf = self._buf[8:]
            if value == _PHASE:
                self.phase_start = time.monotonic()
            elif value == _PHASE_DONE:
                if self.phase_start is not None:
                    self.phase_span = time.monotonic() - self.phase_start
            elif value == -1:
                self.started = time.monotonic()
            elif value in (-2, -3):
                self.writer_error = "torchstore" if value == -2 else "raw"
            else:
                self.committed = max(self.committed, value)


def _plan(kind: str, rng: random.Random) -> tuple:
    """(kind, trap or None, episodes to commit before closing) for one kill."""
    episodes = rng.randrange(0, 4)
    if kind == "random":
        return kind, None, 400  # still writing when the kill comes
    if kind == "inside resume":
        trap = (rng.choice(_TRAPS_RESUME), rng.choice(["before", "after"]), rng.randrange(1, 4))
    elif kind == "inside commit":
        trap = (rng.choice(_TRAPS_COMMIT), rng.choice(["before", "after"]), rng.randrange(1, 12))
        episodes = 4
    elif kind == "inside recovery" and rng.random() < 0.5:
        trap = (rng.choice(_TRAPS_RECOVERY), rng.choice(["before", "after"]), 1)
    else:
        trap = None
    return kind, trap, episodes


def _watch(pid: int, fd: int, report: _Report, kill_at: float | None, phase_kill: float | None):
    """Follow the child until it exits; kill it ``kill_at`` s after it started, or
    ``phase_kill`` s after it entered its phase. Returns its wait status or "hang"."""
    deadline = time.monotonic() + _DEADLINE_S
    while True:
        ready, _, _ = select.select([fd], [], [], 0.0005)
        if ready:
            report.read(fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        now = time.monotonic()
        due = None
        if kill_at is not None and report.started is not None:
            due = report.started + kill_at
        if phase_kill is not None and report.phase_start is not None:
            due = report.phase_start + phase_kill
        if due is not None and now >= due:
            os.kill(pid, signal.SIGKILL)
            kill_at = phase_kill = None
        if now > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang"
        if due is not None and due - now < 0.0005:
            time.sleep(max(0.0, due - time.monotonic()))


class _Spans:
    """How long closes and recoveries take here (the window a timed kill is drawn from)."""

    def __init__(self):
        self.spans = {"inside close": [0.004], "inside recovery": [0.008]}

    def draw(self, kind: str, rng: random.Random) -> float:
        seen = sorted(self.spans[kind])
        return rng.uniform(0.0, 1.2 * seen[len(seen) // 2])

    def note(self, kind: str, span: float | None) -> None:
        if span is not None and kind in self.spans:
            self.spans[kind] = (self.spans[kind] + [span])[-50:]


def _one_kill(path: Path, committed: int, plan: tuple, spans: _Spans, rng: random.Random):
    """Run one writer child and kill it as ``plan`` says; (status, report)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(path, w, plan)
    os.close(w)
    os.set_blocking(r, False)
    report = _Report(committed)
    kind, trap, _ = plan
    kill_at = phase_kill = None
    if kind == "random":
        kill_at = rng.uniform(0.0, 0.25)
    elif trap is None:
        phase_kill = spans.draw(kind, rng)
    status = _watch(pid, r, report, kill_at, phase_kill)
    report.read(r)
    os.close(r)
    spans.note(kind, report.phase_span)
    return status, report


def _sequence(path: Path, committed: int, rng: random.Random, spans: _Spans):
    """2-4 kills in a row; (label, committed, text, the kinds) after checking the store."""
    kinds = [rng.choice(KILL_KINDS) for _ in range(rng.randint(2, 4))]
    writer_error = None
    for kind in kinds:
        status, report = _one_kill(path, committed, _plan(kind, rng), spans, rng)
        committed = report.committed
        if status == "hang":
            return "hang", committed, f"the writer hung ({kind})", kinds
        if report.writer_error:
            writer_error = report.writer_error
            break
    outcome, value = check_committed(path, committed)
    if outcome == "ok" and str(value).startswith("intact"):
        committed = max(committed, int(str(value).split()[1]))
    return _kill_label(outcome, value, writer_error), committed, value, kinds


def run_section(workdir: Path, trials: int, rng: random.Random) -> tuple[Counter, list[str]]:
    """``trials`` kill sequences on one store; the outcome of each and notes off target."""
    path = workdir / "sequences.h5"
    committed = _fresh_kill_store(path)
    counts: Counter = Counter()
    notes: list[str] = []
    spans = _Spans()
    for _ in range(trials):
        label, committed, value, kinds = _sequence(path, committed, rng, spans)
        counts[label] += 1
        if label not in GOOD:
            notes.append(f"kill sequence {kinds}: {label}: {short(value)}")
            committed = _fresh_kill_store(path)
    return counts, notes
