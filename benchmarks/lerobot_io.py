"""The LeRobot v3.0 bridge: writer and import throughput, next to raw floors on the same data.

Generated datasets of a realistic shape (default 20 episodes x 300 frames at 30 fps; 50
episodes take about 6.5 minutes on 2 cores):
``observation.state`` float32[14], ``action`` float32[14] and one 96x96 camera whose
frames compress like camera images (smooth gradient background, a moving object, mild
noise; deterministic seed). Prints medians over ``--repeat`` runs:

- :class:`LeRobotWriter` frames/s, numbers only: ``add_frame`` per frame then
  ``save_episode``, and ``add_episode`` (one call per episode);
- the same with the camera as ``video`` (AV1, the default encoder settings) and as
  ``image`` (PNG bytes in the Parquet file), with the ms per ``save_episode`` (median,
  and first 5 vs last 5 saves);
- flat saves (``--long-episodes``, default 500 short episodes): the median
  ``save_episode`` time of the first 10 and the last 10 episodes, numbers only and with
  one 96x96 AV1 camera (target: last/first <= 1.3, as each save writes only its own
  episode's files), and the time of ``close()``, which merges them;
- ``import_lerobot`` of a ``--long-episodes`` x ``--export-frames`` numbers-only dataset
  next to pyarrow's ``read_table`` of its data files (target: at least half its rate),
  and ``export_lerobot`` of the store it made next to that import (target: export within
  3x of import);
- ``import_lerobot`` frames/s of each of the three datasets into a trajectory store
  (decode, checks and the HDF5 write included), next to the floors on the same files:
  ``pyarrow.parquet.read_table`` of the data files, a PyAV decode of the MP4 (decode
  only; decoded to rgb24 arrays as the import needs, with one shared
  ``VideoReformatter`` as the import does it, and with ``frame.to_ndarray`` per frame,
  which builds a converter per frame and is 5x slower), and a PIL decode of the PNGs.

Every dataset lives in a temporary folder that is removed at the end.

Usage: python benchmarks/lerobot_io.py [--episodes 20] [--frames 300] [--repeat 3] [--quick]
       [--long-episodes 500] [--long-frames 30] [--export-frames 200] [--only-long]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from av.video.reformatter import VideoReformatter
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_per_call_interleaved  # noqa: E402

from torchstore.lerobot import LeRobotWriter, export_lerobot, import_lerobot  # noqa: E402

FPS = 30
HEIGHT = WIDTH = 96
DIM = 14
CAMERA = "observation.images.top"
TASKS = ("pick up the red cube", "push the block to the corner", "open the drawer")
SEED = 0


def features(camera: str | None) -> dict[str, dict]:
    """The user features; ``camera`` is None, ``"video"`` or ``"image"``."""
    out = {
        "observation.state": {"dtype": "float32", "shape": [DIM], "names": None},
        "action": {"dtype": "float32", "shape": [DIM], "names": None},
    }
    if camera is not None:
        out[CAMERA] = {
            "dtype": camera,
            "shape": [HEIGHT, WIDTH, 3],
            "names": ["height", "width", "channels"],
        }
    return out


def camera_frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uint8 [H, W, 3] frames: a tinted gradient, a disc on a loop, noise (sigma 2)."""
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    tint = rng.uniform(-20, 20, 3).astype(np.float32)
    background = (
        np.stack(
            [
                70 + 110 * xx / WIDTH,
                60 + 120 * yy / HEIGHT,
                150 - 70 * (xx + yy) / (HEIGHT + WIDTH),
            ],
            axis=-1,
        )
        + tint
    )
    t = np.arange(n, dtype=np.float32) / max(n, 1)
    phase = rng.uniform(0, 2 * np.pi)
    cx = WIDTH / 2 + 28 * np.cos(2 * np.pi * t + phase)
    cy = HEIGHT / 2 + 22 * np.sin(4 * np.pi * t + phase)
    disc = (xx - cx[:, None, None]) ** 2 + (yy - cy[:, None, None]) ** 2 <= 10.0**2
    frames = np.repeat(background[None], n, axis=0)
    frames[disc] = (200.0, 40.0, 40.0)
    frames += rng.standard_normal(frames.shape, dtype=np.float32) * 2
    return np.clip(frames, 0, 255).round().astype(np.uint8)


