"""Demonstration formats: import and export speed against the library that reads the format.

robomimic-layout HDF5: ``import_robomimic`` against a bare h5py read of the same arrays
(every dataset of every demo read whole into numpy, nothing written), and
``export_robomimic`` against the import. Two files shaped like robomimic's releases:
``low_dim`` (float64 low-dimensional keys, uncompressed) and ``image`` (plus two 84x84x3
uint8 cameras, gzip, as ``dataset_states_to_obs.py --compress`` writes them). Medians of
alternating repeats (A B A B ...), so a slow spell on a shared machine hits both sides.

diffusion-policy zarr and RLDS have their own scripts (``formats_zarr.py``,
``formats_rlds.py``: the RLDS one runs tensorflow_datasets in its own venv); ``--all``
runs them after this one.

Usage: python benchmarks/formats.py [--demos 200] [--steps 150] [--repeats 5] [--all]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import print_table  # noqa: E402

from torchstore.formats import export_robomimic, import_robomimic  # noqa: E402

LOW_DIM = {"robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2, "object": 14}
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


def write_file(path: Path, demos: int, steps: int, images: bool) -> int:
    """A robomimic-release-shaped file; returns its bytes of array data."""
    rng = np.random.default_rng(0)
    nbytes = 0
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i in range(demos):
            ep = data.create_group(f"demo_{i}")
            arrays = {
                "actions": rng.uniform(-1, 1, (steps, 7)),
                "states": rng.normal(size=(steps, 45)),
                "rewards": np.zeros(steps),
                "dones": np.zeros(steps, np.int64),
            }
            for k, d in LOW_DIM.items():
                arrays[f"obs/{k}"] = rng.normal(size=(steps, d))
                arrays[f"next_obs/{k}"] = rng.normal(size=(steps, d))
            for k, v in arrays.items():
                ep.create_dataset(k, data=v)
                nbytes += v.nbytes
            if images:
                # smooth frames (gzip finds structure, as in rendered scenes), not noise
                base = rng.integers(0, 256, (1, 84, 84, 3), dtype=np.uint8)
                frames = (base + np.arange(steps, dtype=np.uint8)[:, None, None, None]).astype(
                    np.uint8
                )
                for cam in CAMERAS:
                    for group in ("obs", "next_obs"):
                        ep.create_dataset(f"{group}/{cam}", data=frames, compression="gzip")
                        nbytes += frames.nbytes
            ep.attrs["num_samples"] = steps
        data.attrs["total"] = demos * steps
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1, "env_kwargs": {}})
    return nbytes


def bare_read(path: Path) -> int:
    """Every dataset of every demo read whole; returns the bytes read."""
    total = [0]

    def read(_: str, obj) -> None:  # visititems stops at a callback that returns a value
        if isinstance(obj, h5py.Dataset):
            total[0] += obj[()].nbytes

    with h5py.File(path, "r") as f:
        for demo in f["data"].values():
            demo.visititems(read)
    return total[0]


def alternating(cases: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (setup, fn) in cases.items():
            setup()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def robomimic_rows(tmp: Path, demos: int, steps: int, repeats: int) -> list[tuple]:
    rows = []
    for kind, images in (("low_dim", False), ("image", True)):
        src = tmp / f"{kind}.hdf5"
        nbytes = write_file(src, demos, steps, images)
        store, out = tmp / f"{kind}.h5", tmp / f"{kind}_out.hdf5"
        import_robomimic(src, store, progress=False)  # warm the page cache once

        def clear(*paths):
            return lambda: [p.unlink(missing_ok=True) for p in paths]

        t = alternating(
            {
                "h5py": (lambda: None, lambda: bare_read(src)),
                "import": (clear(store), lambda: import_robomimic(src, store, progress=False)),
                "export": (clear(out), lambda: export_robomimic(store, out, progress=False)),
            },
            repeats,
        )
        mib = nbytes / 2**20
        rows.append(
            (
                f"robomimic {kind} ({demos} x {steps}, {mib:.0f} MiB)",
                f"{t['h5py'] * 1e3:.0f}",
                f"{t['import'] * 1e3:.0f}",
                f"{t['h5py'] / t['import']:.2f}x",
                f"{t['export'] * 1e3:.0f}",
                f"{t['export'] / t['import']:.2f}x",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=int, default=200)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    parser.add_argument("--all", action="store_true", help="then run formats_zarr and _rlds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = robomimic_rows(Path(tmp), args.demos, args.steps, args.repeats)
    print_table(
        f"robomimic-layout HDF5, medians of {args.repeats} alternating repeats (ms)",
        ("file", "h5py read", "import", "import speed vs h5py", "export", "export / import"),
        rows,
    )
    if args.all:
        here = Path(__file__).resolve().parent
        for script in ("formats_zarr.py", "formats_rlds.py"):
            subprocess.run([sys.executable, str(here / script)], check=True, env=os.environ)


if __name__ == "__main__":
    main()
