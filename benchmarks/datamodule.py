"""Lightning DataModules against a plain DataLoader over the same rows, side by side in one run.

A pendulum-shaped store (obs[3], action[1], reward, done, truncated, next/obs[3]). Prints
the median time per batch and batches per second of:

- ``OfflineDataModule`` (batch 256, uniform; target: at most 2x the floor) next to
  ``torch.utils.data.DataLoader`` over a map-style Dataset of the same rows (in memory, one
  dict of tensors per row), default collate, ``shuffle=True``, ``num_workers=0``; and the
  raw floor, one ``index_select`` of random rows from one tensor holding the same bytes;
- ``DemonstrationDataModule`` (batch 256, ``n_obs_steps=2``, ``action_horizon=16``,
  normalised) next to a DataLoader over a map-style Dataset that cuts the same padded
  windows and masks per row (not normalised, which favours the baseline).

The paths are timed in turn (A B C A B C ...: a slow spell on a shared machine hits each
alike), each sample a run of ``--batches`` batches; medians per batch are printed, and the
target is read from that side-by-side run. Every path runs in this process with
``--threads`` intra-op threads (1 by default: on a
shared machine more threads make medians erratic, and the DataLoader with
``num_workers=0`` uses one core for its Python work anyway).

Usage: python benchmarks/datamodule.py [--rows 100000] [--episode-rows 200] [--device cpu]
       [--threads 1] [--thread-clock]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (  # noqa: E402
    add_clock_flag,
    median_per_call_interleaved,
    print_table,
    use_thread_clock,
)

from torchstore.data import TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.demo import DEMO_COLUMNS  # noqa: E402
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule  # noqa: E402

BATCH, N_OBS, HORIZON = 256, 2, 16
#: target: an OfflineDataModule batch costs at most this many index_select floors
FLOOR_TARGET = 2.0


def write_store(path: Path, rows: int, episode_rows: int) -> None:
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(path, DEMO_COLUMNS, overwrite=True) as w:
        for start in range(0, rows, episode_rows):
            n = min(episode_rows, rows - start)
            end = np.zeros(n, dtype=bool)
            end[-1] = True
            w.add_episode(
                {
                    "obs": rng.standard_normal((n, 3), dtype=np.float32),
                    "action": rng.standard_normal((n, 1), dtype=np.float32),
                    "reward": rng.standard_normal(n, dtype=np.float32),
                    "done": end,
                    "truncated": end,
                    "next/obs": rng.standard_normal((n, 3), dtype=np.float32),
                }
            )


class RowDataset(Dataset):
    """One dict of tensors per row, as a typical offline-RL Dataset returns."""

    def __init__(self, columns: dict[str, torch.Tensor]):
        self.columns = columns
        self.n = len(next(iter(columns.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.columns.items()}


class WindowDataset(Dataset):
    """Per row: an observation history and an action chunk from its episode, padded, masked."""

    def __init__(
        self, obs: torch.Tensor, action: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor
    ):
        self.obs, self.action = obs, action
        self.first = torch.repeat_interleave(starts, lengths)
        self.last = self.first + torch.repeat_interleave(lengths, lengths) - 1

    def __len__(self) -> int:
        return len(self.obs)

    def __getitem__(self, t: int) -> dict[str, torch.Tensor]:
        first, last = int(self.first[t]), int(self.last[t])
        obs_rows = torch.arange(t - N_OBS + 1, t + 1)
        act_rows = torch.arange(t, t + HORIZON)
        return {
            "obs": self.obs[obs_rows.clamp(min=first)],
            "action": self.action[act_rows.clamp(max=last)],
            "obs_mask": obs_rows >= first,
            "action_mask": act_rows <= last,
        }


def per_batch(iterates: list, batches: int, repeats: int) -> list[float]:
    """Median seconds per batch of each ``iterate()`` (each yields ``batches`` batches),
    the runs of the different paths timed in turn."""

    def run(iterate):
        def go() -> None:
            for _ in iterate():
                pass

        return go

    runs = median_per_call_interleaved([run(it) for it in iterates], repeats=repeats, warmup=1)
    return [t / batches for t in runs]


def take(loader: DataLoader, n: int):
    """``n`` batches from ``loader``, starting new epochs as needed."""
    it = iter(loader)
    for _ in range(n):
        try:
            yield next(it)
        except StopIteration:
            it = iter(loader)
            yield next(it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--episode-rows", type=int, default=200)
    parser.add_argument("--batches", type=int, default=256, help="batches per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None)
    add_clock_flag(parser)
    args = parser.parse_args()
    if args.thread_clock:
        if args.device != "cpu":
            parser.error("--thread-clock times CPU work only: use --device cpu")
        use_thread_clock()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    k = args.batches

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "bench.h5"
        write_store(path, args.rows, args.episode_rows)
        with TrajectoryStore(path) as store:
            rows = store.read_slab(0, store.num_rows)
            starts, lengths = store.episodes.offsets, store.episodes.lengths
        flat = {
            "/".join(k) if isinstance(k, tuple) else k: v
            for k, v in rows.items(include_nested=True, leaves_only=True)
        }

        offline = OfflineDataModule(path, batch_size=BATCH, steps_per_epoch=k, device=args.device)
        demo = DemonstrationDataModule(
            path,
            batch_size=BATCH,
            obs_keys=["obs"],
            action_keys=["action"],
            n_obs_steps=N_OBS,
            action_horizon=HORIZON,
            steps_per_epoch=k,
            device=args.device,
            stats_cache=False,
        )
        offline.setup()
        demo.setup()
        row_loader = DataLoader(RowDataset(flat), batch_size=BATCH, shuffle=True, num_workers=0)
        window_loader = DataLoader(
            WindowDataset(flat["obs"], flat["action"], starts, lengths),
            batch_size=BATCH,
            shuffle=True,
            num_workers=0,
        )
        floor_rows = torch.cat([v.reshape(len(v), -1).float() for v in flat.values()], 1).to(
            args.device
        )
        n = len(floor_rows)

        def floor():
            for _ in range(k):
                yield torch.index_select(
                    floor_rows, 0, torch.randint(n, (BATCH,), device=floor_rows.device)
                )

        r = args.repeats
        t_offline, t_floor, t_rows = per_batch(
            [offline.train_dataloader, floor, lambda: take(row_loader, k)], k, r
        )
        t_demo, t_windows = per_batch([demo.train_dataloader, lambda: take(window_loader, k)], k, r)

    def row(name: str, t: float, base: float) -> tuple:
        return (name, f"{t * 1e3:.3f}", f"{1 / t:,.0f}", f"{base / t:.1f}x")

    print(
        f"{args.rows} rows, episodes of {args.episode_rows}, batch {BATCH}, device {args.device}; "
        f"{args.threads} thread(s); medians of {r} runs of {k} batches, paths timed in turn"
    )
    header = ("path", "ms/batch", "batches/s", "vs DataLoader")
    print_table(
        "offline RL rows",
        header,
        [
            row("DataLoader + default collate", t_rows, t_rows),
            row("OfflineDataModule", t_offline, t_rows),
            row("index_select floor", t_floor, t_rows),
        ],
    )
    print_table(
        f"demonstration windows (n_obs_steps {N_OBS}, action_horizon {HORIZON})",
        header,
        [
            row("DataLoader + default collate", t_windows, t_windows),
            row("DemonstrationDataModule", t_demo, t_windows),
        ],
    )
    ratio = t_offline / t_floor
    print_table(
        "targets",
        ("target", "measured", "met"),
        [
            (
                f"OfflineDataModule {BATCH}-row batch <= {FLOOR_TARGET}x the index_select floor",
                f"{ratio:.2f}x",
                "yes" if ratio <= FLOOR_TARGET else "NO",
            )
        ],
    )


if __name__ == "__main__":
    main()
