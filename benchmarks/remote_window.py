"""A store read by URL (loopback HTTP, added latency and a bandwidth cap) beside the same file
on local disk: opening, whole reads, and batches through the larger-than-memory window.

Builds a walker-shaped low-dim store (``--episodes`` episodes of ``--rows`` rows: obs[17],
action[6], reward; 96 bytes a row) in a scratch folder and serves it with the tests'
loopback file server, ``--latency-ms`` added to every request and bodies capped at
``--mbps`` MB/s. The cache is a fresh folder for each cold case and kept for the warm one.

Prints, with targets marked met / NO:

- opening: requests and bytes fetched, as a share of the file (target < 1 % for a store of
  10,000 episodes);
- a whole-store ``read_slab``: seconds, local vs URL cold vs URL warm;
- ``WindowStorage`` batches/s (``--fraction`` of the store resident in ``--blocks`` blocks,
  batch 256, ``--batches`` batches, uniform sampling): local vs URL cold (target >= 0.8x for
  a low-dim store) and URL warm (target >= 0.97x), and bytes fetched against the bytes the
  window's refills read (target <= 1.05x).

Usage: python benchmarks/remote_window.py [--episodes 10000] [--rows 100] [--latency-ms 20]
       [--mbps 200] [--fraction 0.1] [--blocks 4] [--batches 3000] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import print_table  # noqa: E402

from tests.fileserver import FileServer  # noqa: E402
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.data.columns import ColumnSpec  # noqa: E402
from torchstore.io.remote.chunk_cache import ChunkCache  # noqa: E402
from torchstore.window.window_storage import WindowSampler, WindowStorage  # noqa: E402

COLUMNS = (
    ColumnSpec("obs", torch.float32, (17,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
)
BATCH = 256


def _build(path: Path, episodes: int, rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for _ in range(episodes):
            w.append(
                {
                    "obs": torch.randn(rows, 17, generator=g),
                    "action": torch.randn(rows, 6, generator=g),
                    "reward": torch.randn(rows, generator=g),
                }
            )
            w.end_episode()


def _ranged(store: TrajectoryStore):
    return getattr(store._file, "_torchstore_fileobj", None)


def _batches(source, budget: int, blocks: int, n: int) -> tuple[float, dict]:
    storage = WindowStorage(source, resident=f"{budget}B", resident_blocks=blocks, seed=0)
    sampler = WindowSampler(storage, seed=0)
    sampler.sample(storage, BATCH)  # the first block, read before the clock starts
    t = time.perf_counter()
    for _ in range(n):
        index, _ = sampler.sample(storage, BATCH)
        storage.get(index)
    rate = n / (time.perf_counter() - t)
    stats = dict(storage.window.stats)
    store = storage.window.store if hasattr(storage.window, "store") else None
    ranged = _ranged(store) if store is not None else None
    stats["fetched"] = ranged.bytes_fetched if ranged is not None else 0
    storage.close()
    return rate, stats


def _met(ok: bool) -> str:
    return "met" if ok else "NO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=200.0)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="torchstore-remote-"))
    served = work / "served"
    served.mkdir(parents=True, exist_ok=True)
    path = served / "walker.h5"
    if not path.exists():
        t = time.perf_counter()
        _build(path, args.episodes, args.rows)
        print(f"built {path} in {time.perf_counter() - t:.1f} s")
    size = path.stat().st_size
    budget = int(size * args.fraction)
    try:
        with FileServer(served) as server:
            server.delay_s = args.latency_ms / 1000
            server.rate_bytes_per_s = int(args.mbps * 1e6)
            url = f"{server.url}/walker.h5"
            print(
                f"store: {args.episodes} episodes, {size / 2**20:.1f} MiB; served with "
                f"{args.latency_ms:g} ms a request, {args.mbps:g} MB/s"
            )

            # opening
            t = time.perf_counter()
            store = TrajectoryStore(url, cache=False)
            open_s = time.perf_counter() - t
            f = _ranged(store)
            share = f.bytes_fetched / size
            store.close()
            print_table(
                "opening",
                ("requests", "bytes fetched", "share of file", "seconds", "target < 1 %"),
                [(f.requests, f.bytes_fetched, f"{100 * share:.2f} %", f"{open_s:.2f}",
                  _met(share < 0.01))],
            )  # fmt: skip

            # whole reads
            rows = []
            local = TrajectoryStore(path)
            t = time.perf_counter()
            local.read_slab(0, len(local))
            local_s = time.perf_counter() - t
            local.close()
            rows.append(("local file", f"{local_s:.2f}", "1.00x", "-"))
            cache_dir = work / "cache"
            shutil.rmtree(cache_dir, ignore_errors=True)
            for case in ("URL cold", "URL warm"):
                store = TrajectoryStore(url, cache=ChunkCache(cache_dir, budget=4 * size))
                t = time.perf_counter()
                store.read_slab(0, len(store))
                s = time.perf_counter() - t
                f = _ranged(store)
                rows.append((case, f"{s:.2f}", f"{local_s / s:.2f}x", f.requests))
                store.close()
            print_table("whole read_slab", ("source", "seconds", "vs local", "requests"), rows)

            # batches through the window
            local_rate, local_stats = _batches(path, budget, args.blocks, args.batches)
            shutil.rmtree(cache_dir, ignore_errors=True)
            os.environ["TORCHSTORE_CACHE"] = str(work / "window-cache")
            shutil.rmtree(work / "window-cache", ignore_errors=True)
            cold_rate, cold = _batches(url, budget, args.blocks, args.batches)
            warm_rate, warm = _batches(url, budget, args.blocks, args.batches)
            read = max(cold["bytes"], 1)
            print_table(
                f"WindowStorage batches/s (batch {BATCH}, {args.fraction:g} of the store "
                f"resident in {args.blocks} blocks, {args.batches} batches)",
                ("source", "batches/s", "vs local", "target", "waits", "fetched / read"),
                [
                    ("local file", f"{local_rate:.0f}", "1.00x", "-", local_stats["waits"], "-"),
                    ("URL cold", f"{cold_rate:.0f}", f"{cold_rate / local_rate:.2f}x",
                     f">= 0.8x {_met(cold_rate >= 0.8 * local_rate)}", cold["waits"],
                     f"{cold['fetched'] / read:.2f}x "
                     f"{_met(cold['fetched'] <= 1.05 * read)} (<= 1.05x)"),
                    ("URL warm", f"{warm_rate:.0f}", f"{warm_rate / local_rate:.2f}x",
                     f">= 0.97x {_met(warm_rate >= 0.97 * local_rate)}", warm["waits"], "-"),
                ],
            )  # fmt: skip
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
