"""Encoded camera columns: disk, training batches, decode and sampling, side by side in one run.

Cameras of camera-like frames (``benchmarks/_camera_frames.py``, never noise: ``--source
photo``, a photograph panned and zoomed by a moving camera, or ``--source sim``, the reach
task's renders) in one of two layouts (``--shape aloha``: a 480x640 camera and a 240x320
one, 12 episodes of 150 frames; ``--shape droid``: three 180x320 cameras, 6 episodes of
400), plus ``state`` and ``action`` float32[14], episodes at 30 fps. Every episode is
generated once and written three times: a raw uint8 store, an encoded store at LeRobot's
default AV1 settings (``FrameCodec.lerobot_av1()``: GOP 2, crf 30, preset 12, encoded by
the store's writer from the raw frames) and a LeRobot v3 dataset of the same frames
(``torchstore.lerobot.LeRobotWriter``, AV1 MP4 at LeRobot's defaults). Rows, each printed
next to its target:

1. disk: the encoded store's bytes against the LeRobot dataset's (target: at most 1.1x),
   and the raw store's bytes against the encoded store's;
2. training batches: batches/s of 256 rows (both cameras, state, action) from a windowed
   ``OfflineDataModule`` (``layout="flat"``, the same ``resident=`` byte budget for both
   stores) over the encoded store against the raw one (target: at least 0.8x). The two
   loaders run in turn (A B A B ...), each sample ``--steps`` batches after a warm-up;
   their refill threads read (and decode) the next block in the background;
3. decode: frames/s of the store's ``read_column`` over one whole episode (a long
   contiguous run) against PyAV's own sequential decode of the same packets muxed into an
   MP4 by ``write_mp4`` (``av.open(...).decode(video=0)``, ``frame.to_ndarray(format=
   "rgb24")``, ``thread_count`` 1), one thread each, timed in turn (target: at least 0.9x
   the frames per CPU-second, the per-core figure; frames per wall second printed too);
4. against LeRobot, at ``resident_reuse`` 1 (every row decoded once per draw): samples/s
   of 64-sample batches from a windowed ``DemonstrationDataModule`` over the encoded store
   (every camera and ``state`` at the step; ``action`` at the step, then over ``--chunk``
   steps) against ``LeRobotDataset`` + a torch ``DataLoader`` (batch 64, ``shuffle=True``,
   ``num_workers`` = the cores; for the chunk, ``delta_timestamps`` on ``action``) on the
   dataset's MP4 files with its default torchcodec backend (PyAV where torchcodec cannot
   load), ``--lerobot-steps`` batches timed after the ``2 * workers + 1`` that drain what
   its workers prefetched while starting (target: at least 6x, both). lerobot 0.6 needs
   Python 3.12, so that side runs as a script under ``--lerobot-python`` (default
   ``/tmp/lr06/bin/python``, made by ``bash tests/lerobot/lerobot_venv.sh 0.6.1
   /tmp/lr06``, which also links PyAV's FFmpeg for torchcodec), after the torchstore side
   (not interleaved with it); without that interpreter the row says it was skipped;
5. sampling quality, printed, not a target: one epoch of draws (rows // 256 batches) from
   the windowed encoded store, counted per row and per episode, next to the same number of
   i.i.d. uniform draws;
6. action chunks: samples/s of 64-sample batches (both cameras and ``state`` at the step,
   ``action`` over ``--chunk`` steps, default 50) from a windowed
   ``DemonstrationDataModule`` at ``--reuse`` against the same with single steps
   (``action_horizon=1``), on the raw and then the encoded store, a store's two loaders in
   turn (target: the chunk at least 0.9x the single step: each column is gathered at its
   own offsets, so the chunk reads 50 actions a sample and never 50 frames);
7. decode at the ceiling: rows decoded per second by row 4's single-step loader (reuse 1)
   against the ceiling, the cores times one thread's sequential decode of the same streams
   (row 3's ``out=`` figure, every camera of a row; target: at least 0.85x), printed with
   the cores the process got (its CPU seconds per second: on a busy machine other
   processes take the rest) and its CPU a row against one thread's decode, and the part
   of that the training thread spent (its draws and the batches' gather of every row);
   beside it, as many sequential decodes as cores at once: their CPU a row against one
   thread's alone is what the cores cost each other when all of them decode, which the
   ceiling does not count (2 cores here: 1.08-1.20x);
8. resize in the refill: single-step samples/s and rows per GiB of budget with every camera
   resized to 224x224 as it is decoded (``resize=``; 48x48 with ``--quick``) against full
   size, at reuse 1 and ``--reuse`` (printed, not a target).

Sizes and timings depend on the machine; the medians and the low / high deciles of the
per-round ratios are printed (a slow spell of a shared machine hits both sides of a round).

Usage: python benchmarks/cameras.py [--shape aloha|droid] [--source photo|sim]
       [--episodes N] [--frames N] [--quick] [--steps 8] [--repeats 5]
       [--resident-fraction 0.25] [--reuse 4] [--sampling-epochs 4] [--lerobot-python PATH]
       [--lerobot-steps 4] [--dir DIR] [--chunk 50] [--rows 1,2,3,4,5,6,7,8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import av
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _camera_frames import FRAME_SOURCES  # noqa: E402
from _timing import per_call_interleaved, print_table, ratio_spread  # noqa: E402

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.io.frames.codec import FrameCodec, write_mp4  # noqa: E402
from torchstore.lerobot import LeRobotWriter  # noqa: E402
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule  # noqa: E402

FPS = 30
DIM = 14
BATCH = 256
#: the camera layouts (--shape): cameras and their sizes, episodes and frames per episode
#: by default. ALOHA's: a 480x640 camera and a 240x320 one; DROID's (as LeRobot's port of
#: it keeps them): three 180x320 cameras and longer episodes
SHAPES = {
    "aloha": ({"top": (480, 640), "wrist": (240, 320)}, 12, 150),
    "droid": ({"exterior_1": (180, 320), "exterior_2": (180, 320), "wrist": (180, 320)}, 6, 400),
}
QUICK_SIZES = {"wrist": (64, 64), "top": (96, 128)}


def lerobot_key(name: str) -> str:
    """A store column's LeRobot feature key."""
    if name in ("state", "action"):
        return "observation.state" if name == "state" else "action"
    return f"observation.images.{name}"


