"""Sampling from stores larger than the resident budget, side by side with fully resident.

Builds two stores on scratch disk (``--dir``, a temporary folder by default, removed at the
end unless ``--keep``):

- walker-shaped: ``--walker-rows`` rows of obs[17], action[6], reward, done, truncated
  (float32 and bool; 104 bytes a row packed), episodes of 1000 rows;
- pixels: ``--pixel-frames`` frames of pixels uint8[84, 84, 3], action[6], reward, done,
  episodes of 500 frames.

The issue-sized run is ``--walker-rows 10000000 --pixel-frames 300000`` (about 6 GiB of
pixels); the defaults are small enough for a shared 2-core machine.

For each store, every case runs in a fresh Python process (so its peak RSS is its own) and
prints, for an ``OfflineDataModule`` with ``batch_size=256``:

- batches/s drawing ``--batches`` pixel batches (``--walker-batches`` walker ones: a walker
  batch takes tens of microseconds, so its cases draw ten times as many to run about a
  second) with ``resident="all"`` and with a budget of
  ``--fraction`` of the store (``resident="<bytes>B"``, ``--blocks`` resident blocks), warm
  and cold (the store's pages dropped from the page cache with ``posix_fadvise(DONTNEED)``
  before the run, which needs no privileges; where it is unavailable the cold row says so;
  ``--drop-caches`` drops the whole page cache instead, as root); only the first pass over
  a store that fits in memory is cold: what it reads stays cached for later passes;
  target: windowed >= 0.8x resident; a second windowed case reads each block ``--reuse``
  times less often (``resident_reuse``: same expected frequency per row);
- refill throughput (bytes read by the window's thread / seconds reading, checksums
  verified) vs a bare h5py contiguous read of the same rows of the same datasets; target
  >= 0.5x;
- peak RSS above the process's RSS before the DataModule was built, vs the budget; target
  <= budget + 20 %. It includes the batches in flight (a pixel batch of 256 frames is
  5.4 MB), which a small budget feels most; "held MiB" is what the window holds (its
  slots and read buffer), which the budget bounds;
- the same DataModules in a Lightning ``fit`` loop (a linear model, ``--fit-steps`` steps):
  steps/s resident vs windowed.

Each case runs ``--repeats`` times, resident and windowed alternating, and the tables show
medians (a shared machine: quote the ratios). Every target row says met or not met. Beside
the wall-clock ratio the tables give two per-CPU-second ratios that load on the machine
leaves nearly alone: the sampling thread's (what drawing and gathering cost, waits on
refills left out) and the whole process's (the refill thread's reads and checksums in).
A window reading a block per pass over its rows (``--reuse 1``) reads as many bytes per
batch as a batch holds; for 84x84x3 frames that is 5.4 MB a batch read from the file,
hashed and copied, which costs more CPU than gathering the batch, and cold, more disk
bandwidth than a disk of a few hundred MB/s gives: only a larger reuse can keep up there.

Usage: python benchmarks/beyond_memory.py [--walker-rows 1000000] [--pixel-frames 10000]
       [--fraction 0.1] [--blocks 4] [--reuse 4] [--batches 2000]
       [--walker-batches 20000] [--fit-steps 300]
       [--repeats 1] [--dir DIR] [--keep] [--drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import print_table  # noqa: E402

from torchstore.data import TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.data.columns import ColumnSpec  # noqa: E402

BATCH = 256
WALKER = (
    ColumnSpec("obs", torch.float32, (17,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("truncated", torch.bool),
)
PIXELS = (
    ColumnSpec("pixels", torch.uint8, (84, 84, 3)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
)


def write_store(path: Path, columns, rows: int, episode: int) -> None:
    """Random columns, episodes of ``episode`` rows. Pixel episodes are two random
    episodes plus the episode number (no generator call per frame: a 6 GiB store is
    written at disk speed)."""
    rng = np.random.default_rng(0)
    pools = {
        spec.name: rng.integers(0, 256, (2, episode, *spec.shape), dtype=np.uint8)
        for spec in columns
        if spec.dtype == torch.uint8
    }
    with TrajectoryStoreWriter(path, columns, overwrite=True) as w:
        for i, start in enumerate(range(0, rows, episode)):
            n = min(episode, rows - start)
            end = np.zeros(n, dtype=bool)
            end[-1] = True
            ep = {}
            for spec in columns:
                if spec.dtype == torch.bool:
                    ep[spec.name] = end
                elif spec.dtype == torch.uint8:
                    ep[spec.name] = pools[spec.name][i % 2, :n] + np.uint8(i % 251)
                else:
                    ep[spec.name] = rng.standard_normal((n, *spec.shape), dtype=np.float32)
            w.add_episode(ep)


def drop_cache(path: Path, everything: bool = False) -> bool:
    """Drop the file's pages from the page cache (no privileges needed); False if unsupported.

    ``everything``: drop the whole page cache (``/proc/sys/vm/drop_caches``, root only;
    the file's pages alone where that is refused)."""
    if everything:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return True
        except OSError:
            pass
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------- one case (child)
def run_case(case: dict) -> dict:
    from torchstore.lightning import OfflineDataModule

    torch.set_num_threads(1)
    path = Path(case["store"])
    # warm the runtime (compiled kernels, the refill thread, Lightning) on a tiny store, so
    # the peak below is what the rows cost
    for budget in ("all", 400):
        warm = OfflineDataModule(
            case["warm"], batch_size=BATCH, device="cpu", resident=budget, steps_per_epoch=3
        )
        for _ in warm.train_dataloader():
            pass
        warm.close()
    del warm
    if case["fit"]:
        import lightning.pytorch  # noqa: F401
    cold = case["cold"] and drop_cache(path, case["drop_all"])
    base = rss_kib()
    peak_ok = reset_peak()
    kw = dict(batch_size=BATCH, device="cpu", seed=0, steps_per_epoch=case["batches"])
    if case["budget"] is not None:
        kw.update(
            resident=f"{case['budget']}B",
            resident_blocks=case["blocks"],
            resident_reuse=case["reuse"],
        )
    dm = OfflineDataModule(path, **kw)
    out: dict = {"cold": cold}
    t0 = time.perf_counter()
    dm.setup()
    t1 = time.perf_counter()
    out["per_s"], out["thread_per_s"], out["cpu_per_s"] = (fit if case["fit"] else iterate)(
        dm, case["batches"]
    )
    out["setup_s"] = t1 - t0
    peak = rss_kib("VmHWM") if peak_ok else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_kib"] = peak - base
    window = dm.window
    if window is None:
        out["data_bytes"] = dm._packed.nbytes
        return out
    s = window.stats
    out.update(
        waits=s["waits"],
        wait_s=s["wait_s"],
        refills=s["refills"],
        refill_mb_s=s["bytes"] / max(s["read_s"], 1e-9) / 1e6,
        data_bytes=window.packed.nbytes + window._reader.buffer_bytes,
        blocks=len(window.blocks),
    )
    if not case["fit"]:
        out["bare_mb_s"] = bare_read(window, case["cold"], case["drop_all"])
    dm.close()
    return out


def _rates(n: int, t: tuple[float, float, float]) -> tuple[float, float, float]:
    """Per second of wall time, of the calling thread's CPU time and of the process's CPU
    time (every thread: the refill thread's reads and checksums included) since ``t``."""
    now = (time.perf_counter(), time.thread_time(), time.process_time())
    return tuple(n / max(b - a, 1e-9) for a, b in zip(t, now))


def _clocks() -> tuple[float, float, float]:
    return time.perf_counter(), time.thread_time(), time.process_time()


def iterate(dm, batches: int) -> tuple[float, float, float]:
    """Batches/s drawing every batch of an epoch but the first (which reads the first
    blocks synchronously): the steady state; by the wall clock, the sampling thread's CPU
    clock and the process's CPU clock."""
    it = iter(dm.train_dataloader())
    next(it)
    t = _clocks()
    n = 0
    for _ in it:
        n += 1
    return _rates(n, t)


def fit(dm, steps: int) -> tuple[float, float, float]:
    """Steps/s of a Lightning fit of a linear model from ``dm``'s batches."""
    import lightning.pytorch as pl
    from torch import nn

    name = dm._names[0]

    class Linear(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.LazyLinear(6)

        def training_step(self, batch, i):
            x = batch[name].flatten(1).float()
            return nn.functional.mse_loss(self.layer(x), batch["action"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    t = _clocks()
    trainer.fit(Linear(), datamodule=dm)
    return _rates(steps, t)


def bare_read(window, cold: bool, drop_all: bool = False) -> float:
    """MB/s of a bare h5py contiguous read of blocks the window read, same datasets."""
    store = window.store
    order = window.schedule.epoch_order(0)[: max(4, window.k + 1)]
    if cold:
        drop_cache(store.path, drop_all)
    nbytes, t = 0, 0.0
    for b in order:
        lo, hi = int(window.blocks.lo[b]), int(window.blocks.hi[b])
        for spec in window.packed.columns:
            ds = store._ds.columns[spec.name].data
            t0 = time.perf_counter()
            arr = ds[lo:hi]
            t += time.perf_counter() - t0
            nbytes += arr.nbytes
    return nbytes / max(t, 1e-9) / 1e6


def spawn(case: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spawn_median(cases: dict[str, dict], repeats: int) -> dict[str, dict]:
    """Every case ``repeats`` times, the cases alternating; each number the median."""
    runs: dict[str, list[dict]] = {label: [] for label in cases}
    for _ in range(repeats):
        for label, case in cases.items():
            runs[label].append(spawn(case))
    return {
        label: {
            k: statistics.median(r[k] for r in rs) if _number(rs[0][k]) else rs[0][k] for k in rs[0]
        }
        for label, rs in runs.items()
    }


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def case_row(label: str, r: dict, ref: dict, budget: int) -> tuple:
    """One row of the batches table with its targets: >= 0.8x resident batches/s, refill
    >= 0.5x a bare h5py read, peak RSS <= 1.2x the budget."""
    speed = r["per_s"] / ref["per_s"]
    cold = "" if r["cold"] or not label.endswith("cold") else " (cache not dropped)"
    row = (label + cold, f"{r['per_s']:.0f}", f"{speed:.2f}x", f"{r['peak_kib'] / 1024:.0f}")
    cpu = _cpu_ratios(r, ref)
    if "waits" not in r:
        return (*row[:3], cpu, row[3], "-", "-", "-", "-")
    rss = r["peak_kib"] * 1024 / budget
    refill = r["refill_mb_s"] / r["bare_mb_s"]
    return (
        *row[:2],
        f"{row[2]} ({verdict(speed >= 0.8)})",
        cpu,
        row[3],
        f"{rss:.2f}x ({verdict(rss <= 1.2)})",
        f"{r['refill_mb_s']:.0f} / {r['bare_mb_s']:.0f} = {refill:.2f}x ({verdict(refill >= 0.5)})",
        f"{r['waits']} / {r['refills']} ({r['wait_s']:.2f} s)",
        f"{r['data_bytes'] / 2**20:.1f}",
    )


def _cpu_ratios(r: dict, ref: dict) -> str:
    """Per CPU-second ratios vs resident: the sampling thread's clock, then the process's
    (every thread). Load on the machine leaves them nearly alone; the first leaves out
    waits on refills, the second counts the refill thread's reads and checksums."""
    thread = r["thread_per_s"] / ref["thread_per_s"]
    return f"{thread:.2f}x / {r['cpu_per_s'] / ref['cpu_per_s']:.2f}x"


def bench_store(
    args, name: str, path: Path, columns, rows: int, episode: int, warm: Path, batches: int
):
    t0 = time.perf_counter()
    write_store(path, columns, rows, episode)
    with TrajectoryStore(path) as store:
        from torchstore.data.rows.packed import PackedColumns

        total = PackedColumns(store.columns, 1).row_bytes * store.num_rows
    budget = int(total * args.fraction)
    print(
        f"\n{name}: {rows} rows, {total / 2**20:.0f} MiB packed, written in "
        f"{time.perf_counter() - t0:.1f} s; budget {budget / 2**20:.1f} MiB "
        f"({args.fraction:.0%}), {args.blocks} resident blocks + 1 refilling",
        flush=True,
    )
    base = dict(store=str(path), warm=str(warm), blocks=args.blocks, batches=batches)
    base.update(fit=False, reuse=1.0, drop_all=args.drop_caches)
    r = args.reuse
    res = {}
    for temp in ("warm", "cold"):
        cases = {
            f"resident, {temp}": {**base, "budget": None, "cold": temp == "cold"},
            f"window, {temp}": {**base, "budget": budget, "cold": temp == "cold"},
            f"window reuse {r:g}, {temp}": {
                **base,
                "budget": budget,
                "cold": temp == "cold",
                "reuse": r,
            },
        }
        res.update(spawn_median(cases, args.repeats))
    fits = {}
    if args.fit_steps:  # --fit-steps 0 leaves the Lightning table out
        fit_base = {**base, "cold": False, "fit": True, "batches": args.fit_steps}
        fits = spawn_median(
            {
                "resident": {**fit_base, "budget": None},
                "window": {**fit_base, "budget": budget},
                f"window reuse {r:g}": {**fit_base, "budget": budget, "reuse": r},
            },
            args.repeats,
        )
    print_table(
        f"{name}: OfflineDataModule, {BATCH}-row batches, {batches} batches "
        f"(median of {args.repeats})",
        (
            "case",
            "batches/s",
            "vs resident",
            "CPU: thread / process",
            "peak RSS MiB",
            "peak RSS / budget",
            "refill / bare h5py MB/s",
            "waits / refills",
            "held MiB",
        ),
        [
            case_row(label, x, res["resident, " + label.split(", ")[1]], budget)
            for label, x in res.items()
        ],
    )
    if not fits:
        return
    print_table(
        f"{name}: Lightning fit, {args.fit_steps} steps (linear model)",
        ("case", "steps/s", "vs resident", "CPU: thread / process", "peak RSS MiB"),
        [
            (
                label,
                f"{x['per_s']:.0f}",
                f"{x['per_s'] / fits['resident']['per_s']:.2f}x",
                _cpu_ratios(x, fits["resident"]),
                f"{x['peak_kib'] / 1024:.0f}",
            )
            for label, x in fits.items()
        ],
    )


# --------------------------------------------------------------------- driver
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--walker-rows", type=int, default=1_000_000)
    ap.add_argument("--pixel-frames", type=int, default=10_000)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument(
        "--reuse",
        type=float,
        default=4.0,
        help="resident_reuse of the second windowed case (the first uses 1)",
    )
    ap.add_argument("--batches", type=int, default=2000, help="batches a pixel case draws")
    ap.add_argument(
        "--walker-batches",
        type=int,
        default=20000,
        help="batches a walker case draws (about a second: shorter runs measure the noise of "
        "a shared machine, and reach few refills)",
    )
    ap.add_argument("--fit-steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--dir", type=Path, default=None, help="scratch folder for the stores (made if missing)"
    )
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="cold cases drop the whole page cache (/proc/sys/vm/drop_caches, root only; "
        "the store's pages alone where refused)",
    )
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case is not None:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="beyond_memory_", dir=args.dir))
    try:
        warm = root / "warm.h5"
        write_store(warm, WALKER, 2000, 100)
        if args.walker_rows:
            bench_store(
                args,
                "walker",
                root / "walker.h5",
                WALKER,
                args.walker_rows,
                1000,
                warm,
                args.walker_batches,
            )
        if args.pixel_frames:
            bench_store(
                args,
                "pixels",
                root / "pixels.h5",
                PIXELS,
                args.pixel_frames,
                500,
                warm,
                args.batches,
            )
    finally:
        if args.keep:
            print(f"\nstores kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
