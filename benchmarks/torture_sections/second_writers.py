"""A second writer while one is live: refused, and the live writer's commits kept."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

from torchstore.data import TrajectoryStoreWriter
from torture_sections.dumps_kills import ring
from torture_sections.kit import (
    COLUMNS,
    check_committed,
    episode_rows,
    forked,
    short,
)


# ----------------------------------------------------------------- second writers
def _fork_paused_writer(path: Path) -> tuple[int, int]:
    """A child writing ``path`` that commits episodes 1-3, waits for a byte on the returned
    pipe, then commits 4-7; returns ``(pid, that pipe's write end)`` once 1-3 are in."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with TrajectoryStoreWriter.resume(path) as w:
                for i in range(1, 4):
                    w.add_episode(episode_rows(i), metadata={"i": i})
                os.write(ready_w, b"1")
                os.read(go_r, 1)
                for i in range(4, 8):
                    w.add_episode(episode_rows(i), metadata={"i": i})
            code = 0
        finally:
            os._exit(code)
    os.read(ready_r, 1)
    return pid, go_w


def second_writers(workdir: Path, trials: int) -> tuple[Counter, list[str]]:
    results = Counter()
    notes = []
    for trial in range(trials):
        folder = workdir / f"second{trial}"
        path = folder / "storage" / "replay.h5"
        path.parent.mkdir(parents=True)
        with TrajectoryStoreWriter(path, COLUMNS) as w:
            w.add_episode(episode_rows(0), metadata={"i": 0})
        pid, go_w = _fork_paused_writer(path)
        attempt = ("resume", "overwrite=True", "dumps")[trial % 3]

        def second():
            if attempt == "resume":
                TrajectoryStoreWriter.resume(path).close()
            elif attempt == "overwrite=True":
                TrajectoryStoreWriter(path, COLUMNS, overwrite=True).close()
            else:
                ring(0, 1000).dumps(folder / "storage" / "..")
            return "accepted"

        kind, value = forked(second, timeout=60)
        os.write(go_w, b"1")
        os.waitpid(pid, 0)
        if kind == "torchstore":
            results["refused"] += 1
        elif kind == "ok":
            results["accepted"] += 1
            notes.append(f"second writer ({attempt}) was accepted")
        else:
            results[kind] += 1
            notes.append(f"second writer ({attempt}): {kind}: {short(value)}")
        check, out = check_committed(path, 8)
        if not (check == "ok" and str(out).startswith("intact")):
            results["live writer's commits lost"] += 1
            notes.append(f"after a second writer ({attempt}): {check}: {str(out)[:200]}")
        shutil.rmtree(folder, ignore_errors=True)
    results.setdefault("accepted", 0)
    results.setdefault("live writer's commits lost", 0)
    return results, notes