#: targets
DISK_TARGET = 1.1  # encoded store bytes / LeRobot dataset bytes, at most
BATCHES_TARGET = 0.8  # encoded / raw batches/s, at least
DECODE_TARGET = 0.9  # store decode / PyAV decode frames/s, at least
LEROBOT_TARGET = 6.0  # torchstore / LeRobotDataset samples/s at reuse 1, at least
CEILING_TARGET = 0.85  # decoded rows/s at reuse 1 / (cores x one thread's decode rate)
CHUNK_TARGET = 0.9  # batches with an action chunk / single-step batches, at least
CHUNK_BATCH = 64  # samples a batch in row 6 (the size the chunk slowdown was reported at)
DEFAULT_LEROBOT_PYTHON = "/tmp/lr06/bin/python"
LEROBOT_VENV_HINT = "bash tests/lerobot/lerobot_venv.sh 0.6.1 /tmp/lr06"

#: the LeRobot side, run by the lerobot interpreter: prints one JSON line
LEROBOT_SCRIPT = r"""
import json, pathlib, sys, time
import torch
from torch.utils.data import DataLoader
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def time_loader(dataset, batch, workers, warmup, steps, context=None):
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                        drop_last=True, persistent_workers=workers > 0,
                        multiprocessing_context=context if workers > 0 else None)

    def forever():
        while True:
            yield from loader

    batches = forever()
    for _ in range(warmup):
        next(batches)
    t0 = time.perf_counter()
    for _ in range(steps):
        item = next(batches)
    seconds = time.perf_counter() - t0
    shapes = {k: list(v.shape) for k, v in item.items() if hasattr(v, "shape")}
    return steps * batch / seconds, shapes


def main():
    root, (batch, workers, warmup, steps, chunk), lance_dir = (
        sys.argv[1], map(int, sys.argv[2:7]), sys.argv[7])
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401  (LeRobot's default)
        backend = "torchcodec"
    except Exception:  # torchcodec without FFmpeg's shared libraries: its PyAV backend
        backend = "pyav"
    try:  # lerobot's Lance-backed loader, where lerobot-lancedb is installed beside it
        from lerobot_lancedb import LanceDBDataset
        from lerobot_lancedb.convert import convert
        from lerobot_lancedb.reader import lance_mp_context
    except Exception:
        LanceDBDataset = None
    torch.set_num_threads(1)
    fps = LeRobotDataset("local/cameras", root=root, video_backend=backend).fps
    out = {"backend": backend, "cases": [], "lance": LanceDBDataset is not None}
    if LanceDBDataset is not None:
        convert(pathlib.Path(lance_dir), root=pathlib.Path(root))
    timing = (batch, workers, warmup, steps)
    for horizon in (1, chunk) if chunk > 1 else (1,):
        deltas = None if horizon == 1 else {"action": [i / fps for i in range(horizon)]}
        dataset = LeRobotDataset(
            "local/cameras", root=root, video_backend=backend, delta_timestamps=deltas
        )
        rate, shapes = time_loader(dataset, *timing)
        out["cases"].append({"loader": "LeRobotDataset", "horizon": horizon,
                             "samples_per_s": rate, "shapes": shapes})
        if LanceDBDataset is not None:
            lance = LanceDBDataset(root=lance_dir, delta_timestamps=deltas, return_uint8=True)
            rate, _ = time_loader(lance, *timing, lance_mp_context())
            out["cases"].append({"loader": "LanceDBDataset", "horizon": horizon,
                                 "samples_per_s": rate, "shapes": shapes})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
"""


def columns(sizes: dict[str, tuple[int, int]], codec: FrameCodec | None) -> list[ColumnSpec]:
    return [
        *(ColumnSpec(cam, torch.uint8, (h, w, 3), codec=codec) for cam, (h, w) in sizes.items()),
        ColumnSpec("state", torch.float32, (DIM,)),
        ColumnSpec("action", torch.float32, (DIM,)),
    ]


def lerobot_features(sizes: dict[str, tuple[int, int]]) -> dict[str, dict]:
    out = {
        lerobot_key(cam): {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
        }
        for cam, (h, w) in sizes.items()
    }
    for name in ("state", "action"):
        out[lerobot_key(name)] = {"dtype": "float32", "shape": [DIM], "names": None}
    return out


def make_episode(
    episode: int, frames: int, sizes: dict, source: str = "photo"
) -> dict[str, np.ndarray]:
    """One episode: each camera on a path of its own (``source``: a panned photograph or
    the reach task's renders), smooth state and action."""
    rng = np.random.default_rng([7, episode])
    t = np.arange(frames, dtype=np.float32)[:, None] / FPS
    state = np.sin(rng.uniform(0.2, 1.5, DIM) * t + rng.uniform(0, 6.3, DIM)).astype(np.float32)
    out = {"state": state, "action": np.roll(state, -1, axis=0)}
    for k, (cam, (h, w)) in enumerate(sizes.items()):
        out[cam] = FRAME_SOURCES[source](frames, h, w, episode=episode, seed=k)
    return out


