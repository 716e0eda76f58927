"""A store read by URL (loopback HTTP, added latency and a bandwidth cap) beside the same file
on local disk: opening, whole reads, and batches through the larger-than-memory window.

Builds, in a scratch folder, a walker-shaped low-dim store (``--episodes`` episodes of
``--rows`` rows: obs[17], action[6], reward; 96 bytes a row) and a camera store
(``--camera-episodes`` episodes of ``--camera-frames`` frames: one 240x320 camera, AV1 at
LeRobot's defaults, with a 14-dim state and action), and serves them with the tests'
loopback file server in a child process (as a remote server would be: not in the timed
process), ``--latency-ms`` added to every request and bodies capped at ``--mbps`` MB/s. The
window's cache is a fresh folder for each cold case and kept for the warm one.

Prints, with targets marked met / NO:

- opening: requests and bytes fetched, as a share of the file (target < 1 % for a store of
  10,000 episodes);
- a whole-store ``read_slab``: seconds, local vs URL cold vs URL warm;
- ``WindowStorage`` batches/s, low-dim (``--fraction`` of the store resident in ``--blocks``
  blocks, batch 256, ``--batches`` batches) and camera (``--camera-fraction`` of its decoded
  rows, batch 64, ``--camera-batches`` batches), uniform draws at reuse 1: local vs URL cold
  (targets >= 0.8x low-dim, >= 0.9x camera) and URL warm (>= 0.97x), and bytes fetched
  against the distinct bytes of the chunk and packet spans of the blocks the window drew or
  fetched ahead to draw next (target <= 1.05x; a run ends with the read-ahead's last few
  blocks fetched and not yet drawn, which count in both).

Usage: python benchmarks/remote_window.py [--store both|lowdim|camera] [--episodes 10000]
       [--rows 100] [--latency-ms 20] [--mbps 200] [--fraction 0.1] [--blocks 4]
       [--batches 3000] [--camera-episodes 24] [--camera-frames 100]
       [--camera-fraction 0.25] [--camera-batches 150] [--dir DIR] [--keep]
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
from _camera_frames import camera_frames  # noqa: E402
from _timing import print_table  # noqa: E402

from tests.fileserver import file_server_process  # noqa: E402
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.data.columns import ColumnSpec  # noqa: E402
from torchstore.io.frames.codec import FrameCodec  # noqa: E402
from torchstore.io.remote.chunk_cache import ChunkCache  # noqa: E402
from torchstore.window.window_storage import WindowSampler, WindowStorage  # noqa: E402

COLUMNS = (
    ColumnSpec("obs", torch.float32, (17,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
)
BATCH = 256
#: The camera store: one 240x320 camera (AV1 at LeRobot's defaults, GOP 2) beside a
#: 14-dim state and action, ALOHA's arms; batches of 64.
CAMERA = (240, 320)
CAMERA_BATCH = 64


def _build_camera(path: Path, episodes: int, frames: int) -> None:
    rng = torch.Generator().manual_seed(0)
    h, w = CAMERA
    columns = (
        ColumnSpec("cam_high", torch.uint8, (h, w, 3), codec=FrameCodec.lerobot_av1()),
        ColumnSpec("state", torch.float32, (14,)),
        ColumnSpec("action", torch.float32, (14,)),
    )
    with TrajectoryStoreWriter(path, columns) as w_:
        for e in range(episodes):
            w_.add_episode(
                {
                    "cam_high": camera_frames(frames, h, w, episode=e),
                    "state": torch.randn(frames, 14, generator=rng).numpy(),
                    "action": torch.randn(frames, 14, generator=rng).numpy(),
                }
            )


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


def _batches(source, budget: int, blocks: int, n: int, batch: int) -> tuple[float, dict]:
    storage = WindowStorage(source, resident=f"{budget}B", resident_blocks=blocks, seed=0)
    sampler = WindowSampler(storage, seed=0)
    sampler.sample(storage, batch)  # the first blocks, read before the clock starts
    t = time.perf_counter()
    for _ in range(n):
        index, _ = sampler.sample(storage, batch)
        storage.get(index)
    rate = n / (time.perf_counter() - t)
    stats = dict(storage.window.stats)
    store = storage.window.store if hasattr(storage.window, "store") else None
    ranged = _ranged(store) if store is not None else None
    stats["fetched"] = ranged.bytes_fetched if ranged is not None else 0
    storage.close()
    return rate, stats


def _window_table(
    title: str, path: Path, url: str, work: Path, budget: int, blocks: int, n: int, batch: int,
    cold_target: float,
) -> None:  # fmt: skip
    """Batches through the window: local, URL with an empty cache, URL again (warm)."""
    local_rate, local_stats = _batches(path, budget, blocks, n, batch)
    cache = work / f"window-cache-{path.stem}"
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["TORCHSTORE_CACHE"] = str(cache)
    cold_rate, cold = _batches(url, budget, blocks, n, batch)
    warm_rate, warm = _batches(url, budget, blocks, n, batch)
    # the bytes of the blocks the window drew or fetched ahead to draw next: their chunk
    # and packet spans (a run ends with a few phases' blocks fetched and not yet drawn)
    spans = max(cold.get("ahead_bytes", 0), 1)
    print_table(
        f"{title}: WindowStorage batches/s (batch {batch}, {blocks} blocks, {n} batches)",
        ("source", "batches/s", "vs local", "target", "waits", "fetched / spans"),
        [
            ("local file", f"{local_rate:.1f}", "1.00x", "-", local_stats["waits"], "-"),
            ("URL cold", f"{cold_rate:.1f}", f"{cold_rate / local_rate:.2f}x",
             f">= {cold_target:g}x {_met(cold_rate >= cold_target * local_rate)}",
             cold["waits"],
             f"{cold['fetched'] / spans:.2f}x {_met(cold['fetched'] <= 1.05 * spans)} "
             "(<= 1.05x)"),
            ("URL warm", f"{warm_rate:.1f}", f"{warm_rate / local_rate:.2f}x",
             f">= 0.97x {_met(warm_rate >= 0.97 * local_rate)}", warm["waits"], "-"),
        ],
    )  # fmt: skip


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
    parser.add_argument("--camera-episodes", type=int, default=24)
    parser.add_argument("--camera-frames", type=int, default=100)
    parser.add_argument("--camera-fraction", type=float, default=0.25)
    parser.add_argument("--camera-batches", type=int, default=150)
    parser.add_argument("--store", choices=("both", "lowdim", "camera"), default="both")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="torchstore-remote-"))
    served = work / "served"
    served.mkdir(parents=True, exist_ok=True)
    path, camera = served / "walker.h5", served / "camera.h5"
    if args.store != "camera" and not path.exists():
        t = time.perf_counter()
        _build(path, args.episodes, args.rows)
        print(f"built {path} in {time.perf_counter() - t:.1f} s")
    if args.store != "lowdim" and not camera.exists():
        t = time.perf_counter()
        _build_camera(camera, args.camera_episodes, args.camera_frames)
        print(f"built {camera} in {time.perf_counter() - t:.1f} s")
    try:
        with file_server_process(
            served, delay_s=args.latency_ms / 1000, rate_bytes_per_s=int(args.mbps * 1e6)
        ) as prefix:
            print(f"served with {args.latency_ms:g} ms a request, {args.mbps:g} MB/s")
            if args.store != "camera":
                _lowdim(args, path, f"{prefix}/{path.name}", work)
            if args.store != "lowdim":
                h, w = CAMERA
                row = h * w * 3 + 2 * 14 * 4
                rows = args.camera_episodes * args.camera_frames
                print(
                    f"\ncamera store: {args.camera_episodes} episodes of {args.camera_frames} "
                    f"frames, {h}x{w} AV1, {camera.stat().st_size / 2**20:.1f} MiB"
                )
                _window_table(
                    "camera store", camera, f"{prefix}/{camera.name}", work,
                    int(rows * row * args.camera_fraction), args.blocks, args.camera_batches,
                    CAMERA_BATCH, 0.9,
                )  # fmt: skip
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _lowdim(args, path: Path, url: str, work: Path) -> None:
    size = path.stat().st_size
    print(f"\nlow-dim store: {args.episodes} episodes, {size / 2**20:.1f} MiB")
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
    _window_table(
        "low-dim store", path, url, work, int(size * args.fraction), args.blocks,
        args.batches, BATCH, 0.8,
    )  # fmt: skip


if __name__ == "__main__":
    main()
