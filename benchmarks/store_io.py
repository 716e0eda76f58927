"""Trajectory-store I/O against bare h5py and raw numpy, measured side by side in one run.

A walker-shaped store: 26 float32 per row, laid out as one column of 26 and as five
columns (qpos[9], qvel[9], action[6], reward, discount). Prints medians and ratios:

- append MiB/s, many small episodes (1000 rows, a commit each) and bulk (65536-row
  episodes), next to a bare h5py chunked append (same chunks, no checksum, no commits)
  and a raw numpy write of the same bytes;
- stream-back MiB/s with checksum verification, next to a bare h5py read of an
  unfiltered dataset and a raw file read;
- one 4096-row minibatch of scattered rows from the resident store next to a bare
  ``torch.index_select`` on one tensor holding the same bytes;
- one 4096-row contiguous slab from disk.

Usage: python benchmarks/store_io.py [--rows 1000000] [--big] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_per_call_interleaved, median_time, print_table  # noqa: E402

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.io.hdf5.checksummed import block_rows_for  # noqa: E402

ONE_COLUMN = (ColumnSpec("x", torch.float32, (26,)),)
FIVE_COLUMNS = (
    ColumnSpec("qpos", torch.float32, (9,)),
    ColumnSpec("qvel", torch.float32, (9,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("discount", torch.float32),
)


def split(data: np.ndarray, columns) -> dict[str, np.ndarray]:
    if len(columns) == 1:
        return {"x": data}
    return {
        "qpos": data[:, :9],
        "qvel": data[:, 9:18],
        "action": data[:, 18:24],
        "reward": data[:, 24],
        "discount": data[:, 25],
    }


def write_store(path: Path, columns, data: np.ndarray, episode_rows: int) -> None:
    parts = split(data, columns)
    with TrajectoryStoreWriter(path, columns, overwrite=True) as w:
        for a in range(0, len(data), episode_rows):
            w.add_episode({k: v[a : a + episode_rows] for k, v in parts.items()})


def bare_h5py_append(path: Path, data: np.ndarray, slab: int) -> None:
    with h5py.File(path, "w", libver="latest") as f:
        ds = f.create_dataset(
            "x", (0, 26), maxshape=(None, 26), chunks=(block_rows_for(104), 26), dtype="f4"
        )
        for a in range(0, len(data), slab):
            part = data[a : a + slab]
            ds.resize(a + len(part), axis=0)
            ds.write_direct(part, dest_sel=np.s_[a : a + len(part)])


def raw_write(path: Path, data: np.ndarray) -> None:
    with open(path, "wb") as f:
        data.tofile(f)


def stream_store(path: Path, rows: int) -> None:
    with TrajectoryStore(path) as store:
        for _ in store.iter_slabs(rows):
            pass


def stream_bare(path: Path, rows: int, buf: np.ndarray) -> None:
    with h5py.File(path, "r") as f:
        ds = f["x"]
        for a in range(0, ds.shape[0], rows):
            n = min(rows, ds.shape[0] - a)
            ds.read_direct(buf[:n], source_sel=np.s_[a : a + n])


def stream_raw(path: Path, buf: np.ndarray) -> None:
    with open(path, "rb") as f:
        view = memoryview(buf).cast("B")
        while f.readinto(view):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--big", action="store_true", help="10 M rows")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()
    n = 10_000_000 if args.big else args.rows
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="torchstore-bench-"))
    data = np.random.default_rng(0).standard_normal((n, 26), dtype=np.float32)
    mib = data.nbytes / 2**20
    print(f"walker-shaped store: {n:,} rows x 26 float32 = {mib:.0f} MiB, scratch {tmp}")

    rows = []
    raw_s = median_time(lambda: raw_write(tmp / "raw.bin", data), repeats=3)
    for slab, label in (
        (1000, "1000-row episodes, commit each"),
        (65536, "65536-row episodes (bulk)"),
    ):
        bare = median_time(lambda: bare_h5py_append(tmp / "bare.h5", data, slab), repeats=3)
        for columns, name in ((ONE_COLUMN, "1 col"), (FIVE_COLUMNS, "5 cols")):
            ours = median_time(lambda: write_store(tmp / "ours.h5", columns, data, slab), repeats=3)
            rows.append(
                (
                    f"{label}, {name}",
                    f"{mib / ours:.0f}",
                    f"{mib / bare:.0f}",
                    f"{bare / ours:.2f}x",
                    f"{mib / raw_s:.0f}",
                    f"{raw_s / ours:.2f}x",
                )
            )
    print_table(
        "append (MiB/s, median of 3)",
        ("case", "torchstore", "bare h5py", "vs h5py", "raw numpy", "vs raw"),
        rows,
    )

    rows = []
    buf = np.empty((65536, 26), np.float32)
    bare_h5py_append(tmp / "bare.h5", data, 65536)
    bare_read = median_time(lambda: stream_bare(tmp / "bare.h5", 65536, buf), repeats=5)
    raw_read = median_time(lambda: stream_raw(tmp / "raw.bin", buf), repeats=5)
    for columns, name in ((ONE_COLUMN, "1 col"), (FIVE_COLUMNS, "5 cols")):
        write_store(tmp / "ours.h5", columns, data, 65536)
        ours = median_time(lambda: stream_store(tmp / "ours.h5", 65536), repeats=5)
        rows.append(
            (
                f"65536-row slabs, verified, {name}",
                f"{mib / ours:.0f}",
                f"{mib / bare_read:.0f}",
                f"{bare_read / ours:.2f}x",
                f"{mib / raw_read:.0f}",
                f"{raw_read / ours:.2f}x",
            )
        )
    print_table(
        "stream back (MiB/s, page cache warm, median of 5)",
        ("case", "torchstore", "bare h5py", "vs h5py", "raw read", "vs raw"),
        rows,
    )

    rows = []
    floor_tensor = torch.from_numpy(data)
    gen = torch.Generator().manual_seed(0)
    idx = [torch.randint(0, n, (4096,), generator=gen) for _ in range(64)]
    it = iter(range(10**9))
    starts = np.random.default_rng(1).integers(0, n - 4096, 64)
    for columns, name in ((ONE_COLUMN, "1 col"), (FIVE_COLUMNS, "5 cols")):
        write_store(tmp / "ours.h5", columns, data, 65536)
        with TrajectoryStore(tmp / "ours.h5") as store:
            view = store.resident()

            def contiguous_slab() -> None:
                start = int(starts[next(it) % 64])
                store.read_slab(start, start + 4096)

            # the gather and its floor are timed in turn, so a noisy spell hits both alike
            ours, floor = median_per_call_interleaved(
                [
                    lambda: view.gather(idx[next(it) % 64]),
                    lambda: torch.index_select(floor_tensor, 0, idx[next(it) % 64]),
                ],
                inner=20,
                repeats=31,
                warmup=3,
            )
            slab = median_time(contiguous_slab, repeats=101, warmup=5)
        rows.append(
            (
                f"4096 scattered rows, resident, {name}",
                f"{ours * 1e3:.3f}",
                f"{floor * 1e3:.3f}",
                f"{ours / floor:.2f}x",
            )
        )
        rows.append((f"4096-row contiguous slab from disk, {name}", f"{slab * 1e3:.3f}", "", ""))
    print_table(
        "minibatch (ms, median)", ("case", "torchstore", "index_select floor", "ratio"), rows
    )
    for f in ("raw.bin", "bare.h5", "ours.h5"):
        if (tmp / f).exists():
            os.unlink(tmp / f)


if __name__ == "__main__":
    main()
