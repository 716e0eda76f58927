"""cpprb's replay buffers as peers of ``benchmarks/sampling.py``'s uniform, extend and
prioritized cases.

cpprb (C++ and Cython, numpy in and out) is what many CPU-only RL codes use as their replay
buffer, so its figures say where a store stands for them. Its buffers hold the same walker
rows as the other cases, one column apiece (``obs``, ``action``, ``reward``, ``done`` as
``bool``, ``next_obs``: 221 bytes a row, no ``next_of`` sharing, which would gather fewer
bytes), filled from the same source rows. cpprb returns a dict of numpy arrays and draws its
indices from numpy's global generator; each case comes twice, as cpprb returns it and turned
into the TensorDict the torch buffers return (``torch.from_numpy`` views, ``reward`` and
``done`` as ``[B]``, ``next/obs`` nested, the index as int64, the weights as ``_weight``), so
the conversion's cost is its own row. Its prioritized buffer returns float32 weights and
draws one index per equal slice of the priority mass (stratified: its indices come sorted).

cpprb is optional (``pip install cpprb``, or the ``bench`` extra): without it
:func:`walker_buffer` prints a note and the benchmark skips these rows.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import numpy as np
import torch
from _timing import per_call_interleaved, ratio_spread
from tensordict import TensorDict

try:
    import cpprb
except ImportError:  # an optional peer: its rows are skipped
    cpprb = None

ENV = {
    "obs": {"shape": 24},
    "action": {"shape": 6},
    "reward": {},
    "done": {"dtype": np.bool_},
    "next_obs": {"shape": 24},
}
#: the prioritized cases' alpha, beta and eps: torchstore's and torchrl's
ALPHA, BETA, EPS = 0.6, 0.4, 1e-8

#: ``(label, call, part)``: ``part`` marks a piece of a step (a gather alone, a sample
#: alone), compared with the others' pieces rather than with their whole step
Cases = list[tuple[str, Callable[[], object], bool]]


def walker_buffer(source: torch.Tensor, *, episode: int, prioritized: bool = False):
    """A full cpprb ``ReplayBuffer`` (or ``PrioritizedReplayBuffer``) of the source's rows,
    or ``None`` (with a printed note) when cpprb is not installed."""
    if cpprb is None:
        print("  cpprb is not installed (pip install cpprb, or .[bench]): its rows are skipped")
        return None
    n = source.shape[0]
    if prioritized:
        buffer = cpprb.PrioritizedReplayBuffer(n, ENV, alpha=ALPHA, eps=EPS)
    else:
        buffer = cpprb.ReplayBuffer(n, ENV)
    step = 65536
    for start in range(0, n, step):
        part = source[start : start + step].numpy()
        buffer.add(
            obs=part[:, :24],
            action=part[:, 24:30],
            reward=part[:, 30],
            done=(start + np.arange(part.shape[0])) % episode == episode - 1,
            next_obs=part[:, 31:55],
        )
    return buffer


def as_tensordict(batch: dict[str, np.ndarray]) -> TensorDict:
    """cpprb's sample as the TensorDict a torch buffer returns (views, no copy)."""
    leaves = {
        "obs": torch.from_numpy(batch["obs"]),
        "action": torch.from_numpy(batch["action"]),
        "reward": torch.from_numpy(batch["reward"]).view(-1),
        "done": torch.from_numpy(batch["done"]).view(-1),
        "next": {"obs": torch.from_numpy(batch["next_obs"])},
    }
    if "indexes" in batch:
        leaves["index"] = torch.from_numpy(batch["indexes"].view(np.int64))
        leaves["_weight"] = torch.from_numpy(batch["weights"])
    return TensorDict(leaves, batch_size=[batch["obs"].shape[0]])


def as_columns(chunk: TensorDict) -> dict[str, np.ndarray]:
    """A walker TensorDict chunk as cpprb's ``add`` keywords (numpy views, no copy)."""
    return {
        "obs": chunk["obs"].numpy(),
        "action": chunk["action"].numpy(),
        "reward": chunk["reward"].numpy(),
        "done": chunk["done"].numpy(),
        "next_obs": chunk["next", "obs"].numpy(),
    }


