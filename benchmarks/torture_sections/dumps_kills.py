"""``StoreReplay.dumps`` killed at random moments over an earlier checkpoint."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import torch

from torchstore.data import ColumnSpec
from torture_sections.kit import (
    forked,
    short,
)


# ----------------------------------------------------------------- replay dumps
def ring(version: int, rows: int):
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from torchstore.data.replay import StoreReplay

    cols = [ColumnSpec("obs", torch.float32, (16,)), ColumnSpec("done", torch.bool)]
    rb = TensorDictReplayBuffer(storage=StoreReplay(rows, columns=cols), batch_size=8)
    obs = torch.arange(rows * 16, dtype=torch.float32).reshape(rows, 16) + version * 1e6
    done = torch.zeros(rows, dtype=torch.bool)
    done[99::100] = True
    rb.extend(TensorDict({"obs": obs, "done": done}, [rows]))
    return rb


def _loaded_version(folder: Path, rows: int) -> int:
    rb = ring(0, rows)
    rb.storage.loads(folder / "storage")
    first = float(rb.storage.get(torch.tensor([0]))["obs"][0, 0])
    version = int(round(first / 1e6))
    want = ring(version, rows).storage.get(torch.arange(rows))
    got = rb.storage.get(torch.arange(rows))
    if not (want == got).all():
        raise AssertionError(f"loaded checkpoint differs from version {version}")
    return version


def dumps_kills(
    workdir: Path, trials: int, rng: random.Random, rows: int = 200_000
) -> tuple[Counter, list[str]]:
    folder = workdir / "ckpt"
    ring(0, rows).storage.dumps(folder / "storage")
    t0 = time.monotonic()
    ring(0, rows).storage.dumps(workdir / "timing")
    dump_s = time.monotonic() - t0
    shutil.rmtree(workdir / "timing", ignore_errors=True)
    results = Counter()
    notes = []
    for trial in range(trials):
        version = trial + 1
        rb = ring(version, rows)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, b"1")
            try:
                rb.storage.dumps(folder / "storage")
            finally:
                os._exit(0)
        os.close(w)
        os.read(r, 1)
        os.close(r)
        time.sleep(rng.uniform(0, dump_s * 1.2))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kind, value = forked(lambda: _loaded_version(folder, rows), timeout=120)
        if kind == "ok":
            results["loads (old or new)"] += 1
        else:
            label = {"torchstore": "lost", "raw": "raw", "crash": "crash", "hang": "hang"}[kind]
            results[label] += 1
            notes.append(f"dumps kill {trial}: {label}: {short(value)}")
            if label != "hang":
                ring(0, rows).storage.dumps(folder / "storage")
    return results, notes