def make_episode(episode: int, n: int, camera: str | None) -> dict[str, np.ndarray]:
    """One episode's frames, the same for a given ``episode`` whatever the camera."""
    rng = np.random.default_rng([SEED, episode])
    t = np.arange(n, dtype=np.float32)[:, None] / FPS
    freq = rng.uniform(0.2, 1.5, DIM).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, DIM).astype(np.float32)
    state = np.sin(freq * t + phase) + 0.01 * rng.standard_normal((n, DIM), dtype=np.float32)
    action = np.roll(state, -1, axis=0) + 0.01 * rng.standard_normal((n, DIM), dtype=np.float32)
    out = {"observation.state": state.astype(np.float32), "action": action.astype(np.float32)}
    if camera is not None:
        out[CAMERA] = camera_frames(rng, n)
    return out


def write_dataset(
    root: Path, camera: str | None, episodes: int, frames: int, *, batch: bool
) -> dict[str, list[float]]:
    """Record a dataset; returns the seconds of each episode's add_frame loop and save."""
    timings: dict[str, list[float]] = {"add": [], "save": []}
    with LeRobotWriter(
        root, fps=FPS, features=features(camera), robot_type="bench_arm", overwrite=True
    ) as writer:
        for ep in range(episodes):
            data = make_episode(ep, frames, camera)  # generating frames is not timed
            task = TASKS[ep % len(TASKS)]
            if batch:
                t0 = time.perf_counter()
                writer.add_episode(data, task=task)
                timings["add"].append(0.0)
                timings["save"].append(time.perf_counter() - t0)
                continue
            rows = [{k: v[i] for k, v in data.items()} for i in range(frames)]
            t0 = time.perf_counter()
            for row in rows:
                writer.add_frame(row, task=task)
            t1 = time.perf_counter()
            writer.save_episode()
            timings["add"].append(t1 - t0)
            timings["save"].append(time.perf_counter() - t1)
    return timings


def folder_mib(root: Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in root.glob(pattern)) / 2**20


def data_files(root: Path) -> list[Path]:
    return sorted(root.glob("data/*/*.parquet"))


def video_files(root: Path) -> list[Path]:
    return sorted(root.glob(f"videos/{CAMERA}/*/*.mp4"))


def read_tables(root: Path) -> list[pa.Table]:
    return [pq.read_table(p) for p in data_files(root)]


def decode_mp4(root: Path, *, rgb: str | None) -> int:
    """Decode every frame of the camera's MP4s with PyAV (default decoder settings).

    ``rgb``: None (decode only), ``"per-frame"`` (``frame.to_ndarray(format="rgb24")``, as
    the import does: a new swscale context per frame) or ``"shared"`` (one
    ``VideoReformatter`` for the file; the same pixels).
    """
    count = 0
    for path in video_files(root):
        reformatter = VideoReformatter()
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                if rgb == "per-frame":
                    frame.to_ndarray(format="rgb24")
                elif rgb == "shared":
                    reformatter.reformat(frame, format="rgb24").to_ndarray()
                count += 1
    return count


def decode_pngs(tables: list[pa.Table]) -> int:
    count = 0
    for table in tables:
        for cell in table.column(CAMERA).to_pylist():
            with Image.open(io.BytesIO(cell["bytes"])) as img:
                np.asarray(img.convert("RGB"))
            count += 1
    return count


