"""``torchstore verify`` against a plain read of the same file, side by side in one run.

Writes a store of about ``--mb`` MB (camera-like uint8 rows of 12 KiB, float observations
and actions), reads it once to put it in the page cache, then times (median of
``--repeats``) a plain read of the whole file in 1 MiB pieces (what ``cat`` does) and
:func:`~torchstore.data.store.verify.verify_store`. Target: verify at >= 0.5x the plain
read's MB/s (xxh3 hashes at several GB/s, so the read should be what costs). The last row
is the command as a user runs it, a new process: its start-up (importing torch) is most of
its time on a store of this size.

Run: ``python benchmarks/verify.py [--mb 111] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _timing import median_time, print_table

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.store.verify import verify_store

STEPS = 200  # rows per episode
IMAGE = (64, 64, 3)  # 12 KiB per row


def write_store(path: Path, mb: int) -> None:
    columns = [
        ColumnSpec("image", "uint8", IMAGE),
        ColumnSpec("obs", "float32", (32,)),
        ColumnSpec("action", "float32", (7,)),
    ]
    row_bytes = int(np.prod(IMAGE)) + 4 * (32 + 7)
    episodes = max(1, mb * 10**6 // (row_bytes * STEPS))
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(path, columns) as w:
        for _ in range(episodes):
            w.add_episode(
                {
                    "image": rng.integers(0, 256, (STEPS, *IMAGE), dtype=np.uint8),
                    "obs": rng.standard_normal((STEPS, 32), dtype=np.float32),
                    "action": rng.standard_normal((STEPS, 7), dtype=np.float32),
                }
            )


def plain_read(path: Path) -> None:
    buffer = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=111, help="store size to write, in MB")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "verify.h5"
        write_store(path, args.mb)
        size = os.path.getsize(path)
        plain_read(path)  # into the page cache
        read_s = median_time(lambda: plain_read(path), repeats=args.repeats)
        report = verify_store(path, progress=False)
        assert report.ok, report.verdict()
        verify_s = median_time(lambda: verify_store(path, progress=False), repeats=args.repeats)
        command = [sys.executable, "-m", "torchstore.cli", "verify", str(path), "--no-progress"]
        cli_s = median_time(
            lambda: subprocess.run(command, check=True, capture_output=True),
            repeats=min(3, args.repeats),
        )
    mb = size / 1e6
    print_table(
        f"verify of a {mb:.0f} MB store (file in the page cache; target: verify >= 0.5x read)",
        ("case", "seconds", "MB/s", "x read"),
        [
            ("plain read (1 MiB pieces)", f"{read_s:.3f}", f"{mb / read_s:,.0f}", "1.00"),
            (
                "torchstore verify",
                f"{verify_s:.3f}",
                f"{mb / verify_s:,.0f}",
                f"{read_s / verify_s:.2f}",
            ),
            (
                "torchstore verify (the command: a new process)",
                f"{cli_s:.3f}",
                f"{mb / cli_s:,.0f}",
                f"{read_s / cli_s:.2f}",
            ),
        ],
    )


if __name__ == "__main__":
    main()