def write_all(
    tmp: Path,
    episodes: int,
    frames: int,
    sizes: dict,
    *,
    lerobot: bool = True,
    source: str = "photo",
) -> tuple[Path, Path, Path]:
    """The raw store, the encoded store and (unless not ``lerobot``) the LeRobot dataset,
    from the same frames."""
    raw, enc, root = tmp / "raw.h5", tmp / "encoded.h5", tmp / "lerobot"
    with (
        TrajectoryStoreWriter(raw, columns(sizes, None)) as w_raw,
        TrajectoryStoreWriter(enc, columns(sizes, FrameCodec.lerobot_av1())) as w_enc,
        contextlib.ExitStack() as stack,
    ):
        w_lr = None
        if lerobot:
            features = lerobot_features(sizes)
            w_lr = stack.enter_context(LeRobotWriter(root, fps=FPS, features=features))
        for e in range(episodes):
            data = make_episode(e, frames, sizes, source)
            w_raw.add_episode(data)
            w_enc.add_episode(data)
            if w_lr is not None:
                w_lr.add_episode({lerobot_key(k): v for k, v in data.items()}, task="look around")
    return raw, enc, root


def folder_bytes(root: Path, pattern: str = "**/*") -> int:
    return sum(p.stat().st_size for p in root.glob(pattern) if p.is_file())


def met(ok: bool) -> str:
    return "yes" if ok else "NO (missed)"


def spread(num: list[float], den: list[float]) -> str:
    mid, lo, hi = ratio_spread(num, den)
    return f"{mid:.2f}x [{lo:.2f}-{hi:.2f}]"


# ---------------------------------------------------------------- 1. disk
def disk_rows(raw: Path, enc: Path, lerobot: Path, sizes: dict) -> tuple[list, float]:
    enc_bytes, raw_bytes = enc.stat().st_size, raw.stat().st_size
    lr_bytes, mp4_bytes = folder_bytes(lerobot), folder_bytes(lerobot, "videos/**/*.mp4")
    with TrajectoryStore(enc) as store:
        packets = sum(
            store.encoded_episode(cam, e).nbytes for cam in sizes for e in range(store.num_episodes)
        )
    mib = 2**20
    table = [
        ("raw uint8 store", f"{raw_bytes / mib:,.1f}", f"{raw_bytes / enc_bytes:,.1f}x"),
        ("encoded store (lerobot_av1)", f"{enc_bytes / mib:,.2f}", "1.0x"),
        ("  of which camera packets", f"{packets / mib:,.2f}", ""),
        ("  the rest (state, action, tables, chunks)", f"{(enc_bytes - packets) / mib:,.2f}", ""),
        ("LeRobot dataset (LeRobotWriter)", f"{lr_bytes / mib:,.2f}",
         f"{lr_bytes / enc_bytes:.2f}x"),
        ("  of which MP4 files", f"{mp4_bytes / mib:,.2f}", ""),
    ]  # fmt: skip
    return table, enc_bytes / lr_bytes, (enc_bytes - packets) / mib


# ---------------------------------------------------------------- 2. batches
def datamodule(path: Path, budget: int, steps: int | None, reuse: float = 1) -> OfflineDataModule:
    dm = OfflineDataModule(
        path,
        batch_size=BATCH,
        resident=f"{budget}B",
        resident_reuse=reuse,
        device="cpu",
        val_episodes=0,
        steps_per_epoch=steps,
        layout="flat",
    )
    dm.setup("fit")
    return dm


def endless(dm: OfflineDataModule):
    while True:
        yield from dm.train_dataloader()


def batch_rates(enc: Path, raw: Path, budget: int, steps: int, repeats: int, reuse: float):
    """Seconds per ``steps`` batches of each loader (encoded, raw, then both with ``reuse``
    draws per row per read), timed in turn; their windows' stats."""
    dms = [datamodule(path, budget, 10_000, r) for r in (1, reuse) for path in (enc, raw)]
    its = [endless(dm) for dm in dms]
    first = next(its[0])
    keys = sorted("/".join(k) if isinstance(k, tuple) else k for k in first.keys(True, True))

    times = per_call_interleaved([run_steps(it, steps) for it in its], repeats=repeats, warmup=1)
    stats = [dict(dm.window.stats) for dm in dms]
    for dm in dms:
        dm.close()
    return times, stats, keys


# ---------------------------------------------------------------- 6. action chunks
def chunk_rates(
    enc: Path,
    raw: Path,
    budget: int,
    sizes: dict,
    steps: int,
    repeats: int,
    reuse: float,
    chunk: int,
) -> tuple[list[list[float]], list[str]]:
    """Seconds per ``steps`` batches of windowed DemonstrationDataModules: single steps and
    ``chunk``-step action chunks, the two of a store in turn (the raw store's pair, then the
    encoded store's: two refill threads at a time, not four); and a chunk batch's keys."""
    times: list[list[float]] = []
    keys: list[str] = []
    for path in (raw, enc):
        cases = [(1, None), (chunk, None)]
        pair, keys, _ = demo_rates(path, budget, sizes, steps, repeats, reuse, cases)
        times += pair
    return times, keys