def print_markdown(title: str, header: tuple[str, ...], rows: list[tuple]) -> None:
    """A markdown table: first column left-aligned, the others right-aligned."""
    text = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(3, *(len(r[i]) for r in text)) for i in range(len(header))]

    def line(cells) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths))
            )
            + " |"
        )

    print(f"\n{title}\n")
    print(line(text[0]))
    print(
        "| "
        + " | ".join(
            ":" + "-" * (w - 1) if j == 0 else "-" * (w - 1) + ":" for j, w in enumerate(widths)
        )
        + " |"
    )
    for r in text[1:]:
        print(line(r))


def fps(frames: int, seconds: float) -> str:
    return f"{frames / seconds:,.0f}"


def flat_saves(
    root: Path, camera: str | None, episodes: int, frames: int
) -> tuple[list[float], float]:
    """Seconds of each ``save_episode`` (frames added one by one first, untimed), and of close()."""
    saves = []
    writer = LeRobotWriter(root, fps=FPS, features=features(camera), overwrite=True)
    for ep in range(episodes):
        data = make_episode(ep, frames, camera)
        for i in range(frames):
            writer.add_frame({k: v[i] for k, v in data.items()}, task=TASKS[ep % len(TASKS)])
        t0 = time.perf_counter()
        writer.save_episode()
        saves.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    writer.close()
    return saves, time.perf_counter() - t0


def met(ok: bool) -> str:
    return "met" if ok else "NO"


