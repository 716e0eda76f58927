"""Torture run: kill writers, damage files, race readers against a writer, and count outcomes.

Every trial runs in real processes (``fork``) with deadlines, so a hang or a crash is counted,
never waited on. Sections and their outcomes:

- writer kills (SIGKILL at a random moment, at a chosen point inside a commit, or inside
  ``resume()``), each trial resuming the store the last one killed:
  intact / lost (a committed episode missing or changed) / unopenable / hang / raw
  (an exception that is not a torchstore error);
- one flipped bit in each region of a store file (superblock, object headers, chunk
  indexes and other HDF5 metadata, global heap, manifest, checksum tables, episode tables,
  commit record, column data), the file then read completely:
  clean error / identical / SILENT (different data returned) / crash / hang / raw;
- live readers following a writer that commits thousands of tiny episodes:
  false alarms (IntegrityError on intact data) and wrong values;
- ``dump_buffer`` (a torchrl ReplayBuffer's whole checkpoint folder: our storage file and
  torchrl's sampler and writer files, written beside and swapped in) killed at random
  moments over an earlier checkpoint, then loaded: old or new, whole (storage rows,
  priorities and writer cursor of one version) / mixed / lost / crash / hang / raw;
- a second writer while one is live (``resume``, ``overwrite=True``, ``dumps``):
  refused / accepted, and whether the live writer's commits survived;
- kill sequences: 2-4 SIGKILLs in a row on one store (at random moments, inside
  ``resume``, a commit, ``close`` or the recovery of the last kill), then one check:
  intact / lost / unopenable / hang / raw;
- a full disk inside HDF5's own write (a file-size limit met after the room check):
  clean error, commits intact / lost / unopenable / resume fails / raw / crash / hang;
- concurrent pushes: 4-8 forked pushers racing on one remote location (a folder, and HTTP
  against the loopback file server), then every listed revision pulled and verified:
  consistent / index names missing bytes / revision lost / unexpected error / raw / hang.
- hostile RLDS datasets: the shipped TFDS fixture with its framing, a record's bytes, an
  Example's fields or a value of its JSON files mutated, then imported: clean error /
  imported / raw / not one line / hang / over-memory / partial DEST / crash.

Targets: 0 lost, 0 unopenable, 0 SILENT, 0 crash, 0 hang, 0 raw, 0 false alarms, every
second writer refused, 0 over-memory and 0 partial DEST.

Usage: python benchmarks/torture.py [--seed 0] [--kills 300] [--corruptions 500]
       [--readers 3] [--commits 3000] [--dumps 20] [--dump-rows 200000]
       [--second-writers 9] [--kill-sequences 200] [--disk-full 100]
       [--concurrent-pushes 40] [--rlds-files 400] [--dir /tmp]
Exit status 1 when any outcome is off target.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torture_sections import (  # noqa: E402
    concurrent_pushes,
    disk_full,
    kill_sequences,
    rlds_files,
)
from torture_sections.bit_flips import corruptions  # noqa: E402
from torture_sections.dumps_kills import dumps_kills  # noqa: E402
from torture_sections.live_readers import live_readers  # noqa: E402
from torture_sections.second_writers import second_writers  # noqa: E402
from torture_sections.writer_kills import writer_kills  # noqa: E402


def _row(section: str, trials: int, counts: Counter, order: list[str]) -> str:
    cells = "  ".join(f"{k} {counts.get(k, 0)}" for k in order)
    extra = "  ".join(f"{k} {v}" for k, v in counts.items() if k not in order)
    return f"| {section:<28} | {trials:>6} | {cells}{'  ' + extra if extra else ''} |"


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="torture-", dir=args.dir))
    lines = ["| section | trials | outcomes |", "|---|---|---|"]
    notes: list[str] = []
    bad = 0
    try:
        if args.kills:
            kills = writer_kills(workdir, args.kills, rng)
            notes += kills.pop("_notes")  # type: ignore[arg-type]
            for kind, counts in kills.items():
                lines.append(
                    _row(
                        f"writer kill, {kind}",
                        sum(counts.values()),
                        counts,
                        ["intact", "lost", "unopenable", "hang", "raw"],
                    )
                )
                bad += sum(v for k, v in counts.items() if k != "intact")
        if args.corruptions:
            regions, more = corruptions(workdir, args.corruptions, rng)
            notes += more
            total = Counter()
            for region, counts in regions.items():
                total.update(counts)
                lines.append(
                    _row(
                        f"bit flip: {region}",
                        sum(counts.values()),
                        counts,
                        ["clean error", "identical", "SILENT", "crash", "hang", "raw"],
                    )
                )
            lines.append(
                _row(
                    "bit flips, all regions",
                    sum(total.values()),
                    total,
                    ["clean error", "identical", "SILENT", "crash", "hang", "raw"],
                )
            )
            bad += sum(v for k, v in total.items() if k not in ("clean error", "identical"))
        if args.readers and args.commits:
            live, more = live_readers(workdir, args.readers, args.commits)
            notes += more
            lines.append(
                _row(
                    f"live readers x{args.readers}, {args.commits} commits",
                    args.readers,
                    live,
                    ["false alarms", "wrong values", "raw", "hang", "reads", "refreshes"],
                )
            )
            bad += sum(live[k] for k in ("false alarms", "wrong values", "raw", "hang"))
        if args.dumps:
            dumps, more = dumps_kills(workdir, args.dumps, rng, rows=args.dump_rows)
            print(more[0])  # how long a whole dump takes here: the span the kills land in
            notes += more[1:]
            lines.append(
                _row(
                    "dump_buffer killed (whole folder)",
                    args.dumps,
                    dumps,
                    ["old or new, whole", "mixed", "lost", "crash", "hang", "raw"],
                )
            )
            bad += sum(v for k, v in dumps.items() if k != "old or new, whole")
        if args.second_writers:
            second, more = second_writers(workdir, args.second_writers)
            notes += more
            lines.append(
                _row(
                    "second writer while one is live",
                    args.second_writers,
                    second,
                    ["refused", "accepted", "live writer's commits lost"],
                )
            )
            bad += sum(v for k, v in second.items() if k != "refused")
        for module, trials, name in (
            (kill_sequences, args.kill_sequences, "kill sequences (2-4 kills)"),
            (disk_full, args.disk_full, "disk full inside HDF5's write"),
            (concurrent_pushes, args.concurrent_pushes, "concurrent pushes (4-8 pushers)"),
            (rlds_files, args.rlds_files, "hostile RLDS datasets"),
        ):
            if trials:
                counts, more = module.run_section(workdir, trials, rng)
                notes += more
                lines.append(_row(name, trials, counts, module.OUTCOMES))
                bad += sum(v for k, v in counts.items() if k not in module.GOOD)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"torture run, seed {args.seed}")
    print("\n".join(lines))
    if notes:
        print(f"\n{len(notes)} outcomes off target:")
        for note in notes[:40]:
            print("  -", note)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)  # forked children must not inherit a busy OpenMP pool
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--kills", type=int, default=300, help="writer kills, a third of each kind (default 300)"
    )
    parser.add_argument(
        "--corruptions", type=int, default=500, help="single-bit corruptions (default 500)"
    )
    parser.add_argument("--readers", type=int, default=3, help="live reader processes (default 3)")
    parser.add_argument(
        "--commits",
        type=int,
        default=3000,
        help="tiny commits the live writer makes (default 3000)",
    )
    parser.add_argument("--dumps", type=int, default=20, help="replay dumps killed (default 20)")
    parser.add_argument(
        "--dump-rows", type=int, default=200_000, help="rows in each dumped ring (default 200000)"
    )
    parser.add_argument(
        "--second-writers", type=int, default=9, help="second-writer attempts (default 9)"
    )
    parser.add_argument(
        "--kill-sequences",
        type=int,
        default=200,
        help="sequences of 2-4 kills in a row on one store (default 200)",
    )
    parser.add_argument(
        "--disk-full",
        type=int,
        default=100,
        help="writes refused by a full disk inside HDF5 (default 100)",
    )
    parser.add_argument(
        "--concurrent-pushes",
        type=int,
        default=40,
        help="races of 4-8 forked pushers on one location, folder and HTTP (default 40)",
    )
    parser.add_argument(
        "--rlds-files",
        type=int,
        default=400,
        help="mutated RLDS datasets imported, four kinds in turn (default 400)",
    )
    parser.add_argument(
        "--dir", default=None, help="where scratch files go (default: the system temp folder)"
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
