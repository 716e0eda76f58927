"""diffusion-policy zarr in and out: ``import_zarr`` next to zarr's own read, and export.

A generated zarr v2 store of a realistic size, laid out as diffusion-policy's
``ReplayBuffer`` writes it (default 25,000 rows in 200 episodes, PushT's keys: ``img``
uint8 96x96x3 rendered frames, ``state`` float32[5], ``action`` float32[2], ``keypoint``
float32[9, 2], ``n_contacts`` float32[1]; ``get_optimal_chunks`` chunks and
``Blosc(lz4, clevel=5, NOSHUFFLE)``, as its ``add_episode`` picks them). Timed in turn
(A B C A B C ...), medians over ``--repeat`` runs:

- zarr's read: open the group and read every ``data/`` array (and ``episode_ends``) fully
  into numpy, the floor an import cannot beat;
- ``import_zarr`` of the same store into a trajectory store (decode, checks, the HDF5 write
  with its checksums); target: at least 0.7x zarr's read rate, i.e. an import takes at
  most 1/0.7 of the read;
- ``export_zarr`` of that store back to a zarr v2 folder; target: within 2x of the import;
- the chunk check alone (part of the import): each stored chunk's Blosc header read and
  its sizes compared with the chunk's length (a stat and 16 bytes per chunk).

Everything lives in a temporary folder that is removed at the end. Timings only: no
value is asserted here (the tests check the values).

Usage: python benchmarks/formats_zarr.py [--rows 25000] [--episodes 200] [--repeat 5]
       [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.storage import LocalStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import print_table  # noqa: E402

from torchstore.formats.zarr_export import export_zarr, optimal_chunks  # noqa: E402
from torchstore.formats.zarr_import import import_zarr  # noqa: E402
from torchstore.formats.zarr_source import check_chunks, open_chunks, open_source  # noqa: E402

SIDE = 96
SEED = 0


def frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """PushT-like rendered frames: a flat floor, a grey T and a blue agent moving on it."""
    out = np.empty((n, SIDE, SIDE, 3), np.uint8)
    out[:] = (240, 240, 240)
    pos = rng.uniform(10, SIDE - 10, size=2)
    block = rng.uniform(20, SIDE - 20, size=2)
    for t in range(n):
        pos = np.clip(pos + rng.normal(0, 1.5, 2), 4, SIDE - 5)
        block = np.clip(block + rng.normal(0, 0.3, 2), 12, SIDE - 13)
        by, bx = block.astype(int)
        out[t, by - 10 : by - 6, bx - 10 : bx + 10] = (119, 136, 153)  # the T's bar
        out[t, by - 6 : by + 10, bx - 2 : bx + 2] = (119, 136, 153)  # its stem
        y, x = pos.astype(int)
        out[t, y - 3 : y + 3, x - 3 : x + 3] = (65, 105, 225)
    return out


def make_source(path: Path, rows: int, episodes: int) -> None:
    """The zarr v2 folder, array by array (each chunk encoded once)."""
    rng = np.random.default_rng(SEED)
    cuts = np.sort(rng.choice(np.arange(1, rows), size=episodes - 1, replace=False))
    ends = np.append(cuts, rows).astype(np.int64)
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)
    first = int(ends[0])  # add_episode sizes the chunks from the first episode's shape
    root = zarr.open_group(store=LocalStore(path), mode="w", zarr_format=2)
    data, meta = root.create_group("data"), root.create_group("meta")
    low_dim = {
        "state": rng.uniform(0, 512, (rows, 5)).astype(np.float32),
        "action": rng.uniform(0, 512, (rows, 2)).astype(np.float32),
        "keypoint": rng.uniform(0, 512, (rows, 9, 2)).astype(np.float32),
        "n_contacts": rng.integers(0, 3, (rows, 1)).astype(np.float32),
    }
    for key, value in low_dim.items():
        chunks = optimal_chunks((first, *value.shape[1:]), value.itemsize)
        arr = data.create_array(
            key, shape=value.shape, chunks=chunks, dtype=value.dtype, compressors=blosc,
            fill_value=0,
        )  # fmt: skip
        arr[:] = value
    chunks = optimal_chunks((first, SIDE, SIDE, 3), 1)
    img = data.create_array(
        "img", shape=(rows, SIDE, SIDE, 3), chunks=chunks, dtype=np.uint8, compressors=blosc,
        fill_value=0,
    )  # fmt: skip
    step = chunks[0] * 40
    for a in range(0, rows, step):
        img[a : min(a + step, rows)] = frames(rng, min(step, rows - a))
    ep = meta.create_array(
        "episode_ends", shape=ends.shape, chunks=ends.shape, dtype=np.int64, compressors=None,
        fill_value=0,
    )  # fmt: skip
    ep[:] = ends


def zarr_read(path: Path) -> int:
    root = zarr.open_group(store=LocalStore(path, read_only=True), mode="r")
    total = 0
    for _, arr in root["data"].arrays():
        total += np.asarray(arr[:]).nbytes
    total += root["meta"]["episode_ends"][:].nbytes
    return total


def chunk_check(path: Path) -> int:
    """What the import spends on checking stored chunks: every data array's, once."""
    with open_source(path) as root, open_chunks(path) as files:
        arrays = dict(root["data"].arrays())
        for key, arr in arrays.items():
            check_chunks(arr, f"data/{key}", str(path), files)
        return sum(int(np.prod(a.cdata_shape)) for a in arrays.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=25000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 rows, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.episodes, args.repeat = 2000, 20, 3
    tmp = Path(tempfile.mkdtemp(prefix="formats_zarr_"))
    try:
        source = tmp / "replay.zarr"
        t0 = time.perf_counter()
        make_source(source, args.rows, args.episodes)
        size = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
        raw = zarr_read(source)
        print(
            f"zarr {zarr.__version__}, numcodecs {numcodecs.__version__}: {args.rows} rows, "
            f"{args.episodes} episodes, {raw / 2**20:.0f} MiB raw, {size / 2**20:.0f} MiB on "
            f"disk (made in {time.perf_counter() - t0:.1f} s)"
        )
        times: dict[str, list[float]] = {"read": [], "import": [], "export": [], "check": []}
        n_chunks = chunk_check(source)
        store = tmp / "replay.h5"
        out = tmp / "export.zarr"
        for k in range(args.repeat + 1):  # the first round warms the page cache, untimed
            # the last round's outputs go first, untimed: freeing a 700 MB file's pages is
            # the benchmark's cost, not the import's
            store.unlink(missing_ok=True)
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            zarr_read(source)
            t1 = time.perf_counter()
            import_zarr(source, store, progress=False)
            t2 = time.perf_counter()
            export_zarr(store, out, progress=False)
            t3 = time.perf_counter()
            chunk_check(source)
            t4 = time.perf_counter()
            if k:
                times["read"].append(t1 - t0)
                times["import"].append(t2 - t1)
                times["export"].append(t3 - t2)
                times["check"].append(t4 - t3)
        med = {k: statistics.median(v) for k, v in times.items()}
        mib = raw / 2**20
        print_table(
            f"medians of {args.repeat} alternating runs",
            ("case", "s", "MiB/s", "rows/s"),
            [
                (
                    name,
                    f"{med[name]:.3f}",
                    f"{mib / med[name]:,.0f}",
                    f"{args.rows / med[name]:,.0f}",
                )
                for name in ("read", "import", "export")
            ],
        )
        print(
            f"\nchunk check (in the import): {med['check'] * 1e3:.1f} ms for {n_chunks} chunks, "
            f"{med['check'] / med['import']:.1%} of the import"
        )
        ratio = med["read"] / med["import"]
        print(
            f"import rate / zarr read rate: {ratio:.2f}x (target >= 0.7x)"
            f"\nexport time / import time:   {med['export'] / med['import']:.2f}x (target <= 2x)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