def long_recording(tmp: Path, episodes: int, frames: int, export_frames: int, repeat: int) -> None:
    rows = []
    for name, camera in (("numbers only", None), ("one 96x96 AV1 camera", "video")):
        ratios, firsts, lasts, closes = [], [], [], []
        for _ in range(repeat):
            saves, close = flat_saves(tmp / "long", camera, episodes, frames)
            k = min(10, episodes // 2)
            first, last = statistics.median(saves[:k]), statistics.median(saves[-k:])
            firsts.append(first)
            lasts.append(last)
            ratios.append(last / first)
            closes.append(close)
        ratio = statistics.median(ratios)
        rows.append(
            (
                name,
                f"{statistics.median(firsts) * 1e3:.1f}",
                f"{statistics.median(lasts) * 1e3:.1f}",
                f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                met(ratio <= 1.3),
                f"{statistics.median(closes):.2f}",
            )
        )
    print_markdown(
        f"save_episode of the first 10 vs the last 10 of {episodes} episodes x {frames} frames "
        f"(median ms; ratio median and range over {repeat} runs; target last/first <= 1.3)",
        ("case", "first 10 ms", "last 10 ms", "last/first", "target", "close() s"),
        rows,
    )
    # export: a store of `episodes` episodes, exported back next to the import that made it
    source, store, out = tmp / "export-src", tmp / "export.h5", tmp / "export-out"
    with LeRobotWriter(source, fps=FPS, features=features(None), overwrite=True) as writer:
        for ep in range(episodes):
            writer.add_episode(make_episode(ep, export_frames, None), task=TASKS[ep % len(TASKS)])
    imports, exports, reads = [], [], []
    import_lerobot(source, store, overwrite=True, progress=False)  # untimed warm-up
    for _ in range(repeat):  # in turn, so a noisy spell hits all three alike
        t0 = time.perf_counter()
        read_tables(source)
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        import_lerobot(source, store, overwrite=True, progress=False)
        imports.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        export_lerobot(store, out, overwrite=True, progress=False)
        exports.append(time.perf_counter() - t0)
    speed = [r / i for r, i in zip(reads, imports)]
    print_markdown(
        f"import_lerobot of the {episodes} x {export_frames}-frame numbers-only dataset vs pyarrow "
        f"read_table of its data files (median s over {repeat} runs; target import >= 0.5x "
        "read_table's rate; a store's fixed creation cost, about 0.1 s, dominates small datasets)",
        ("read_table s", "import s", "import/read_table rate", "target"),
        [
            (
                f"{statistics.median(reads):.3f}",
                f"{statistics.median(imports):.3f}",
                f"{statistics.median(speed):.2f}x ({min(speed):.2f}-{max(speed):.2f})",
                met(statistics.median(speed) >= 0.5),
            )
        ],
    )
    ratios = [e / i for e, i in zip(exports, imports)]
    ratio = statistics.median(ratios)
    print_markdown(
        f"export_lerobot of a {episodes}-episode store ({episodes} x {export_frames} frames, "
        f"numbers only) vs the import_lerobot that made it (median s over {repeat} runs; "
        "target export <= 3x import)",
        ("import s", "export s", "export/import", "target"),
        [
            (
                f"{statistics.median(imports):.2f}",
                f"{statistics.median(exports):.2f}",
                f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                met(ratio <= 3.0),
            )
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--frames", type=int, default=300, help="frames per episode")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (median)")
    parser.add_argument("--quick", action="store_true", help="10 episodes x 100 frames")
    parser.add_argument(
        "--long-episodes", type=int, default=500, help="episodes of the flat-save and export runs"
    )
    parser.add_argument(
        "--long-frames", type=int, default=30, help="frames per episode of the flat-save run"
    )
    parser.add_argument(
        "--export-frames", type=int, default=200, help="frames per episode of the export run"
    )
    parser.add_argument(
        "--only-long", action="store_true", help="only the flat-save and export runs"
    )
    args = parser.parse_args()
    episodes, frames = (10, 100) if args.quick else (args.episodes, args.frames)
    if episodes < 1 or frames < 1 or args.repeat < 1:
        parser.error("--episodes, --frames and --repeat must be positive")
    total = episodes * frames
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"LeRobot v3.0 datasets: {episodes} episodes x {frames} frames = {total:,} frames at "
        f"{FPS} fps; state/action float32[{DIM}], camera {HEIGHT}x{WIDTH} RGB; "
        f"median of {args.repeat}"
    )
    print(
        f"machine: {os.cpu_count()} CPUs ({affinity} usable), torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads, PyAV {av.__version__} (FFmpeg "
        f"{'.'.join(map(str, av.library_versions['libavcodec']))} libavcodec), "
        f"pyarrow {pa.__version__}"
    )

    cases = [  # name, camera, batch
        ("numbers only, add_frame + save_episode", None, False),
        ("numbers only, add_episode", None, True),
        ("video camera (AV1), add_frame + save_episode", "video", False),
        ("image camera (PNG), add_frame + save_episode", "image", False),
    ]
    with tempfile.TemporaryDirectory(prefix="torchstore-lerobot-bench-") as tmp:
        tmp = Path(tmp)
        if args.long_episodes >= 2:
            long_recording(
                tmp, args.long_episodes, args.long_frames, args.export_frames, args.repeat
            )
        if args.only_long:
            return
        roots = {name: tmp / f"ds{k}" for k, (name, _, _) in enumerate(cases)}
        runs: dict[str, list[dict[str, list[float]]]] = {name: [] for name, _, _ in cases}
        for _, camera, batch in cases:  # untimed warm-up: first imports, encoder start-up
            write_dataset(tmp / "warmup", camera, 2, min(frames, 10), batch=batch)
        for _ in range(args.repeat):  # cases in turn, so a noisy spell hits them alike
            for name, camera, batch in cases:
                runs[name].append(write_dataset(roots[name], camera, episodes, frames, batch=batch))

        rows = []
        for name, _, batch in cases:
            totals = [sum(r["add"]) + sum(r["save"]) for r in runs[name]]
            adds = [sum(r["add"]) for r in runs[name]]
            per_save = [
                statistics.median(r["save"][i] for r in runs[name]) for i in range(episodes)
            ]
            k = min(5, episodes)
            first, last = statistics.median(per_save[:k]), statistics.median(per_save[-k:])
            root = roots[name]
            size = folder_mib(root, "data/*/*.parquet") + folder_mib(root, "videos/**/*.mp4")
            rows.append(
                (
                    name,
                    fps(total, statistics.median(totals)),
                    "" if batch else f"{statistics.median(adds) / total * 1e6:.0f}",
                    f"{statistics.median(per_save) * 1e3:.1f}",
                    f"{first * 1e3:.1f}",
                    f"{last * 1e3:.1f}",
                    f"{last / first:.2f}x",
                    f"{size:.1f}",
                )
            )
        print_markdown(
            f"LeRobotWriter (frames/s end to end; ms per save_episode, add_episode for the "
            f"batch row; first/last {min(5, episodes)} saves)",
            (
                "case",
                "frames/s",
                "add_frame us/frame",
                "save ms",
                "first saves ms",
                "last saves ms",
                "last/first",
                "dataset MiB",
            ),
            rows,
        )

        numeric, video, image = (roots[cases[k][0]] for k in (0, 2, 3))
        dest = tmp / "imported.h5"

        def importer(root: Path):
            return lambda: import_lerobot(root, dest, overwrite=True, progress=False)

        n_mp4 = decode_mp4(video, rgb=None)
        if n_mp4 != total:
            raise RuntimeError(f"the MP4s hold {n_mp4} frames, expected {total}")
        tables = read_tables(image)
        floors = {
            "read_table, numbers": lambda: read_tables(numeric),
            "read_table, video dataset (numbers)": lambda: read_tables(video),
            "read_table, image dataset (numbers + PNG bytes)": lambda: read_tables(image),
            "MP4 decode only (PyAV)": lambda: decode_mp4(video, rgb=None),
            "MP4 decode + to_ndarray(rgb24) per frame": lambda: decode_mp4(video, rgb="per-frame"),
            "MP4 decode + rgb24, one shared reformatter": lambda: decode_mp4(video, rgb="shared"),
            "PNG decode, bytes in memory (PIL)": lambda: decode_pngs(tables),
            "read_table + MP4 decode + rgb24 (shared)": lambda: (
                read_tables(video),
                decode_mp4(video, rgb="shared"),
            ),
            "read_table + PNG decode": lambda: decode_pngs(read_tables(image)),
        }
        imports = {
            "numbers only": importer(numeric),
            "video camera (AV1)": importer(video),
            "image camera (PNG)": importer(image),
        }
        names = [*imports, *floors]
        # imports and floors timed in turn (A B C ... A B C), so noise hits them alike
        seconds = dict(
            zip(
                names,
                median_per_call_interleaved(
                    [*imports.values(), *floors.values()], repeats=args.repeat, warmup=1
                ),
            )
        )

        rows = []
        for case, floor_names in (
            ("numbers only", ["read_table, numbers"]),
            (
                "video camera (AV1)",
                [
                    "MP4 decode only (PyAV)",
                    "read_table + MP4 decode + rgb24 (shared)",
                    "MP4 decode + to_ndarray(rgb24) per frame",
                ],
            ),
            (
                "image camera (PNG)",
                ["PNG decode, bytes in memory (PIL)", "read_table + PNG decode"],
            ),
        ):
            for j, floor in enumerate(floor_names):
                rows.append(
                    (
                        case if j == 0 else "",
                        fps(total, seconds[case]) if j == 0 else "",
                        floor,
                        fps(total, seconds[floor]),
                        f"{seconds[floor] / seconds[case]:.2f}x",
                    )
                )
        print_markdown(
            "import_lerobot into a trajectory store "
            "(frames/s; vs floor = import rate / floor rate)",
            ("dataset", "import frames/s", "floor", "floor frames/s", "vs floor"),
            rows,
        )
        print_markdown(
            "floors on the same files (frames/s)",
            ("floor", "frames/s"),
            [(name, fps(total, seconds[name])) for name in floors],
        )


if __name__ == "__main__":
    main()
