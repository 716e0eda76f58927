"""The graph-safe device path against torchrl's eager sampling, measured side by side in one run.

Per 4096-row batch from a walker-shaped ``StoreReplay`` (obs f32[24], action f32[6], reward
f32, done bool, next/obs f32[24]) on each device (CPU always, CUDA when available):

- eager ``sample_into`` with a ``PhiloxSampler`` and with a ``PrioritizedSampler`` built with
  ``philox=PhiloxStream(...)`` (and a prioritized train step: ``sample_into`` +
  ``update_priority_``; on CPU the eager path runs the core's compiled kernels);
- on CPU, the same calls under ``torch.compile(fullgraph=True)`` (default mode, timed after
  warm-up; compile + warm-up time is printed: cold, the prioritized step takes minutes on
  two cores, a warm inductor cache seconds; the train step only with
  ``--compile-train-step``);
- on CUDA, one captured ``torch.cuda.CUDAGraph`` of the same call, replayed (warm-up on a
  side stream first);
- torchrl's ``TensorDictReplayBuffer(LazyTensorStorage(N, device=...), RandomSampler())``
  ``.sample()``, and its ``PrioritizedSampler`` where its C++ extension loads;
- the Philox generator's throughput in GB/s of random 32-bit words (``PhiloxStream.words``)
  next to ``torch.randint`` on the same device.

Device timings synchronise before starting and before stopping the clock, and divide a
loop of calls by its length. The CPU is timed with one torch thread by default (a second
intra-op thread on shared cores makes medians bimodal); ``--threads 0`` leaves it as is.

Eager cases write a batch from ``empty_batch(storage, B, packed=True)`` (one gather straight
into its row block); compiled cases one of contiguous leaves (``torch.compile`` cannot write
differently-typed views of one buffer).

Usage: python benchmarks/device_sampling.py [--rows 1000000] [--repeats 51] [--no-compile]
       [--compile-train-step] [--cpu-only] [--build-torchrl-tree] [--thread-clock]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TorchrlPrioritizedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (  # noqa: E402
    add_clock_flag,
    median_per_call_interleaved,
    print_table,
    use_thread_clock,
)
from _torchrl_tree import load_torchrl_tree  # noqa: E402

from torchstore.data import ColumnSpec  # noqa: E402
from torchstore.data.replay.ring import StoreReplay  # noqa: E402
from torchstore.samplers import (  # noqa: E402
    PhiloxSampler,
    PhiloxStream,
    PrioritizedSampler,
    empty_batch,
    sample_into,
    update_priority_,
)

WALKER = (
    ColumnSpec("obs", torch.float32, (24,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("next/obs", torch.float32, (24,)),
)
FLOATS = 55
EPISODE = 1000
BATCH = 4096
FILL_ROWS = 65536
WORD_BYTES = 4  # a Philox word is 32 random bits (held in an int64)


def walker_rows(source: torch.Tensor, start: int, stop: int, device: torch.device) -> TensorDict:
    part = source[start:stop].to(device)
    n = stop - start
    done = ((start + torch.arange(n, device=device)) % EPISODE) == EPISODE - 1
    return TensorDict(
        {
            "obs": part[:, :24],
            "action": part[:, 24:30],
            "reward": part[:, 30],
            "done": done,
            "next": {"obs": part[:, 31:55]},
        },
        batch_size=[n],
        device=device,
    )


def build(source: torch.Tensor, device: torch.device) -> tuple[StoreReplay, TensorDictReplayBuffer]:
    """Our ring and torchrl's lazy storage on ``device``, filled with the same rows."""
    n = source.shape[0]
    ours = StoreReplay(n, columns=WALKER, device=device)
    writer = ReplayBuffer(storage=ours, sampler=PhiloxSampler(device=device))
    theirs = TensorDictReplayBuffer(
        storage=LazyTensorStorage(n, device=device), sampler=RandomSampler(), batch_size=BATCH
    )
    for a in range(0, n, FILL_ROWS):
        td = walker_rows(source, a, min(n, a + FILL_ROWS), device)
        writer.extend(td)
        theirs.extend(td.clone())
    return ours, theirs


