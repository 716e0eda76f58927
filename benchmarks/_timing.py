"""Shared timing helpers for the benchmarks: medians over repeats, and a printed table."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

#: the clock every helper reads: wall time by default; :func:`use_thread_clock` switches
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def use_thread_clock(on: bool = True) -> None:
    """Time the CPU the calling thread ran (``time.thread_time``) instead of wall time.

    On an oversubscribed machine (more busy processes than cores) a wall-clock sample of a
    millisecond-long call mostly measures how long the scheduler kept the process off a
    core. Thread CPU time leaves those waits out (memory contention from the other
    processes still counts). Only for single-threaded CPU work: it misses other threads'
    work and time spent waiting on a device.
    """
    CLOCK[0] = time.thread_time if on else time.perf_counter


def add_clock_flag(parser) -> None:
    """``--thread-clock`` on an argparse parser (see :func:`use_thread_clock`)."""
    parser.add_argument(
        "--thread-clock",
        action="store_true",
        help="time this thread's CPU time instead of wall time (oversubscribed machines; "
        "CPU cases with one torch thread only)",
    )


def median_time(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median time of ``fn()`` in seconds."""
    clock = CLOCK[0]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
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


def per_call_interleaved(
    fns: list[Callable[[], object]],
    *,
    inner: int = 1,
    repeats: int = 5,
    warmup: int = 1,
    setups: list[Callable[[], object] | None] | None = None,
    sync: Callable[[], object] | None = None,
    shuffle: random.Random | None = None,
) -> list[list[float]]:
    """Time one call of each of ``fns``, all cases once per round (A B C, A B C, ...).

    Each sample times ``inner`` calls and divides; ``times[k][r]`` is case ``k`` in round
    ``r`` (warm-up rounds left out), so cases of one round can be compared as a ratio.
    ``setups[k]`` runs untimed before each sample of ``fns[k]`` (writing rows between
    draws, say); ``sync`` runs before the clock starts and before it stops
    (``torch.cuda.synchronize`` for device work). With ``shuffle`` each round times the
    cases in an order of its own: no case is always the one timed after another's cache
    eviction. On shared, noisy machines a slow spell hits every case of a round alike, so
    ratios between cases are steadier than from back-to-back runs.
    """
    setups = setups or [None] * len(fns)
    clock = CLOCK[0]
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(warmup + repeats):
        if shuffle is not None:
            shuffle.shuffle(order)
        for k in order:
            fn, setup = fns[k], setups[k]
            if setup is not None:
                setup()
            if sync is not None:
                sync()
            t0 = clock()
            for _ in range(inner):
                fn()
            if sync is not None:
                sync()
            if r >= warmup:
                times[k].append((clock() - t0) / inner)
    return times


def median_per_call_interleaved(fns: list[Callable[[], object]], **kwargs) -> list[float]:
    """Median time of one call of each of ``fns``: :func:`per_call_interleaved`'s samples."""
    return [statistics.median(t) for t in per_call_interleaved(fns, **kwargs)]


def ratio_spread(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """``(median, low decile, high decile)`` of the per-round ratios ``num[r] / den[r]``."""
    ratios = sorted(a / b for a, b in zip(num, den))
    last = len(ratios) - 1
    return statistics.median(ratios), ratios[last // 10], ratios[last - last // 10]