def demo_rates(
    path: Path,
    budget: int,
    sizes: dict,
    steps: int,
    repeats: int,
    reuse: float,
    cases: list[tuple[int, list[int] | None]],
) -> tuple[list[list[float]], list[str], list[dict]]:
    """Seconds per ``steps`` batches of windowed DemonstrationDataModules over ``path``, one
    per case ``(action horizon, resize)``, timed in turn; the last one's batch keys; each
    window's rows read per second while it was timed (``rows_per_s``) and its rows per GiB
    of budget."""
    dms = [chunk_datamodule(path, budget, sizes, reuse, h, r) for h, r in cases]
    its = [endless(dm) for dm in dms]
    batch = next(its[-1])
    keys = [
        f"{k if isinstance(k, str) else '/'.join(k)} {list(batch[k].shape)}"
        for k in batch.keys(True, True)
    ]
    read: list[list[tuple[int, float, float, float]]] = [[] for _ in dms]

    def timed(k: int):
        go = run_steps(its[k], steps)

        def call():
            rows = dms[k].window.stats["rows"]
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
            go()
            read[k].append((
                dms[k].window.stats["rows"] - rows, time.perf_counter() - t0,
                time.process_time() - c0, time.thread_time() - m0,
            ))  # fmt: skip

        return call

    times = per_call_interleaved([timed(k) for k in range(len(dms))], repeats=repeats)
    info = [
        {
            # over all timed rounds: a round reads a few whole blocks, or none
            "rows_per_s": sum(r[0] for r in read[k][-repeats:])
            / sum(r[1] for r in read[k][-repeats:]),
            # the process's CPU seconds per wall second, and per row read
            "cpu_per_s": sum(r[2] for r in read[k][-repeats:])
            / sum(r[1] for r in read[k][-repeats:]),
            "cpu_per_row": sum(r[2] for r in read[k][-repeats:])
            / max(1, sum(r[0] for r in read[k][-repeats:])),
            # of which the training thread's (the draws and the batches' gather)
            "main_per_row": sum(r[3] for r in read[k][-repeats:])
            / max(1, sum(r[0] for r in read[k][-repeats:])),
            "rows_per_gib": dm.window.budget_rows / (budget / 2**30),
            "row_bytes": dm.window.packed.row_bytes,
        }
        for k, dm in enumerate(dms)
    ]
    for dm in dms:
        dm.close()
    return times, keys, info


def chunk_datamodule(
    path: Path,
    budget: int,
    sizes: dict,
    reuse: float,
    horizon: int,
    resize: list[int] | None = None,
) -> DemonstrationDataModule:
    """Row 6's loader: both cameras and the state at the step, the action over ``horizon``
    steps, from a window of two blocks of whole episodes (chunks never cross one)."""
    dm = DemonstrationDataModule(
        path,
        batch_size=CHUNK_BATCH,
        obs_keys=[*sizes, "state"],
        action_keys=["action"],
        action_horizon=horizon,
        resident=f"{budget}B",
        resident_blocks=2,
        resident_reuse=reuse,
        device="cpu",
        val_episodes=0,
        steps_per_epoch=10_000,
        normalize=False,
        resize=resize,
    )
    dm.setup("fit")
    return dm


def run_steps(it, steps: int):
    """A call taking ``steps`` batches from ``it``."""

    def go():
        for _ in range(steps):
            next(it)

    return go


# ---------------------------------------------------------------- 3. decode
def pyav_decode(path: Path) -> int:
    count = 0
    with av.open(str(path)) as container:
        container.streams.video[0].thread_count = 1
        for frame in container.decode(video=0):
            frame.to_ndarray(format="rgb24")
            count += 1
    return count


def decode_rates(enc: Path, tmp: Path, sizes: dict, repeats: int) -> list[tuple]:
    out = []
    with TrajectoryStore(enc) as store:
        start, stop = store.episodes.range(0)
        for cam in sizes:
            mp4 = tmp / f"{cam}.mp4"
            write_mp4(mp4, store.encoded_episode(cam, 0), FPS)
            frames = stop - start
            same = np.abs(
                store.read_column(cam, start, stop).astype(np.int16)
                - np.stack(
                    [f.to_ndarray(format="rgb24") for f in av.open(str(mp4)).decode(video=0)]
                )
            ).max()
            buffer = np.empty((frames, *store.column(cam).shape), np.uint8)
            cpu, wall = cpu_and_wall(
                [
                    lambda c=cam: store.read_column(c, start, stop),
                    lambda: pyav_decode(mp4),
                    lambda c=cam, b=buffer: store.read_column(c, start, stop, out=b),
                ],
                repeats,
            )
            out.append((cam, frames, cpu, wall, int(same)))
    return out


def decodes_at_once(enc: Path, sizes: dict, threads: int, repeats: int) -> float:
    """Process CPU seconds a row of ``threads`` sequential decodes running at once (each
    thread its own store handle and episode, every camera into a reused buffer, as row 3's
    ``out=``): what the cores cost each other when all of them decode, the median of
    ``repeats`` rounds after one warm-up."""
    stores = [TrajectoryStore(enc) for _ in range(threads)]
    try:
        episodes = stores[0].num_episodes
        frames = max(b - a for a, b in map(stores[0].episodes.range, range(episodes)))
        buffers = [
            {cam: np.empty((frames, *s.column(cam).shape), np.uint8) for cam in sizes}
            for s in stores
        ]

        def decode(k: int, episode: int) -> None:
            a, b = stores[k].episodes.range(episode)
            for cam in sizes:
                stores[k].read_column(cam, a, b, out=buffers[k][cam][: b - a])

        out = []
        for r in range(repeats + 1):
            eps = [(r * threads + k) % episodes for k in range(threads)]
            workers = [threading.Thread(target=decode, args=(k, e)) for k, e in enumerate(eps)]
            c0 = time.process_time()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            rows = sum(b - a for a, b in map(stores[0].episodes.range, eps))
            if r:
                out.append((time.process_time() - c0) / rows)
        return statistics.median(out)
    finally:
        for s in stores:
            s.close()


