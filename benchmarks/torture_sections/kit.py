"""What every torture section shares: the store's columns, deterministic episodes, forked
checks with deadlines, and the one-line summary of an outcome."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from torchstore.data import ColumnSpec, Quantize, TrajectoryStore
from torchstore.errors import TorchstoreError

COLUMNS = (
    ColumnSpec("obs", torch.float32, (8,)),
    ColumnSpec("action", torch.float32, (3,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("pix", torch.float32, (6,), quantize=Quantize(-2.0, 2.0)),
)
_EPISODE_ROWS = 40


# ----------------------------------------------------------------- deterministic episodes
def episode_length(i: int) -> int:
    return 1 + (i * 7919) % _EPISODE_ROWS


def _rows_of(
    episodes: np.ndarray, within: np.ndarray, lengths: np.ndarray
) -> dict[str, np.ndarray]:
    """Columns for rows given by (episode, row within it), as stored (quantised: codes)."""
    e = episodes.astype(np.float32)[:, None]
    r = within.astype(np.float32)[:, None]
    obs = (e % 4096) * 64 + r + np.arange(8, dtype=np.float32) / 8
    pix = ((episodes[:, None] + within[:, None] + np.arange(6)) % 9).astype(np.float32) / 2 - 2
    return {
        "obs": obs.astype(np.float32),
        "action": -obs[:, :3],
        "reward": episodes.astype(np.float32),
        "done": within == lengths - 1,
        "pix": pix,
    }


def episode_rows(i: int) -> dict[str, np.ndarray]:
    n = episode_length(i)
    return _rows_of(np.full(n, i), np.arange(n), np.full(n, n))


def expected_store(n: int) -> dict[str, np.ndarray]:
    """What the first ``n`` episodes hold, in storage form (pix as uint8 codes)."""
    lengths = np.array([episode_length(i) for i in range(n)], dtype=np.int64)
    episodes = np.repeat(np.arange(n), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    within = np.arange(len(episodes)) - starts
    rows = _rows_of(episodes, within, np.repeat(lengths, lengths))
    rows["pix"] = COLUMNS[-1].quantize.encode(rows["pix"])
    return rows


# ----------------------------------------------------------------- forked checks
def _report_child(fn: Callable[[], object], w: int, address_space: int | None) -> None:
    """In the forked child: run ``fn``, write how it ended to ``w`` as JSON, exit."""
    try:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        out = ("ok", fn())
    except TorchstoreError as exc:
        out = ("torchstore", f"{type(exc).__name__}: {exc}")
    except BaseException as exc:  # noqa: BLE001 - counting raw exceptions is the point
        out = ("raw", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    data = json.dumps(out, default=str).encode()
    with contextlib.suppress(OSError):
        os.write(w, data[:60000])
    os._exit(0)


def forked(
    fn: Callable[[], object],
    timeout: float,
    *,
    address_space: int | None = None,
    usage: dict | None = None,
) -> tuple[str, object]:
    """Run ``fn`` in a child: ("ok", result) | ("torchstore", message) | ("raw", text) |
    ("crash", signal name) | ("hang", None).

    ``address_space``: the child's RLIMIT_AS in bytes (a MemoryError instead of the OOM
    killer); ``usage``: a dict that gets the child's peak RSS in bytes as ``"maxrss"``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _report_child(fn, w, address_space)
    os.close(w)
    deadline = time.monotonic() + timeout
    chunks = []
    os.set_blocking(r, False)
    while True:
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(r, 65536)
            if chunk:
                chunks.append(chunk)
        done, status, rusage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return "hang", None
        time.sleep(0.002)
    if usage is not None:
        usage["maxrss"] = rusage.ru_maxrss * 1024
    os.set_blocking(r, True)
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    if os.WIFSIGNALED(status):
        return "crash", signal.Signals(os.WTERMSIG(status)).name
    if not chunks:
        return "crash", f"exit {os.waitstatus_to_exitcode(status)}"
    kind, value = json.loads(b"".join(chunks))
    return kind, value


def wait_or_kill(pid: int, deadline: float) -> int | None:
    """The child's wait status; None when it still ran at ``deadline`` (it is killed then)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.002)


def read_everything(path: Path) -> str:
    """A digest of everything a reader can get out of a store (values as returned)."""
    with TrajectoryStore(path) as store:
        n = store.num_rows
        out = {
            "manifest": json.loads(store.manifest.__class__.to_json(store.manifest)),
            "rows": n,
            "episodes": store.num_episodes,
            "lengths": store.episodes.lengths.tolist(),
            "metadata": [store.episode_metadata(i) for i in range(store.num_episodes)],
        }
        slab = store.read_slab(0, n)
        for spec in store.columns:
            value = slab[spec.key].contiguous().numpy()
            out[spec.name] = (
                hashlib.sha256(value.tobytes()).hexdigest() + str(value.dtype) + str(value.shape)
            )
        return hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest()


def check_committed(path: Path, committed: int) -> tuple[str, object]:
    def check():
        with TrajectoryStore(path) as store:
            n = store.num_episodes
            if n < committed:
                return f"lost: {n} episodes, {committed} were committed"
            want = expected_store(n)
            got = store.read_slab(0, store.num_rows, raw=True)
            for name, value in want.items():
                if not np.array_equal(got[name].numpy(), value):
                    return f"lost: column {name} differs"
            for i in range(max(0, committed - 50), n):  # the metadata of the latest episodes
                if store.episode_metadata(i) != {"i": i}:
                    return f"lost: episode {i} metadata differs"
            return f"intact {n}"

    return forked(check, timeout=60)


def short(value: object) -> str:
    """The first line and the last lines of an outcome's text (a traceback's cause and site)."""
    lines = str(value).strip().splitlines()
    if len(lines) <= 4:
        return " | ".join(lines)[:400]
    return (lines[0] + " | ... | " + " | ".join(line.strip() for line in lines[-3:]))[:400]


def run_writer_child(fd: int, body: Callable[[], None]) -> NoReturn:
    """How every forked writer child ends: run ``body``, then exit without Python's clean-up.
    A torchstore error is reported to the parent as ``-2`` on ``fd`` (exit 2), anything else
    as ``-3`` with its traceback on stderr (exit 3); a body that returns exits 0."""
    code = 0
    try:
        body()
    except TorchstoreError as exc:
        os.write(fd, struct.pack("<q", -2))
        print("writer:", type(exc).__name__, exc, file=sys.stderr)
        code = 2
    except BaseException:
        os.write(fd, struct.pack("<q", -3))
        traceback.print_exc()
        code = 3
    os._exit(code)
