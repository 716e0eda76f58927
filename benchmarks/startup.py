"""Start-up time: ``torchstore --help``, ``--version`` and ``import torchstore``.

Each case runs in a fresh interpreter (a subprocess), several times; the median is
printed next to its target. Targets: ``--help`` and ``--version`` under 0.5 s (they import
no torch), ``import torchstore`` under 0.5 s (names are imported on first use). For scale,
the last rows time what a first use of the heavy names costs.

The second table times a short script that opens a store and draws from a prioritized
sampler (the compiled sum-tree kernels): in a first process, with an empty kernel cache
(numba compiles every kernel), and in a second one, which loads them from the cache. It
prints the whole script and the part after the imports.

Run: ``python benchmarks/startup.py [--repeats 7]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _timing import print_table

PY = sys.executable
CASES = [
    ("torchstore --help", [PY, "-m", "torchstore.cli", "--help"], 0.5),
    ("torchstore --version", [PY, "-m", "torchstore.cli", "--version"], 0.5),
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


def _median_s(argv: list[str], repeats: int) -> float:
    subprocess.run(argv, check=True, capture_output=True)  # warm the file cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs per case (median)")
    args = parser.parse_args()
    cases = list(CASES)
    script = shutil.which("torchstore")
    if script:  # the installed console script, as a user types it
        cases.insert(0, ("torchstore --help (console script)", [script, "--help"], 0.5))
    rows = []
    for name, argv, target in cases:
        seconds = _median_s(argv, args.repeats)
        verdict = "-" if target is None else ("met" if seconds < target else "NO")
        rows.append(
            (
                name,
                f"{seconds * 1000:.0f} ms",
                "-" if target is None else f"< {target * 1000:.0f} ms",
                verdict,
            )
        )
    print_table(
        f"start-up, median of {args.repeats} fresh processes",
        ("case", "median", "target", "met"),
        rows,
    )
    print_table(
        "a store and a prioritized draw (numba kernels), one run each",
        ("process", "whole script", "after its imports"),
        sampling_start(),
    )


if __name__ == "__main__":
    main()