def uniform_cases(buffer, idx: Callable[[], torch.Tensor], batch: int) -> Cases:
    """cpprb's uniform sample of ``batch`` rows, and its gather of given indices alone."""
    if buffer is None:
        return []
    return [
        (
            "cpprb ReplayBuffer._encode_sample(idx) (gather alone, numpy out)",
            lambda: buffer._encode_sample(idx().numpy()),
            True,
        ),
        ("cpprb ReplayBuffer.sample(), numpy out", lambda: buffer.sample(batch), False),
        (
            "cpprb ReplayBuffer.sample() -> TensorDict (from_numpy, timed)",
            lambda: as_tensordict(buffer.sample(batch)),
            False,
        ),
    ]


def extend_cases(buffer, chunks: Callable[[], TensorDict]) -> Cases:
    """cpprb's ``add`` of the same 1000-row TensorDict chunks into its full ring."""
    if buffer is None:
        return []
    return [
        (
            "cpprb ReplayBuffer.add (numpy views of the chunk, timed)",
            lambda: buffer.add(**as_columns(chunks())),
            False,
        )
    ]


def prioritized_cases(
    buffer, new_priority: Callable[[], torch.Tensor], gen: torch.Generator, batch: int
) -> Cases:
    """cpprb's prioritized sample + ``update_priorities``, and each alone.

    Every row gets a priority first, as the torch samplers' do (``rand + 0.01``).
    """
    if buffer is None:
        return []
    n = buffer.get_stored_size()
    buffer.update_priorities(np.arange(n), (torch.rand(n, generator=gen) + 0.01).numpy())
    drawn = [buffer.sample(batch, beta=BETA)["indexes"] for _ in range(64)]
    turn = [-1]

    def step() -> None:
        sample = buffer.sample(batch, beta=BETA)
        buffer.update_priorities(sample["indexes"], new_priority().numpy())

    def torch_step() -> None:
        sample = as_tensordict(buffer.sample(batch, beta=BETA))
        buffer.update_priorities(sample["index"].numpy(), new_priority().numpy())

    def update() -> None:
        turn[0] = (turn[0] + 1) % len(drawn)
        buffer.update_priorities(drawn[turn[0]], new_priority().numpy())

    return [
        ("cpprb PrioritizedReplayBuffer sample + update_priorities, numpy", step, False),
        ("cpprb, the same -> TensorDict (from_numpy, timed)", torch_step, False),
        ("  cpprb sample() alone, numpy out", lambda: buffer.sample(batch, beta=BETA), True),
        ("  cpprb update_priorities alone", update, True),
    ]


def prioritized_peer(
    source: torch.Tensor,
    ours_step: Callable[[], object],
    new_priority: Callable[[], torch.Tensor],
    gen: torch.Generator,
    *,
    episode: int,
    batch: int,
    reps: int,
) -> tuple[Cases, list[float], list[list[float]]]:
    """cpprb's prioritized cases timed in turn with ``ours_step`` (in a new order each round).

    Returns the cases (their calls dropped, so cpprb's buffer is freed), ours' per-round
    times and the cases'; ``([], [], [])`` without cpprb.
    """
    cases = prioritized_cases(
        walker_buffer(source, episode=episode, prioritized=True), new_priority, gen, batch
    )
    if not cases:
        return [], [], []
    times = per_call_interleaved(
        [ours_step, *(fn for _, fn, _ in cases)],
        repeats=reps,
        warmup=5,
        shuffle=random.Random(reps),
    )
    return [(label, None, part) for label, _, part in cases], times[0], times[1:]


def table_rows(
    cases: Cases, times: list[list[float]], columns: Callable[[float, bool], tuple]
) -> list[tuple]:
    """A table row a case: its label, its median in ms, then ``columns(median, part)``."""
    rows = []
    for (label, _, part), samples in zip(cases, times):
        t = statistics.median(samples)
        rows.append((label, f"{t * 1e3:.3f}", *columns(t, part)))
    return rows


def print_versus(
    cases: Cases,
    times: list[list[float]],
    whole: tuple[str, list[float]],
    part: tuple[str, list[float]] | None = None,
) -> None:
    """Ours over each cpprb case, as speed-ups (cpprb's time / ours): the median of the
    per-round ratios and their deciles. ``whole`` and ``part`` name ours and its samples."""
    for (label, _, is_part), peer in zip(cases, times):
        if is_part and part is None:
            continue
        what, ours = part if is_part else whole
        median, low, high = ratio_spread(peer, ours)
        print(
            f"  speed-up of {what} over {label.strip()}: {median:.2f}x "
            f"(per-round ratios, deciles {low:.2f}-{high:.2f})"
        )
