"""Shared timing helpers for the benchmarks: medians over repeats, and a printed table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_table(title: str, header: tuple[str, ...], rows: list[tuple]) -> None:
    text = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(text):
        print(
            "  "
            + "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))
            )
        )
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def median_per_call_interleaved(
    fns: list[Callable[[], object]],
    *,
    inner: int = 1,
    repeats: int = 5,
    warmup: int = 1,
    setups: list[Callable[[], object] | None] | None = None,
    sync: Callable[[], object] | None = None,
) -> list[float]:
    """Median wall time of one call of each of ``fns``, timed in turn (A B C A B C ...).

    Each sample times ``inner`` calls and divides. ``setups[k]`` runs untimed before each
    sample of ``fns[k]`` (writing rows between draws, say); ``sync`` runs before the clock
    starts and before it stops (``torch.cuda.synchronize`` for device work). On shared,
    noisy machines a slow spell hits every case alike, so the ratios between the returned
    medians are steadier than from back-to-back runs.
    """
    setups = setups or [None] * len(fns)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(warmup + repeats):
        for k, (fn, setup) in enumerate(zip(fns, setups)):
            if setup is not None:
                setup()
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            if sync is not None:
                sync()
            if r >= warmup:
                times[k].append((time.perf_counter() - t0) / inner)
    return [statistics.median(t) for t in times]
