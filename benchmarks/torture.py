"""Torture run: kill writers, damage files, race readers against a writer, and count outcomes.

Every trial runs in real processes (``fork``) with deadlines, so a hang or a crash is counted,
never waited on. Sections and their outcomes:

- writer kills (SIGKILL at a random moment, at a chosen point inside a commit, or inside
  ``resume()``), each trial resuming the store the last one killed:
  intact / lost (a committed episode missing or changed) / unopenable / hang / raw
  (an exception that is not a torchstore error);
- one flipped bit in each region of a store file (superblock, object headers, chunk
  indexes and other HDF5 metadata, global heap, manifest, checksum tables, episode tables,
  commit record, column data), the file then read completely:
  clean error / identical / SILENT (different data returned) / crash / hang / raw;
- live readers following a writer that commits thousands of tiny episodes:
  false alarms (IntegrityError on intact data) and wrong values;
- ``StoreReplay.dumps`` (the storage's checkpoint, ``replay.h5``; torchrl's own files
  beside it are torchrl's, written in place) killed at random moments over an earlier
  checkpoint: old or new checkpoint loads exactly / lost / hang / raw;
- a second writer while one is live (``resume``, ``overwrite=True``, ``dumps``):
  refused / accepted, and whether the live writer's commits survived.

Targets: 0 lost, 0 unopenable, 0 SILENT, 0 crash, 0 hang, 0 raw, 0 false alarms, every
second writer refused.

Usage: python benchmarks/torture.py [--seed 0] [--kills 300] [--corruptions 500]
       [--readers 3] [--commits 3000] [--dumps 20] [--dump-rows 200000]
       [--second-writers 9] [--dir /tmp]
Exit status 1 when any outcome is off target.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch

from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError, TorchstoreError

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
def forked(fn: Callable[[], object], timeout: float) -> tuple[str, object]:
    """Run ``fn`` in a child: ("ok", result) | ("torchstore", message) | ("raw", text) |
    ("crash", signal name) | ("hang", None)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = ("ok", fn())
        except TorchstoreError as exc:
            out = ("torchstore", f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # noqa: BLE001 - counting raw exceptions is the point
            out = ("raw", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
        data = json.dumps(out, default=str).encode()
        with contextlib.suppress(OSError):
            os.write(w, data[:60000])
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    chunks = []
    os.set_blocking(r, False)
    while True:
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(r, 65536)
            if chunk:
                chunks.append(chunk)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return "hang", None
        time.sleep(0.002)
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


# ----------------------------------------------------------------- writer kills
def _check_committed(path: Path, committed: int) -> tuple[str, object]:
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


_TRAPS_COMMIT = [
    ("torchstore.io.checksummed", "ChecksummedDataset", "seal"),
    ("h5py", "File", "flush"),
    ("torchstore.data.layout", "StoreDatasets", "write_commit"),
    ("torchstore.io.checksummed", "ChecksummedDataset", "write_staged"),
]
_TRAPS_RESUME = [
    ("torchstore.io.hdf5", None, "_recover_after_kill"),
    ("torchstore.io.hdf5", None, "_open_swmr_writer"),
    ("torchstore.io.checksummed", "ChecksummedDataset", "start_writing"),
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
    code = 0
    try:
        if trap is not None and trap[0] == "resume":
            _arm(*trap[1:])
        os.write(progress_w, struct.pack("<q", -1))  # started
        with TrajectoryStoreWriter.resume(path) as w:
            if trap is not None and trap[0] == "commit":
                _arm(*trap[1:])
            for i in range(first, first + 400):
                w.add_episode(episode_rows(i), metadata={"i": i})
                os.write(progress_w, struct.pack("<q", i + 1))
    except TorchstoreError as exc:
        os.write(progress_w, struct.pack("<q", -2))
        print("writer:", type(exc).__name__, exc, file=sys.stderr)
        code = 2
    except BaseException:
        os.write(progress_w, struct.pack("<q", -3))
        traceback.print_exc()
        code = 3
    os._exit(code)


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
        outcome, value = _check_committed(path, committed)
        if outcome == "ok" and str(value).startswith("intact"):
            committed = max(committed, int(str(value).split()[1]))
        label = _kill_label(outcome, value, report.writer_error)
        results[kind][label] += 1
        if label != "intact":
            notes.append(f"{kind} {trap}: {label}: {_short(value)} (writer: {report.writer_error})")
        if label in ("unopenable", "raw", "lost"):
            # start over, so one bad file does not count many times
            committed = _fresh_kill_store(path)
    results["_notes"] = notes  # type: ignore[assignment]
    return results


# ----------------------------------------------------------------- corruption regions
_HDF5_SIGNATURES = (
    b"BTHD",
    b"BTIN",
    b"BTLF",
    b"EAHD",
    b"EAIB",
    b"EASB",
    b"EADB",
    b"FAHD",
    b"FADB",
    b"FSHD",
    b"FSSE",
    b"FRHP",
    b"FHDB",
    b"FHIB",
    b"OCHK",
    b"TREE",
    b"SNOD",
    b"HEAP",
)


def _ohdr_length(data: bytes, addr: int) -> int:
    """Bytes of a version-2 object header's first chunk (signature to checksum)."""
    flags = data[addr + 5]
    pos = addr + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 0x03)
    size = int.from_bytes(data[pos : pos + width], "little")
    return 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0) + width + size + 4


_REGION_KINDS = (
    "superblock",
    "object headers",
    "HDF5 indexes",
    "global heap",
    "manifest",
    "checksum tables",
    "episode tables",
    "commit record",
    "data",
)
_RAW_KINDS = ("commit record", "checksum tables", "episode tables", "data")


def _chunk_ranges(ds: h5py.Dataset) -> list[tuple[int, int]]:
    """The bytes of each chunk that hold rows (a chunk's tail past the last row is unused)."""
    out = []
    row_bytes = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
    for i in range(ds.id.get_num_chunks()):
        info = ds.id.get_chunk_info(i)
        rows = max(0, min(ds.chunks[0], ds.shape[0] - info.chunk_offset[0]))
        out.append((info.byte_offset, info.byte_offset + min(info.size, rows * row_bytes)))
    return out


def _dataset_regions(path: Path, data: bytes, regions: dict) -> tuple[set[int], bytes]:
    """Fill the raw-data regions; returns every object header address and the manifest."""
    with h5py.File(path, "r") as f:
        addrs = {h5py.h5o.get_info(f.id).addr}

        def visit(name, obj):
            addrs.add(h5py.h5o.get_info(obj.id).addr)
            if not isinstance(obj, h5py.Dataset):
                return
            if name == "commit":
                off = obj.id.get_offset()
                regions["commit record"].append((off, off + obj.id.get_storage_size()))
            elif name.startswith("checksums/"):
                regions["checksum tables"] += _chunk_ranges(obj)
            elif name.startswith("episodes/"):
                regions["episode tables"] += _chunk_ranges(obj)
            else:
                regions["data"] += _chunk_ranges(obj)

        f.visititems(visit)
        ext = struct.unpack("<Q", data[20:28])[0]  # superblock extension object header
        if ext != 0xFFFFFFFFFFFFFFFF:
            addrs.add(ext)
        manifest = f.attrs["torchstore_manifest"]
    return addrs, manifest.encode() if isinstance(manifest, str) else manifest


def _global_heap_regions(data: bytes, start: int, text: bytes) -> list[tuple[int, int]]:
    """Global heap collections, less the manifest's bytes (at ``start``) where one holds it."""
    out = []
    pos = data.find(b"GCOL")
    while pos >= 0:
        size = struct.unpack("<Q", data[pos + 8 : pos + 16])[0]
        if 0 < size < len(data):
            lo, hi = pos, min(pos + size, len(data))
            if start >= 0 and lo <= start < hi:
                out += [(lo, start), (start + len(text), hi)]
            else:
                out.append((lo, hi))
        pos = data.find(b"GCOL", pos + 4)
    return out


def _index_regions(data: bytes, raw_ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """256 bytes from each HDF5 index signature found outside the raw data."""
    out = []
    for sig in _HDF5_SIGNATURES:
        pos = data.find(sig)
        while pos >= 0:
            if not any(a <= pos < b for a, b in raw_ranges):
                out.append((pos, min(pos + 256, len(data))))
            pos = data.find(sig, pos + 4)
    return out


def file_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of each kind of thing in a store file."""
    data = path.read_bytes()
    regions: dict[str, list[tuple[int, int]]] = {k: [] for k in _REGION_KINDS}
    regions["superblock"].append((0, 48))
    addrs, text = _dataset_regions(path, data, regions)
    raw_ranges = [r for key in _RAW_KINDS for r in regions[key]]
    for addr in sorted(addrs):
        if data[addr : addr + 4] == b"OHDR":
            regions["object headers"].append((addr, addr + _ohdr_length(data, addr)))
    start = data.find(text)
    if start >= 0:
        regions["manifest"].append((start, start + len(text)))
    regions["global heap"] += _global_heap_regions(data, start, text)
    regions["HDF5 indexes"] += _index_regions(data, raw_ranges)
    return {k: [(a, b) for a, b in v if b > a] for k, v in regions.items()}


def _pristine_store(path: Path) -> None:
    with TrajectoryStoreWriter(
        path, COLUMNS, env_id="CartPole-v1", seed=3, metadata={"note": "torture"}
    ) as w:
        for i in range(600):
            w.add_episode(episode_rows(i), metadata={"i": i})


def corruptions(
    workdir: Path, trials: int, rng: random.Random
) -> tuple[dict[str, Counter], list[str]]:
    good = workdir / "pristine.h5"
    _pristine_store(good)
    kind, reference = forked(lambda: read_everything(good), timeout=120)
    assert kind == "ok", reference
    regions = file_regions(good)
    names = [k for k, v in regions.items() if v]
    data = good.read_bytes()
    results: dict[str, Counter] = {k: Counter() for k in names}
    notes = []
    bad = workdir / "bad.h5"
    for trial in range(trials):
        region = names[trial % len(names)]
        lo, hi = rng.choice(regions[region])
        offset = rng.randrange(lo, hi)
        bit = rng.randrange(8)
        damaged = bytearray(data)
        damaged[offset] ^= 1 << bit
        bad.write_bytes(damaged)
        kind, value = forked(lambda: read_everything(bad), timeout=30)
        if kind == "ok":
            label = "identical" if value == reference else "SILENT"
        else:
            label = {"torchstore": "clean error", "raw": "raw", "crash": "crash", "hang": "hang"}[
                kind
            ]
        results[region][label] += 1
        if label not in ("identical", "clean error"):
            notes.append(f"{region} byte {offset} bit {bit}: {label}: {_short(value)}")
    return results, notes


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
    hung = 0
    for pid in pids:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.01)
    return hung


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


# ----------------------------------------------------------------- replay dumps
def _ring(version: int, rows: int):
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
    rb = _ring(0, rows)
    rb.storage.loads(folder / "storage")
    first = float(rb.storage.get(torch.tensor([0]))["obs"][0, 0])
    version = int(round(first / 1e6))
    want = _ring(version, rows).storage.get(torch.arange(rows))
    got = rb.storage.get(torch.arange(rows))
    if not (want == got).all():
        raise AssertionError(f"loaded checkpoint differs from version {version}")
    return version


def dumps_kills(
    workdir: Path, trials: int, rng: random.Random, rows: int = 200_000
) -> tuple[Counter, list[str]]:
    folder = workdir / "ckpt"
    _ring(0, rows).storage.dumps(folder / "storage")
    t0 = time.monotonic()
    _ring(0, rows).storage.dumps(workdir / "timing")
    dump_s = time.monotonic() - t0
    shutil.rmtree(workdir / "timing", ignore_errors=True)
    results = Counter()
    notes = []
    for trial in range(trials):
        version = trial + 1
        rb = _ring(version, rows)
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
            notes.append(f"dumps kill {trial}: {label}: {_short(value)}")
            if label != "hang":
                _ring(0, rows).storage.dumps(folder / "storage")
    return results, notes


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
                _ring(0, 1000).dumps(folder / "storage" / "..")
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
            notes.append(f"second writer ({attempt}): {kind}: {_short(value)}")
        check, out = _check_committed(path, 8)
        if not (check == "ok" and str(out).startswith("intact")):
            results["live writer's commits lost"] += 1
            notes.append(f"after a second writer ({attempt}): {check}: {str(out)[:200]}")
        shutil.rmtree(folder, ignore_errors=True)
    results.setdefault("accepted", 0)
    results.setdefault("live writer's commits lost", 0)
    return results, notes


# ----------------------------------------------------------------- report
def _short(value: object) -> str:
    """The first line and the last lines of an outcome's text (a traceback's cause and site)."""
    lines = str(value).strip().splitlines()
    if len(lines) <= 4:
        return " | ".join(lines)[:400]
    return (lines[0] + " | ... | " + " | ".join(line.strip() for line in lines[-3:]))[:400]


def _row(section: str, trials: int, counts: Counter, order: list[str]) -> str:
    cells = "  ".join(f"{k} {counts.get(k, 0)}" for k in order)
    extra = "  ".join(f"{k} {v}" for k, v in counts.items() if k not in order)
    return f"| {section:<28} | {trials:>6} | {cells}{'  ' + extra if extra else ''} |"


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="torture-", dir=args.dir))
    lines = ["| section | trials | outcomes |", "|---|---|---|"]
    notes: list[str] = []
    bad = 0
    try:
        if args.kills:
            kills = writer_kills(workdir, args.kills, rng)
            notes += kills.pop("_notes")  # type: ignore[arg-type]
            for kind, counts in kills.items():
                lines.append(
                    _row(
                        f"writer kill, {kind}",
                        sum(counts.values()),
                        counts,
                        ["intact", "lost", "unopenable", "hang", "raw"],
                    )
                )
                bad += sum(v for k, v in counts.items() if k != "intact")
        if args.corruptions:
            regions, more = corruptions(workdir, args.corruptions, rng)
            notes += more
            total = Counter()
            for region, counts in regions.items():
                total.update(counts)
                lines.append(
                    _row(
                        f"bit flip: {region}",
                        sum(counts.values()),
                        counts,
                        ["clean error", "identical", "SILENT", "crash", "hang", "raw"],
                    )
                )
            lines.append(
                _row(
                    "bit flips, all regions",
                    sum(total.values()),
                    total,
                    ["clean error", "identical", "SILENT", "crash", "hang", "raw"],
                )
            )
            bad += sum(v for k, v in total.items() if k not in ("clean error", "identical"))
        if args.readers and args.commits:
            live, more = live_readers(workdir, args.readers, args.commits)
            notes += more
            lines.append(
                _row(
                    f"live readers x{args.readers}, {args.commits} commits",
                    args.readers,
                    live,
                    ["false alarms", "wrong values", "raw", "hang", "reads", "refreshes"],
                )
            )
            bad += sum(live[k] for k in ("false alarms", "wrong values", "raw", "hang"))
        if args.dumps:
            dumps, more = dumps_kills(workdir, args.dumps, rng, rows=args.dump_rows)
            notes += more
            lines.append(
                _row(
                    "StoreReplay.dumps killed",
                    args.dumps,
                    dumps,
                    ["loads (old or new)", "lost", "hang", "raw"],
                )
            )
            bad += sum(v for k, v in dumps.items() if k != "loads (old or new)")
        if args.second_writers:
            second, more = second_writers(workdir, args.second_writers)
            notes += more
            lines.append(
                _row(
                    "second writer while one is live",
                    args.second_writers,
                    second,
                    ["refused", "accepted", "live writer's commits lost"],
                )
            )
            bad += sum(v for k, v in second.items() if k != "refused")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"torture run, seed {args.seed}")
    print("\n".join(lines))
    if notes:
        print(f"\n{len(notes)} outcomes off target:")
        for note in notes[:40]:
            print("  -", note)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)  # forked children must not inherit a busy OpenMP pool
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--kills", type=int, default=300, help="writer kills, a third of each kind (default 300)"
    )
    parser.add_argument(
        "--corruptions", type=int, default=500, help="single-bit corruptions (default 500)"
    )
    parser.add_argument("--readers", type=int, default=3, help="live reader processes (default 3)")
    parser.add_argument(
        "--commits",
        type=int,
        default=3000,
        help="tiny commits the live writer makes (default 3000)",
    )
    parser.add_argument("--dumps", type=int, default=20, help="replay dumps killed (default 20)")
    parser.add_argument(
        "--dump-rows", type=int, default=200_000, help="rows in each dumped ring (default 200000)"
    )
    parser.add_argument(
        "--second-writers", type=int, default=9, help="second-writer attempts (default 9)"
    )
    parser.add_argument(
        "--dir", default=None, help="where scratch files go (default: the system temp folder)"
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