def cpu_and_wall(fns: list, repeats: int) -> tuple[list[list[float]], list[list[float]]]:
    """Each case's process CPU seconds and wall seconds per round (the cases in turn, one
    warm-up round). CPU time is the per-core figure: both decoders run on the calling
    thread, and on a machine with more busy processes than cores wall time mostly counts
    the waits for one."""
    cpu: list[list[float]] = [[] for _ in fns]
    wall: list[list[float]] = [[] for _ in fns]
    for r in range(repeats + 1):
        for k, fn in enumerate(fns):
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            if r:
                cpu[k].append(time.process_time() - c0)
                wall[k].append(time.perf_counter() - w0)
    return cpu, wall


# ---------------------------------------------------------------- 4. LeRobot
def lerobot_rate(python: str, root: Path, steps: int, tmp: Path, chunk: int) -> dict | str:
    """LeRobot's samples/s (single steps, then ``chunk``-step action chunks) from its own
    interpreter, or why it was skipped. torchcodec finds FFmpeg's libraries in the venv's
    ``ffmpeg-libs`` folder when ``tests/lerobot/lerobot_venv.sh`` linked PyAV's there."""
    if not Path(python).exists():
        return f"skipped: lerobot 0.6 venv not found at {python} (make it: {LEROBOT_VENV_HINT})"
    script = tmp / "lerobot_side.py"
    script.write_text(LEROBOT_SCRIPT)
    workers = cores()
    # the workers prefetch 2 batches each while starting: drain those before the clock runs
    warmup = 2 * workers + 1
    cmd = [python, str(script), str(root), str(CHUNK_BATCH), str(workers), str(warmup),
           str(steps), str(chunk), str(tmp / "lance")]  # fmt: skip
    env = dict(os.environ)
    libs = Path(python).parent.parent / "ffmpeg-libs"
    if libs.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return f"skipped: the LeRobot side failed ({' '.join(tail)})"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["workers"], result["warmup"] = workers, warmup
    return result


def cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------- 5. sampling
def draw_counts(
    enc: Path, budget: int, rows: int, episodes: int, frames: int, epochs: int
) -> list[tuple]:
    dm = datamodule(enc, budget, None)  # an epoch: rows // batch batches
    drawn = []
    out = []
    uniform = torch.Generator().manual_seed(0)
    for epoch in range(1, epochs + 1):
        drawn += [batch["index"] for batch in dm.train_dataloader()]
        if epoch in (1, epochs):
            idx = torch.cat(drawn)
            name = f"windowed encoded store, {epoch} epoch(s)"
            out.append(line(name, idx, rows, episodes, frames))
            iid = torch.randint(rows, (len(idx),), generator=uniform)
            out.append(line("i.i.d. uniform, as many draws", iid, rows, episodes, frames))
    dm.close()
    return out


