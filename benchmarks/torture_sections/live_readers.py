"""Live readers following a writer that commits thousands of tiny episodes."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError
from torture_sections.kit import wait_or_kill


# ----------------------------------------------------------------- live readers
def _tiny_episode(i: int) -> dict[str, np.ndarray]:
    n = 1 + i % 3
    return {"q": np.full((n, 4), i, np.float32), "done": np.arange(n) == n - 1}


def _fork_live_writer(path: Path, commits: int) -> int:
    """A child that resumes ``path`` and commits up to ``commits`` episodes; returns its pid
    once it holds the writer."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with TrajectoryStoreWriter.resume(path) as w:
                os.write(ready_w, b"1")
                for i in range(1, commits):
                    w.add_episode(_tiny_episode(i), metadata={"i": i})
            code = 0
        finally:
            os._exit(code)
    os.read(ready_r, 1)
    return pid


def _read_once(store: TrajectoryStore, counts: Counter) -> None:
    """Refresh, read the newest rows and episode, count values that break the pattern."""
    counts["refreshes"] += store.refresh()
    n, e = store.num_rows, store.num_episodes
    q = store.read_slab(max(0, n - 3000), n)["q"][:, 0].numpy()
    last = store.episode(e - 1)["q"][:, 0].numpy()
    counts["reads"] += 1
    if (np.diff(q) < 0).any() or not (last == e - 1).all():
        counts["wrong values"] += 1
    if store.episode_metadata(e - 1) != {"i": e - 1}:
        counts["wrong values"] += 1


def _live_reader_child(path: Path, commits: int, result_w: int) -> None:
    """Read ``path`` while it grows until it holds ``commits`` episodes; report, then exit."""
    counts = Counter()
    notes = []
    try:
        with TrajectoryStore(path) as store:
            while True:
                done = store.num_episodes >= commits
                try:
                    _read_once(store, counts)
                except IntegrityError as exc:
                    counts["false alarms"] += 1
                    notes.append(str(exc)[:200])
                if done:
                    break
    except BaseException as exc:  # noqa: BLE001
        counts["raw"] += 1
        notes.append(repr(exc)[:300])
    os.write(result_w, (json.dumps([counts, notes[:3]]) + "\n").encode())
    os._exit(0)


def _wait_all(pids: list[int], deadline: float) -> int:
    """Wait for every child, killing those still running at ``deadline``; returns how many."""
    return sum(wait_or_kill(pid, deadline) is None for pid in pids)


def live_readers(workdir: Path, readers: int, commits: int) -> tuple[Counter, list[str]]:
    path = workdir / "live.h5"
    cols = [ColumnSpec("q", torch.float32, (4,)), ColumnSpec("done", torch.bool)]
    with TrajectoryStoreWriter(path, cols) as w:
        w.add_episode(_tiny_episode(0), metadata={"i": 0})
    writer = _fork_live_writer(path, commits)
    result_r, result_w = os.pipe()
    pids = []
    for _ in range(readers):
        pid = os.fork()
        if pid == 0:
            _live_reader_child(path, commits, result_w)
        pids.append(pid)
    os.close(result_w)
    total = Counter()
    notes = []
    hung = _wait_all([writer, *pids], time.monotonic() + 900)
    if hung:
        total["hang"] += hung
    with os.fdopen(result_r) as r:
        for line in r.read().splitlines():
            counts, more = json.loads(line)
            total.update(counts)
            notes += more
    for key in ("false alarms", "wrong values", "raw", "hang"):
        total.setdefault(key, 0)
    return total, notes
