"""A whole replay-buffer checkpoint (``dump_buffer``) killed at random moments over an
earlier one, then loaded into a fresh buffer: storage rows, sampler priorities and writer
cursor must all come from one version, the old one or the new one.

Each version ``v`` is told apart in every component: the rows hold ``base + v * 1e6``, the
priorities ``v + 1 + i / rows``, and the writer has written ``rows + v + 1`` rows (its
cursor at ``v + 1``). ``plain=True`` kills torchrl's own ``rb.dumps`` the same way, which
writes those files in place one after another (the comparison the section exists for).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from torchstore.data import ColumnSpec
from torture_sections.kit import (
    forked,
    short,
)

_COLUMNS = [ColumnSpec("obs", torch.float32, (16,)), ColumnSpec("done", torch.bool)]
WHOLE = "old or new, whole"


# ----------------------------------------------------------------- replay dumps
def _buffer(rows: int):
    from torchrl.data import TensorDictReplayBuffer

    from torchstore.data.replay.ring import StoreReplay
    from torchstore.samplers import PrioritizedSampler

    # torchstore's PrioritizedSampler is a torchrl PrioritizedSampler subclass; torchrl's
    # own cannot be built here (its C++ extension does not load with this torch)
    return TensorDictReplayBuffer(
        storage=StoreReplay(rows, columns=_COLUMNS),
        sampler=PrioritizedSampler(rows),
        batch_size=8,
    )


def _rows(version: int, rows: int) -> torch.Tensor:
    return torch.arange(rows * 16, dtype=torch.float32).reshape(rows, 16) + version * 1e6


def _priorities(version: int, rows: int) -> torch.Tensor:
    return version + 1 + torch.arange(rows, dtype=torch.float64) / rows


def ring(version: int, rows: int):
    """A full prioritized buffer of ``rows`` rows whose every component says ``version``."""
    from tensordict import TensorDict

    rb = _buffer(rows)
    obs = _rows(version, rows)
    done = torch.zeros(rows, dtype=torch.bool)
    done[99::100] = True
    rb.extend(TensorDict({"obs": obs, "done": done}, [rows]))
    # the same rows again over the oldest ``version + 1`` slots: the cursor tells the version
    extra = version % rows + 1
    rb.extend(TensorDict({"obs": obs[:extra], "done": done[:extra]}, [extra]))
    rb.update_priority(torch.arange(rows), _priorities(version, rows))
    return rb


def _versions(folder: Path, rows: int, plain: bool) -> dict:
    """Load ``folder`` into a fresh buffer; the version each component holds (-1: none)."""
    from torchstore.data.replay.buffer_dump import load_buffer

    # a forked child must not enter the OpenMP pool its parent started: it would wait forever
    torch.set_num_threads(1)
    rb = _buffer(rows)
    if plain:
        rb.loads(folder)
    else:
        load_buffer(rb, folder)
    obs = rb.storage.get(torch.arange(rows))["obs"] if len(rb) == rows else None
    v_storage = -1 if obs is None else int(round(float(obs[0, 0]) / 1e6))
    if obs is not None and not torch.equal(obs, _rows(v_storage, rows)):
        v_storage = -1
    raw = rb.sampler.state_dict()["raw"]
    v_sampler = int(round(float(raw[0]) - 1))
    if not torch.equal(raw, _priorities(v_sampler, rows)):
        v_sampler = -1
    writer = rb.writer.state_dict()
    v_writer = int(writer["_write_count"]) - rows - 1
    if int(writer["_cursor"]) != (v_writer % rows + 1) % rows:
        v_writer = -1
    return {"storage": v_storage, "sampler": v_sampler, "writer": v_writer}


def _dump(rb, folder: Path, plain: bool) -> None:
    from torchstore.data.replay.buffer_dump import dump_buffer

    if plain:
        rb.dumps(folder)
    else:
        dump_buffer(rb, folder)


def _killed_dump(rb, folder: Path, plain: bool, delay: float) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b"1")
        torch.set_num_threads(1)  # see _versions
        try:
            _dump(rb, folder, plain)
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _timed_dump(rb, folder: Path, plain: bool, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        _dump(rb, folder, plain)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def dumps_kills(
    workdir: Path, trials: int, rng: random.Random, rows: int = 200_000, *, plain: bool = False
) -> tuple[Counter, list[str]]:
    """Outcomes: ``"old or new, whole"``, ``"mixed"`` (components of different versions,
    or a whole version that is neither), ``"lost"`` (a torchstore error on load), ``"raw"``
    (another exception), ``"crash"``, ``"hang"``."""
    folder = workdir / ("ckpt-plain" if plain else "ckpt")
    shutil.rmtree(folder, ignore_errors=True)
    old = 0
    dump_s = _timed_dump(ring(old, rows), folder, plain)
    results = Counter()
    notes = [f"{'rb.dumps' if plain else 'dump_buffer'}: median dump {dump_s * 1e3:.0f} ms"]
    for trial in range(trials):
        new = trial + 1
        rb = ring(new, rows)
        _killed_dump(rb, folder, plain, rng.uniform(0, dump_s * 1.2))
        kind, value = forked(lambda: _versions(folder, rows, plain), timeout=120)
        if kind == "ok":
            got = set(value.values())
            if len(got) == 1 and got <= {old, new}:
                results[WHOLE] += 1
                old = got.pop()
                continue
            label = "mixed"
        else:
            label = {"torchstore": "lost", "raw": "raw", "crash": "crash", "hang": "hang"}[kind]
        results[label] += 1
        notes.append(f"dump kill {trial} (old {old}, new {new}): {label}: {short(value)}")
        if label != "hang":
            _dump(rb, folder, plain)  # start the next trial from a whole checkpoint
            old = new
    return results, notes