def torchrl_prioritized(storage_n: int, source: torch.Tensor, device: torch.device):
    """torchrl's prioritized buffer on ``device``, or the reason it does not load."""
    try:
        sampler = TorchrlPrioritizedSampler(storage_n, alpha=0.6, beta=0.4)
    except Exception as exc:  # its C++ segment trees are missing: report, do not fail
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(storage_n, device=device), sampler=sampler, batch_size=BATCH
    )
    for a in range(0, storage_n, FILL_ROWS):
        rb.extend(walker_rows(source, a, min(storage_n, a + FILL_ROWS), device))
    return rb, ""


#: the eager CPU prioritized train step (sample_into + update_priority_, 1 M rows) target
PRIORITIZED_STEP_TARGET_MS = 2.0


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then capture one call of it in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def compiled(fn: Callable[[], object], warmup: int = 3) -> tuple[Callable[[], object], float]:
    """``torch.compile(fn, fullgraph=True)`` (default mode), warmed up; and its compile time."""
    step = torch.compile(fn, fullgraph=True)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    return step, time.perf_counter() - t0


def ms(seconds: float | None) -> str:
    return "unavailable" if seconds is None else f"{seconds * 1e3:.3f}"


@dataclass
class Bench:
    """What one device's cases share: its rings, samplers, timing and collected rows."""

    device: torch.device
    args: argparse.Namespace
    ours: StoreReplay
    theirs: TensorDictReplayBuffer
    sync: Callable[[], object] | None
    inner: int
    rows: list[tuple] = field(default_factory=list)
    best: dict[str, tuple[float, float]] = field(default_factory=dict)
    trl_all: list[float] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def versus(
        self,
        fn: Callable[[], object],
        other: Callable[[], object] | None = None,
        k: int | None = None,
    ) -> tuple[float, float]:
        """``fn`` and ``other`` (torchrl's eager ``sample()``) timed in turn: two medians."""
        first, second = median_per_call_interleaved(
            [fn, other or self.theirs.sample],
            inner=self.inner if k is None else k,
            repeats=self.args.repeats,
            warmup=3,
            sync=self.sync,
        )
        return first, second

    def add(self, label: str, name: str, fn: Callable[[], object]) -> float:
        ours_s, trl_s = self.versus(fn)
        self.trl_all.append(trl_s)
        self.rows.append((label, ms(ours_s), ms(trl_s), f"{trl_s / ours_s:.2f}x"))
        self.best[name] = min(self.best.get(name, (float("inf"), 0.0)), (ours_s, trl_s))
        return ours_s


def step_cases(bench: Bench, n: int) -> list[tuple[str, Callable, Callable, bool]]:
    """``(name, eager step, traceable step, compile it)``: the eager steps write a packed
    batch (one gather straight into it), the traceable ones a batch of contiguous leaves."""
    device, ours = bench.device, bench.ours
    gen = torch.Generator().manual_seed(1)
    packed, out = empty_batch(ours, BATCH, packed=True), empty_batch(ours, BATCH)
    uniform = PhiloxSampler(seed=0, device=device)
    prio = PrioritizedSampler(
        n, alpha=0.6, beta=0.4, device=device, philox=PhiloxStream(1, device=device)
    )
    prio.update_priority(
        torch.arange(n, device=device), (torch.rand(n, generator=gen) + 0.01).to(device)
    )
    td_error = (torch.rand(BATCH, generator=gen) + 0.01).to(device)

    def steps(batch: TensorDict) -> tuple[Callable, Callable, Callable]:
        def train_step() -> None:
            sample_into(ours, prio, batch)
            update_priority_(prio, batch["index"], td_error)

        return (
            lambda: sample_into(ours, uniform, batch),
            lambda: sample_into(ours, prio, batch),
            train_step,
        )

    eager, traced = steps(packed), steps(out)
    names = (
        "uniform: sample_into, PhiloxSampler",
        "prioritized: sample_into, PrioritizedSampler(philox=)",
        "prioritized: sample_into + update_priority_",
    )
    compile_it = (True, True, bench.args.compile_train_step)
    return list(zip(names, eager, traced, compile_it))