def line(name: str, idx: torch.Tensor, rows: int, episodes: int, frames: int) -> tuple:
    """How many draws each row and episode got (episodes all ``frames`` long)."""

    per_row = torch.bincount(idx, minlength=rows)
    per_episode = torch.bincount(idx // frames, minlength=episodes)
    return (
        name,
        f"{len(idx):,}",
        f"{int((per_episode > 0).sum())}/{episodes}",
        f"{int(per_episode.min()):,}-{int(per_episode.max()):,}",
        f"{int((per_row > 0).sum()):,}/{rows:,}",
        f"{int(per_row.min())}-{int(per_row.max())}",
        f"{len(idx) / rows:.2f}",
    )


def parse_rows(text: str) -> set[int]:
    try:
        rows = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        rows = set()
    if not rows or not rows <= set(ROWS):
        raise argparse.ArgumentTypeError(f"--rows ({text!r}) must list rows 1 to 8, e.g. 2,6")
    return rows


class Run:
    """What the rows share: the arguments, the stores, and the targets and notes so far (a
    plain class: the smoke test loads this file as a module of no package, which
    dataclasses cannot resolve)."""

    def __init__(self, args: argparse.Namespace, sizes: dict, budget: int, rows: int):
        self.args, self.sizes, self.budget, self.rows = args, sizes, budget, rows
        self.tmp = self.raw = self.enc = self.lerobot = Path()
        self.targets: list[tuple] = []
        self.notes: list[str] = []
        #: row 2's batches/s (encoded, raw at reuse 1; encoded, raw at --reuse), for row 4
        self.rates: list[float] | None = None
        self.decode: list[tuple] = []
        #: rows 4 and 7's timings (see reuse_one)
        self.reuse_one: tuple | None = None


def row_disk(run: Run) -> None:
    disk, disk_ratio, rest_mib = disk_rows(run.raw, run.enc, run.lerobot, run.sizes)
    print_table("1. disk", ("copy", "MiB", "vs encoded store"), disk)
    run.targets.append((
        f"encoded store <= {DISK_TARGET}x LeRobot's dataset", f"{disk_ratio:.2f}x",
        met(disk_ratio <= DISK_TARGET),
    ))  # fmt: skip
    if disk_ratio > DISK_TARGET:
        run.notes.append(
            f"disk: the store's {rest_mib:.2f} MiB besides the packets (chunks and tables of a "
            "fixed size) weigh on a store this small; the default sizes make them small"
        )


def row_batches(run: Run) -> None:
    args = run.args
    times, stats, keys = batch_rates(
        run.enc, run.raw, run.budget, args.steps, args.repeats, args.reuse
    )
    rates = run.rates = [args.steps / statistics.median(t) for t in times]
    table = []
    for k, (name, reuse) in enumerate(
        [("encoded", 1), ("raw uint8", 1), ("encoded", args.reuse), ("raw uint8", args.reuse)]
    ):
        pair = k - k % 2  # the encoded loader of this reuse; k + 1 - k % 2: its raw one
        table.append((
            name, f"{reuse:g}", f"{rates[k]:.2f}",
            spread(times[pair + 1], times[k]) if k % 2 == 0 else "1.00x",
            stats[k].get("refills", 0),
            f"{stats[k].get('waits', 0)}, {stats[k].get('wait_s', 0.0):.1f} s",
        ))  # fmt: skip
    print_table(
        f"2. training batches (windowed OfflineDataModule, {args.repeats} x {args.steps} "
        f"batches each, the four in turn; batch keys {', '.join(keys)})",
        ("store", "resident_reuse", "batches/s", "vs raw", "refills", "waits for a block"),
        table,
    )
    ratios = [ratio_spread(times[1], times[0])[0], ratio_spread(times[3], times[2])[0]]
    run.targets += [
        (f"encoded >= {BATCHES_TARGET}x raw batches/s (resident_reuse {r:g})", f"{b:.2f}x",
         met(b >= BATCHES_TARGET))
        for r, b in zip((1, args.reuse), ratios)
    ]  # fmt: skip


def row_decode(run: Run) -> None:
    args = run.args
    decode = run.decode = decode_rates(run.enc, run.tmp, run.sizes, args.repeats)
    print_table(
        f"3. decode, one thread (one episode, {args.repeats} runs each, in turn): frames per "
        "CPU-second (the target: read_column, a new array each time; into a reused buffer "
        "with out=, as the window's refill decodes) and per wall second",
        ("camera, frames", "read_column", "PyAV", "store vs PyAV",
         "out= reused", "vs PyAV", "wall: store", "PyAV", "vs", "max |diff|"),
        [
            (f"{cam}, {n}", *(f"{n / statistics.median(cpu[k]):,.0f}" for k in (0, 1)),
             spread(cpu[1], cpu[0]), f"{n / statistics.median(cpu[2]):,.0f}",
             spread(cpu[1], cpu[2]),
             *(f"{n / statistics.median(wall[k]):,.0f}" for k in (0, 1)),
             spread(wall[1], wall[0]), diff)
            for cam, n, cpu, wall, diff in decode
        ],
    )  # fmt: skip
    for cam, _, cpu, _, _ in decode:
        ratio = ratio_spread(cpu[1], cpu[0])[0]
        run.targets.append((
            f"store decode >= {DECODE_TARGET}x PyAV per core ({cam})", f"{ratio:.2f}x",
            met(ratio >= DECODE_TARGET),
        ))  # fmt: skip
    if run.rates is not None:
        per_row = sum(statistics.median(cpu[0]) / n for _, n, cpu, _, _ in decode)
        reuse, rates = args.reuse, run.rates
        if min(rates[0] / rates[1], rates[2] / rates[3]) < BATCHES_TARGET:
            run.notes.append(
                f"batches: a row's frames take {per_row * 1e3:.2f} ms of decode (row 3), and "
                f"the window decodes on one refill thread: at most {1 / per_row / BATCH:.1f} "
                f"batches/s a core at resident_reuse 1 ({reuse / per_row / BATCH:.1f} at "
                f"{reuse:g}), against {rates[1]:.1f} and {rates[3]:.1f} from the raw store"
            )


def reuse_one(run: Run) -> tuple[list[list[float]], list[str], list[dict]]:
    """Rows 4 and 7's loaders, timed once: windowed DemonstrationDataModules over the
    encoded store at ``resident_reuse`` 1, single steps and ``--chunk``-step chunks, each
    alone (at reuse 1 a loader's refill thread always has a block in flight: timed in turn
    with another loader, that one's refill would take cores and CPU time from it)."""
    if run.reuse_one is None:
        args = run.args
        horizons = [1, args.chunk] if args.chunk > 1 else [1]
        times, keys, info = [], [], []
        for h in horizons:
            t, keys, i = demo_rates(
                run.enc, chunk_budget(run), run.sizes, 4 * args.steps, args.repeats, 1,
                [(h, None)],
            )  # fmt: skip
            times += t
            info += i
        run.reuse_one = (times, keys, info)
    return run.reuse_one


def chunk_budget(run: Run) -> int:
    """Rows 4, 6, 7 and 8's window budget: row 2's, or two blocks of whole episodes and a
    spare where that is more."""
    row_bytes = sum(h * w * 3 for h, w in run.sizes.values()) + 2 * 4 * DIM
    return max(run.budget, int(3.3 * run.args.frames * row_bytes))


def row_lerobot(run: Run) -> None:
    args = run.args
    times, _, _ = reuse_one(run)
    steps = 4 * args.steps
    ours = [steps * CHUNK_BATCH / statistics.median(t) for t in times]
    theirs = lerobot_rate(args.lerobot_python, run.lerobot, args.lerobot_steps, run.tmp,
                          args.chunk)  # fmt: skip
    target = f"torchstore vs LeRobotDataset >= {LEROBOT_TARGET:g}x"
    if isinstance(theirs, str):
        print(f"\n4. against LeRobot: {theirs}")
        run.targets.append((target, "skipped (row 4)", "-"))
        return
    table = []
    horizons = [1, args.chunk] if args.chunk > 1 else [1]
    for k, horizon in enumerate(horizons):
        table.append(
            ("windowed DemonstrationDataModule, encoded, reuse 1", horizon, f"{ours[k]:,.1f}", "")
        )
        for case in theirs["cases"]:
            if case["horizon"] != horizon:
                continue
            ratio = ours[k] / case["samples_per_s"]
            table.append((f"{case['loader']} + DataLoader", horizon,
                          f"{case['samples_per_s']:,.1f}", f"{ratio:.1f}x"))  # fmt: skip
            if case["loader"] == "LeRobotDataset":
                run.targets.append((f"{target} (action horizon {horizon})", f"{ratio:.1f}x",
                                    met(ratio >= LEROBOT_TARGET)))  # fmt: skip
    if not theirs.get("lance"):
        run.notes.append("LanceDBDataset: not timed (lerobot-lancedb is not in the lerobot venv)")
    shapes = ", ".join(f"{k} {v}" for k, v in theirs["cases"][-1]["shapes"].items())
    print_table(
        f"4. against LeRobot (batch {CHUNK_BATCH}, samples/s; its {theirs['backend']} "
        f"backend, num_workers={theirs['workers']}, {args.lerobot_steps} batches after "
        f"{theirs['warmup']}, run after the torchstore side; its chunk batch: {shapes})",
        ("loader", "action_horizon", "samples/s", "torchstore vs it"),
        table,
    )


def row_ceiling(run: Run) -> None:
    """7: rows decoded per second at reuse 1 against the ceiling: the cores times one
    thread's sequential decode of the same streams (row 3's ``out=`` figure, both cameras).
    Printed beside it, not a target: the CPU a row of as many sequential decodes as cores
    at once, which is what the cores cost each other when every one of them decodes."""
    args = run.args
    decode = run.decode or decode_rates(run.enc, run.tmp, run.sizes, args.repeats)
    per_row = sum(statistics.median(cpu[2]) / n for _, n, cpu, _, _ in decode)
    n = cores()
    ceiling = n / per_row
    together = decodes_at_once(run.enc, run.sizes, n, args.repeats)
    _, _, info = reuse_one(run)
    got = info[0]["rows_per_s"]
    print_table(
        f"7. decode at the ceiling (windowed DemonstrationDataModule, reuse 1, single steps; "
        f"{n} cores; one thread decodes a row's cameras in {per_row * 1e3:.2f} ms of CPU; "
        f"load average {os.getloadavg()[0]:.1f}: other processes' CPU is not ours)",
        ("rows decoded/s", "ceiling: cores x one thread's rate", "of the ceiling",
         "cores used", "CPU a row vs one thread's decode", "of it the training thread's"),
        [(f"{got:,.0f}", f"{ceiling:,.0f}", f"{got / ceiling:.2f}",
          f"{info[0]['cpu_per_s']:.2f} of {n}", f"{info[0]['cpu_per_row'] / per_row:.2f}x",
          f"{info[0]['main_per_row'] / per_row:.2f}x ({info[0]['main_per_row'] * 1e3:.2f} ms)")],
    )  # fmt: skip
    print(
        f"  {n} sequential decodes at once: {together * 1e3:.2f} ms of CPU a row, "
        f"{together / per_row:.2f}x one thread's alone (the cores' cost of working together); "
        f"the window's CPU a row is {info[0]['cpu_per_row'] / together:.2f}x theirs"
    )
    run.targets.append((f"decoded rows/s >= {CEILING_TARGET}x the ceiling (reuse 1)",
                        f"{got / ceiling:.2f}x", met(got / ceiling >= CEILING_TARGET)))  # fmt: skip


def row_resize(run: Run) -> None:
    """8: frames resized to 224x224 (``--quick``: 48x48) as they are decoded, against full
    size: rows per GiB of budget and samples/s, single steps at reuse 1 and at ``--reuse``."""
    args = run.args
    steps = 4 * args.steps
    size = [48, 48] if args.quick else [224, 224]
    table = []
    for reuse in (1, args.reuse):
        times, _, info = demo_rates(
            run.enc, chunk_budget(run), run.sizes, steps, args.repeats, reuse,
            [(1, None), (1, size)],
        )  # fmt: skip
        samples = [steps * CHUNK_BATCH / statistics.median(t) for t in times]
        for k, name in enumerate(("full size", f"{size[0]}x{size[1]}")):
            per_gib = info[k]["rows_per_gib"]
            table.append((
                name, f"{reuse:g}", f"{info[k]['row_bytes']:,}", f"{per_gib:,.0f}",
                f"{per_gib / info[0]['rows_per_gib']:.1f}x",
                f"{samples[k]:,.0f}", spread(times[0], times[k]) if k else "1.00x",
            ))  # fmt: skip
    print_table(
        f"8. resize in the refill (windowed DemonstrationDataModule over the encoded store, "
        f"single steps, batch {CHUNK_BATCH}, {args.repeats} x {steps} batches each, in turn)",
        ("frames", "reuse", "row bytes", "rows per GiB", "vs full", "samples/s", "vs full"),
        table,
    )


def row_sampling(run: Run) -> None:
    args = run.args
    print_table(
        "5. sampling quality (printed, not a target; an epoch is rows // batch batches)",
        ("draws from", "draws", "episodes drawn", "draws/episode", "rows drawn",
         "draws/row min-max", "expected/row"),
        draw_counts(run.enc, run.budget, run.rows, args.episodes, args.frames,
                    args.sampling_epochs),
    )  # fmt: skip


def row_chunks(run: Run) -> None:
    args = run.args
    steps = 4 * args.steps  # a quarter of row 2's batch: four times the batches
    budget = chunk_budget(run)
    times, keys = chunk_rates(
        run.enc, run.raw, budget, run.sizes, steps, args.repeats, args.reuse, args.chunk
    )
    samples = [steps * CHUNK_BATCH / statistics.median(t) for t in times]
    cases = [("raw uint8", 1), ("raw uint8", args.chunk), ("encoded", 1), ("encoded", args.chunk)]
    table = [
        (name, horizon, f"{samples[k]:,.0f}",
         spread(times[k - 1], times[k]) if k % 2 else "1.00x")
        for k, (name, horizon) in enumerate(cases)
    ]  # fmt: skip
    print_table(
        f"6. action chunks (windowed DemonstrationDataModule, batch {CHUNK_BATCH}, "
        f"{budget / 2**20:,.0f} MiB in 2 blocks of whole episodes, resident_reuse "
        f"{args.reuse:g}, {args.repeats} x {steps} batches each, the two of a store in "
        f"turn; chunk batch: {', '.join(keys)})",
        ("store", "action_horizon", "samples/s", "vs single step"),
        table,
    )
    for name, k in (("raw", 1), ("encoded", 3)):
        ratio = ratio_spread(times[k - 1], times[k])[0]
        run.targets.append((
            f"{args.chunk}-step chunk >= {CHUNK_TARGET}x single-step batches/s ({name}, "
            f"reuse {args.reuse:g})", f"{ratio:.2f}x", met(ratio >= CHUNK_TARGET),
        ))  # fmt: skip


#: the rows, in the order they run (rows 4 and 7 share their timings: see reuse_one)
ROWS = {
    1: row_disk,
    2: row_batches,
    3: row_decode,
    4: row_lerobot,
    5: row_sampling,
    6: row_chunks,
    7: row_ceiling,
    8: row_resize,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="aloha", help="the cameras (see SHAPES)"
    )
    parser.add_argument(
        "--source", choices=sorted(FRAME_SOURCES), default="photo",
        help="the frames: a photograph panned by a moving camera, or the reach task's renders",
    )  # fmt: skip
    parser.add_argument("--episodes", type=int, default=None, help="default: the shape's")
    parser.add_argument("--frames", type=int, default=None, help="frames per episode")
    parser.add_argument("--steps", type=int, default=8, help="batches per timed sample")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--resident-fraction",
        type=float,
        default=0.25,
        help="the window's byte budget, as a fraction of the decoded rows' bytes",
    )
    parser.add_argument(
        "--reuse", type=float, default=4.0, help="resident_reuse of the second pair of loaders"
    )
    parser.add_argument("--sampling-epochs", type=int, default=4)
    parser.add_argument("--lerobot-python", default=DEFAULT_LEROBOT_PYTHON)
    parser.add_argument("--lerobot-steps", type=int, default=4)
    parser.add_argument(
        "--chunk", type=int, default=50, help="steps of row 6's action chunk (0: skip row 6)"
    )
    parser.add_argument(
        "--rows", type=parse_rows, default=set(ROWS), help="the rows to run (1,2,...,8)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short check: frames 64x64 and 96x128, 6 episodes x 100, budget 50%%",
    )
    parser.add_argument("--dir", default=None, help="where the temporary datasets go")
    args = parser.parse_args(argv)
    sizes, episodes, frames = SHAPES[args.shape]
    args.episodes = episodes if args.episodes is None else args.episodes
    args.frames = frames if args.frames is None else args.frames
    if args.quick:
        sizes = QUICK_SIZES
        args.episodes, args.frames, args.resident_fraction = 6, 100, 0.5
        args.steps, args.repeats, args.lerobot_steps, args.sampling_epochs = 2, 3, 2, 2
    if args.chunk <= 0:
        args.rows.discard(6)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = args.episodes * args.frames
    row_bytes = sum(h * w * 3 for h, w in sizes.values()) + 2 * 4 * DIM
    budget = int(rows * row_bytes * args.resident_fraction)
    cams = ", ".join(f"{cam} {h}x{w}" for cam, (h, w) in sizes.items())
    print(
        f"{args.episodes} episodes x {args.frames} frames at {FPS} fps; cameras {cams} "
        f"({args.shape}, frames: {args.source}); "
        f"state, action f32[{DIM}]; batch {BATCH}; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at start; window budget {budget / 2**20:,.0f} MiB "
        f"({budget / (rows * row_bytes):.0%} of the decoded rows) for both stores"
    )
    run = Run(args, sizes, budget, rows)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        run.tmp = Path(tmp_name)
        t0 = time.perf_counter()
        need_lerobot = bool(args.rows & {1, 4})
        run.raw, run.enc, run.lerobot = write_all(
            run.tmp, args.episodes, args.frames, sizes, lerobot=need_lerobot, source=args.source
        )
        copies = "three copies" if need_lerobot else "two stores"
        print(f"(generated and wrote the {copies} in {time.perf_counter() - t0:.0f} s)")
        for number, row in ROWS.items():
            if number in args.rows:
                row(run)
    print_table("targets", ("target", "measured", "met"), run.targets)
    for note in run.notes:
        print(f"\n{note}")
    if any(ok.startswith("NO") for _, _, ok in run.targets):
        print("\nmissed targets say NO above; docs/benchmarks.md gives a reading of why")
    return 0


if __name__ == "__main__":
    sys.exit(main())
