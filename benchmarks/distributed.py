"""Scaling out: a Ray-served StoreReplay vs a local one, and a StoreSet vs one store.

    python benchmarks/distributed.py                    # 200k rows, a few minutes on 2 cores
    python benchmarks/distributed.py --rows 50000       # quicker

Tables:

1. rows/s into the buffer: a local ``extend`` of the batches, vs 1 and 2 writer actors
   extending the Ray-served buffer (``serve_replay``) with the same batches (made inside
   the actors, so only the extend crosses processes);
2. learner ``sample()`` latency: local buffer vs through Ray;
   and one collector actor stepping Pendulum-v1 (what a collector really produces);
3. shards: a 4-shard ``StoreSet`` vs one store of the same rows: ``resident()`` load, a
   4096-row gather from the resident view, a full ``iter_slabs`` pass, window refills.

Walker-shaped rows: ``observation`` 24 x float32, ``action`` 6, ``next/observation``,
``next/reward``, ``next/done`` (~222 bytes a row).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _timing import median_time, print_table
from tensordict import TensorDict

from torchstore.data import ColumnSpec, StoreSet, TrajectoryStore, TrajectoryStoreWriter

COLUMNS = [
    ColumnSpec("observation", torch.float32, (24,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("next/observation", torch.float32, (24,)),
    ColumnSpec("next/reward", torch.float32, (1,)),
    ColumnSpec("next/done", torch.bool, (1,)),
]


def batch(n: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(n, 24, generator=g),
            "action": torch.randn(n, 6, generator=g),
            ("next", "observation"): torch.randn(n, 24, generator=g),
            ("next", "reward"): torch.randn(n, 1, generator=g),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        },
        [n],
    )


class Writer:
    """A writer actor: makes its batches once, then extends the served buffer."""

    def __init__(self, client, rows: int, per_batch: int, seed: int):
        self.client = client
        self.batches = [batch(per_batch, seed + i) for i in range(rows // per_batch)]

    def run(self) -> float:
        t0 = time.perf_counter()
        for b in self.batches:
            self.client.extend(b)
        return time.perf_counter() - t0


def replay_tables(rows: int, per_batch: int, sample_size: int) -> None:
    import ray
    from torchrl.data import TensorDictReplayBuffer

    from torchstore.data.replay.ring import StoreReplay
    from torchstore.distributed import init_local_ray, serve_replay
    from torchstore.samplers.uniform import UniformSampler

    batches = [batch(per_batch, i) for i in range(rows // per_batch)]
    local = TensorDictReplayBuffer(
        storage=StoreReplay(rows * 2), sampler=UniformSampler(), batch_size=sample_size
    )
    t0 = time.perf_counter()
    for b in batches:
        local.extend(b)
    local_s = time.perf_counter() - t0
    local_sample = median_time(local.sample, repeats=200, warmup=10)

    init_local_ray(2)
    table = [("local extend (this process)", f"{rows / local_s:,.0f}", "1.00x")]
    sample_rows = [("local sample()", f"{local_sample * 1e3:.2f}", "1.00x")]
    for actors in (1, 2):
        writer = ray.remote(num_cpus=0.25)(Writer)
        buffer = serve_replay(rows * 2, batch_size=sample_size, num_cpus=0.25)
        ws = [
            writer.remote(buffer.client(), rows // actors, per_batch, 1000 * k)
            for k in range(actors)
        ]
        ray.get([w.__ray_ready__.remote() for w in ws])
        buffer.extend(batch(per_batch))  # storage initialised before the clock
        t0 = time.perf_counter()
        ray.get([w.run.remote() for w in ws])
        wall = time.perf_counter() - t0
        rate = rows / wall
        table.append(
            (
                f"{actors} writer actor(s) -> Ray buffer",
                f"{rate:,.0f}",
                f"{rate / (rows / local_s):.2f}x",
            )
        )
        if actors == 1:
            ray_sample = median_time(buffer.sample, repeats=100, warmup=5)
            sample_rows.append(
                (
                    "sample() through Ray",
                    f"{ray_sample * 1e3:.2f}",
                    f"{ray_sample / local_sample:.1f}x",
                )
            )
        for w in ws:
            ray.kill(w)
        buffer.close()
    # what one collector actor produces (torchrl Collector over GymEnv Pendulum-v1, random
    # actions), extending a served buffer: the r of "one buffer actor serves 160k / r"
    from torchstore.distributed import start_collectors

    buffer = serve_replay(rows * 2, batch_size=sample_size, num_cpus=0.25)
    (collector,) = start_collectors(buffer, None, 1, frames_per_batch=per_batch // 4 or 1)
    ray.get(collector.collect.remote(1000))
    t0 = time.perf_counter()
    ray.get(collector.collect.remote(5000))
    collect_rate = 5000 / (time.perf_counter() - t0)
    table.append(
        (
            "1 Pendulum collector actor -> Ray buffer",
            f"{collect_rate:,.0f}",
            f"{collect_rate / (rows / local_s):.3f}x",
        )
    )
    ray.kill(collector)
    buffer.close()
    ray.shutdown()
    print_table(
        f"extend: {rows:,} rows in batches of {per_batch}", ("path", "rows/s", "vs local"), table
    )
    print_table(f"sample({sample_size}) latency", ("path", "ms", "vs local"), sample_rows)


def shard_tables(rows: int, shards: int, folder: Path) -> None:
    episode = 1000
    one = folder / "one.h5"
    (folder / "set").mkdir()
    per = rows // shards
    with TrajectoryStoreWriter(one, COLUMNS) as w1:
        for k in range(shards):
            with TrajectoryStoreWriter(folder / "set" / f"collector-{k}.h5", COLUMNS) as wk:
                for start in range(0, per, episode):
                    b = batch(min(episode, per - start), k * 100_000 + start)
                    w1.add_episode(b)
                    wk.add_episode(b)
    with TrajectoryStore(one) as store, StoreSet(folder / "set") as shard_set:
        idx = torch.randint(0, len(store), (4096,), generator=torch.Generator().manual_seed(0))
        res_one, res_set = store.resident(), shard_set.resident()
        window = max(1, len(store) // 10)
        w_one, w_set = store.window(window), shard_set.window(window)
        starts = torch.randint(0, len(store) - window, (8,)).tolist()
        cases = [
            ("resident() load", lambda s: s.resident(), 3),
            ("gather 4096 rows (resident)", None, 200),
            ("iter_slabs pass (65536 rows)", lambda s: sum(1 for _ in s.iter_slabs(65536)), 3),
            (f"window refill ({window:,} rows)", None, 8),
        ]
        table = []
        for name, fn, repeats in cases:
            if name.startswith("gather"):
                a = median_time(lambda: res_one.gather(idx), repeats=repeats, warmup=10)
                b = median_time(lambda: res_set.gather(idx), repeats=repeats, warmup=10)
            elif name.startswith("window"):
                it_one, it_set = iter(starts * 2), iter(starts * 2)
                a = median_time(lambda: w_one.refill(next(it_one)), repeats=repeats, warmup=1)
                b = median_time(lambda: w_set.refill(next(it_set)), repeats=repeats, warmup=1)
            else:
                a = median_time(lambda: fn(store), repeats=repeats, warmup=1)
                b = median_time(lambda: fn(shard_set), repeats=repeats, warmup=1)
            table.append((name, f"{a * 1e3:.2f}", f"{b * 1e3:.2f}", f"{b / a:.2f}x"))
    print_table(
        f"{shards}-shard StoreSet vs one store ({rows:,} rows, warm page cache)",
        ("operation", "one store ms", "StoreSet ms", "set / one"),
        table,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000, help="rows per extend")
    ap.add_argument("--sample", type=int, default=256, help="rows per sample()")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--no-ray", action="store_true", help="only the StoreSet table")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="torchstore-bench-") as tmp:
        shard_tables(args.rows, args.shards, Path(tmp))
    if not args.no_ray:
        replay_tables(args.rows, args.batch, args.sample)


if __name__ == "__main__":
    main()