def accelerated(bench: Bench, name: str, traced: Callable, compile_it: bool) -> None:
    """The captured CUDA graph (on a GPU) or the ``torch.compile`` build (on CPU) of a case."""
    if bench.cuda:
        try:
            graph = capture(traced)
        except Exception as exc:  # report, keep the rest of the run
            bench.rows.append(
                (f"ours CUDA graph, {name}", f"capture failed: {type(exc).__name__}", "", "")
            )
            return
        bench.add(f"ours CUDA-graph replay, {name}", name, graph.replay)
        return
    if not compile_it or bench.args.no_compile:
        return
    try:
        step, compile_s = compiled(traced)
    except Exception as exc:  # report, keep the rest of the run
        bench.rows.append((f"ours torch.compile, {name}", f"failed: {type(exc).__name__}", "", ""))
        return
    bench.add(f"ours torch.compile(fullgraph) [compile {compile_s:.0f} s], {name}", name, step)


def torchrl_rows(bench: Bench, source: torch.Tensor) -> str:
    """torchrl's uniform and prioritized rows; the reason its prioritized one did not load."""
    n = source.shape[0]
    trl = statistics.median(bench.trl_all)
    bench.rows.append(
        ("torchrl eager rb.sample(), LazyTensorStorage + RandomSampler", ms(trl), ms(trl), "1.00x")
    )
    trl_prb, why = torchrl_prioritized(n, source, bench.device)
    if trl_prb is None:
        bench.rows.append(("torchrl eager rb.sample(), PrioritizedSampler", "unavailable", "", ""))
        return why
    trl_prio, trl_s = bench.versus(trl_prb.sample)
    bench.rows.append(
        (
            "torchrl eager rb.sample(), PrioritizedSampler",
            ms(trl_prio),
            ms(trl_s),
            f"{trl_s / trl_prio:.2f}x",
        )
    )
    return ""


def philox_table(bench: Bench) -> None:
    """Random 32-bit words per second: the Philox stream vs ``torch.randint``."""
    device, args = bench.device, bench.args
    counters = args.philox_counters
    stream = PhiloxStream(2, device=device)
    nbytes = counters * 4 * WORD_BYTES
    k = 5 if bench.cuda else 1

    def randint() -> torch.Tensor:
        return torch.randint(0, 2**32, (4 * counters,), dtype=torch.int64, device=device)

    philox_s, randint_s = bench.versus(lambda: stream.words(counters), randint, k=k)
    rows = [
        (
            "PhiloxStream.words (eager)",
            f"{nbytes / philox_s / 1e9:.2f}",
            f"{randint_s / philox_s:.2f}x",
        ),
        (
            "torch.randint(0, 2**32), same number of words",
            f"{nbytes / randint_s / 1e9:.2f}",
            "1.00x",
        ),
    ]
    if not bench.cuda and not args.no_compile:
        try:
            words, compile_s = compiled(lambda: stream.words(counters))
            fast, randint_s = bench.versus(words, randint, k=k)
            rows.insert(
                1,
                (
                    f"PhiloxStream.words, torch.compile [compile {compile_s:.0f} s]",
                    f"{nbytes / fast / 1e9:.2f}",
                    f"{randint_s / fast:.2f}x",
                ),
            )
        except Exception as exc:
            rows.insert(
                1, ("PhiloxStream.words, torch.compile", f"failed: {type(exc).__name__}", "")
            )
    print_table(
        f"{device.type}: random 32-bit words, {4 * counters:,} a call "
        f"(GB/s of random bits, median of {args.repeats})",
        ("case", "GB/s", "vs randint"),
        rows,
    )


