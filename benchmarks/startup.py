"""Start-up time: the commands a new user types first, ``--help`` and ``import torchstore``.

Each case runs in a fresh interpreter (a subprocess), several times; the median wall time
and the median CPU time the process used (user + system: what an idle machine's wall time
would be, near enough, on a loaded one) are printed next to the target. Targets:
``--help`` and ``--version`` under 0.5 s; ``info`` and ``verify`` of a store or a LeRobot
folder, and an ``import`` up to where it needs torch (sniffed, then refused because DEST
exists), under 1 s: they read manifests, checksums and footers with h5py, numpy, xxhash
and pyarrow, and import no torch; ``import torchstore`` under 0.5 s (names are imported on
first use). For scale, the last rows time what a first use of the heavy names and a whole
(small) robomimic import cost.

The second table times a short script that opens a store and draws from a prioritized
sampler (the compiled sum-tree kernels): in a first process, with an empty kernel cache
(numba compiles every kernel), and in a second one, which loads them from the cache. It
prints the whole script and the part after the imports.

Run: ``python benchmarks/startup.py [--repeats 7] [--no-sampling]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import print_table

PY = sys.executable
CLI = [PY, "-m", "torchstore.cli"]


def _data(folder: Path) -> dict[str, str]:
    """What the commands read: a camera store, a LeRobot folder exported from it (AV1
    video), a small robomimic file; written once, before any case is timed."""
    import h5py
    import numpy as np

    from torchstore.lerobot import export_lerobot
    from torchstore.tasks import write_demo_data

    store = write_demo_data(folder / "reach.h5", episodes=20)
    export_lerobot(store, folder / "lerobot", fps=10, task="reach", progress=False)
    with h5py.File(folder / "lift.hdf5", "w") as f:
        for i in range(5):
            f[f"data/demo_{i}/actions"] = np.zeros((50, 7), np.float32)
            f[f"data/demo_{i}/obs/eef_pos"] = np.zeros((50, 3), np.float32)
            f[f"data/demo_{i}"].attrs["num_samples"] = 50
    return {
        "store": str(store),
        "lerobot": str(folder / "lerobot"),
        "robomimic": str(folder / "lift.hdf5"),
        "fresh": str(folder / "imported.h5"),
    }


def cases(data: dict[str, str]) -> list[tuple[str, list[str], float | None]]:
    """``(name, argv, target seconds or None)``; ``import ... (whole)`` removes its output
    before each run, so every run imports."""
    store, lerobot, robomimic = data["store"], data["lerobot"], data["robomimic"]
    return [
        ("torchstore --help", [*CLI, "--help"], 0.5),
        ("torchstore --version", [*CLI, "--version"], 0.5),
        ("torchstore encode --help", [*CLI, "encode", "--help"], 0.5),
        ("torchstore info STORE", [*CLI, "info", store], 1.0),
        ("torchstore verify STORE", [*CLI, "verify", store, "--no-progress"], 1.0),
        ("torchstore info LEROBOT", [*CLI, "info", lerobot], 1.0),
        ("torchstore verify LEROBOT", [*CLI, "verify", lerobot], 1.0),
        (
            "torchstore import ROBOMIMIC STORE (sniffed, refused: exists)",
            [*CLI, "import", robomimic, store],
            1.0,
        ),
        ("import torchstore", [PY, "-c", "import torchstore"], 0.5),
        ("python (empty interpreter)", [PY, "-c", "pass"], None),
        (
            "torchstore.TrajectoryStore (first use)",
            [PY, "-c", "import torchstore; torchstore.TrajectoryStore"],
            None,
        ),
        (
            "torchstore.UniformSampler (first use)",
            [PY, "-c", "import torchstore; torchstore.UniformSampler"],
            None,
        ),
        (
            "torchstore import ROBOMIMIC NEW (whole, 5 demos)",
            [*CLI, "import", robomimic, data["fresh"], "--no-progress"],
            None,
        ),
    ]


#: opens a store, fills a prioritized replay buffer from it, draws, updates, draws again;
#: prints the seconds its imports took
SAMPLING_SNIPPET = """
import sys, time
t0 = time.perf_counter()
import torch
from torchrl.data import TensorDictReplayBuffer
from torchstore import PrioritizedSampler, TrajectoryStore
from torchstore.data.replay import StoreReplay
from torchstore.demo import write_demo_store
print(time.perf_counter() - t0)
path = write_demo_store(sys.argv[1], episodes=20, steps=100, seed=0, overwrite=True)
with TrajectoryStore(path) as store:
    rb = TensorDictReplayBuffer(
        storage=StoreReplay.from_store(store),
        sampler=PrioritizedSampler(10_000, alpha=0.6, beta=0.4, seed=0),
        priority_key="td_error",
        batch_size=256,
    )
    batch = rb.sample()
    batch.set("td_error", torch.rand(256))
    rb.update_tensordict_priority(batch)
    rb.sample()
"""


def sampling_start() -> list[tuple]:
    """The sampling snippet in a first process (empty kernel cache) and a second one."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(folder, "numba")}
        argv = [PY, "-c", SAMPLING_SNIPPET, os.path.join(folder, "s.h5")]
        for name in ("first process (kernels compiled)", "second process (kernels cached)"):
            t0 = time.perf_counter()
            done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
            total = time.perf_counter() - t0
            imports = float(done.stdout.split()[0])
            rows.append((name, f"{total:.2f} s", f"{total - imports:.2f} s"))
    return rows


def _run_once(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit status of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def _medians(argv: list[str], repeats: int, fresh: str) -> tuple[float, float, int]:
    def run() -> tuple[float, float, int]:
        if os.path.exists(fresh):
            os.remove(fresh)
        return _run_once(argv)

    run()  # warm the file cache
    runs = [run() for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        max(r[2] for r in runs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs per case (median)")
    parser.add_argument(
        "--no-sampling",
        action="store_true",
        help="skip the second table (its first process compiles every kernel)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        data = _data(Path(folder))
        todo = cases(data)
        script = shutil.which("torchstore")
        if script:  # the installed console script, as a user types it
            todo.insert(0, ("torchstore --help (console script)", [script, "--help"], 0.5))
        rows = []
        for name, argv, target in todo:
            wall, cpu, status = _medians(argv, args.repeats, data["fresh"])
            verdict = "-" if target is None else ("met" if wall < target else "NO")
            rows.append(
                (
                    name,
                    f"{wall * 1000:.0f} ms",
                    f"{cpu * 1000:.0f} ms",
                    status,
                    "-" if target is None else f"< {target * 1000:.0f} ms",
                    verdict,
                )
            )
    print_table(
        f"start-up, median of {args.repeats} fresh processes (os.cpu_count() = {os.cpu_count()})",
        ("case", "wall", "CPU", "exit", "target", "met"),
        rows,
    )
    if args.no_sampling:
        return
    print_table(
        "a store and a prioritized draw (numba kernels), one run each",
        ("process", "whole script", "after its imports"),
        sampling_start(),
    )


if __name__ == "__main__":
    main()
