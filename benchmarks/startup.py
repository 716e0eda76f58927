"""Start-up time: ``torchstore --help``, ``--version`` and ``import torchstore``.

Each case runs in a fresh interpreter (a subprocess), several times; the median is
printed next to its target. Targets: ``--help`` and ``--version`` under 0.5 s (they import
no torch), ``import torchstore`` under 0.5 s (names are imported on first use). For scale,
the last rows time what a first use of the heavy names costs.

Run: ``python benchmarks/startup.py [--repeats 7]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
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


if __name__ == "__main__":
    main()