def section(device: torch.device, source: torch.Tensor, args: argparse.Namespace) -> list[tuple]:
    """Print this device's tables; return its lines for the target summary."""
    n = source.shape[0]
    cuda = device.type == "cuda"
    ours, theirs = build(source, device)
    bench = Bench(
        device, args, ours, theirs, torch.cuda.synchronize if cuda else None, 50 if cuda else 1
    )
    cases = step_cases(bench, n)
    eager = {}
    for name, fn, traced, compile_it in cases:
        eager[name] = bench.add(f"ours eager, {name}", name, fn)
        accelerated(bench, name, traced, compile_it)
    why = torchrl_rows(bench, source)
    print_table(
        f"{device.type}: one {BATCH}-row batch of {n:,} (ms, median of {args.repeats}"
        f"{f' x {bench.inner} calls' if bench.inner > 1 else ''}; each case timed in turn "
        "with torchrl's uniform sample; eager cases write a packed batch)",
        ("case", "ms", "torchrl uniform, same turns", "speed-up"),
        bench.rows,
    )
    if why:
        print(f"  torchrl's PrioritizedSampler did not load: {why}")
    philox_table(bench)
    ours_s, trl_s = bench.best[cases[0][0]]
    if cuda:
        targets = [
            (
                f"{device.type}: graph-replayed uniform sample >= 10x torchrl eager sample()",
                f"{trl_s / ours_s:.1f}x",
                "yes" if trl_s >= 10 * ours_s else "NO",
            )
        ]
    else:
        step = eager[cases[2][0]]
        targets = [
            (
                f"{device.type}: fastest uniform 4096-row sample vs torchrl eager sample()",
                f"{trl_s / ours_s:.1f}x",
                "n/a on CPU",
            ),
            (
                f"cpu: eager prioritized sample_into + update_priority_ <= "
                f"{PRIORITIZED_STEP_TARGET_MS} ms ({n:,} rows)",
                f"{step * 1e3:.2f} ms",
                "yes" if step * 1e3 <= PRIORITIZED_STEP_TARGET_MS else "NO",
            ),
        ]
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=51, help="timed samples per case")
    parser.add_argument(
        "--philox-counters",
        type=int,
        default=1 << 20,
        help="Philox counters per throughput call (4 words each)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile on CPU")
    parser.add_argument(
        "--compile-train-step",
        action="store_true",
        help="also compile the prioritized train step on CPU (about 3 more minutes)",
    )
    parser.add_argument("--cpu-only", action="store_true", help="skip CUDA even if available")
    parser.add_argument(
        "--build-torchrl-tree",
        action="store_true",
        help="build torchrl's own C++ segment trees for this torch (cached) and time its "
        "PrioritizedSampler (CPU)",
    )
    add_clock_flag(parser)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: stable medians on shared cores; 0: leave)",
    )
    args = parser.parse_args()
    if args.rows < BATCH:
        parser.error(f"--rows ({args.rows}) must be at least the batch size {BATCH}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.build_torchrl_tree:
        load_torchrl_tree()
    devices = [torch.device("cpu")]
    if torch.cuda.is_available() and not args.cpu_only:
        devices.append(torch.device("cuda"))
    if args.thread_clock:
        if len(devices) > 1:
            parser.error("--thread-clock times CPU work only: add --cpu-only")
        use_thread_clock()
    print(
        f"walker-shaped ring: {args.rows:,} rows, batches of {BATCH}, devices "
        f"{', '.join(d.type for d in devices)}"
        + (f" ({torch.cuda.get_device_name()})" if len(devices) > 1 else "")
        + f", torch {torch.__version__}, CPU threads {torch.get_num_threads()}"
    )
    source = torch.randn(args.rows, FLOATS, generator=torch.Generator().manual_seed(0))
    summary = []
    for device in devices:
        summary += section(device, source, args)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table("targets", ("target", "measured", "met"), summary)


if __name__ == "__main__":
    main()
