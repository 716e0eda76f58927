"""Child-process side of the shared-ring contract tests (imported by a spawned process)."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def rows(start: int, n: int) -> TensorDict:
    t = torch.arange(start, start + n, dtype=torch.float32)
    done = (torch.arange(start, start + n) % 4 == 3).unsqueeze(-1)
    return TensorDict({"obs": t.unsqueeze(-1).expand(n, 2).clone(), "done": done}, [n])


def extend(buffers, start: int, n: int) -> None:
    for rb in buffers:
        rb.extend(rows(start, n))


def set_rows(storage, barrier, first: int, n: int) -> None:
    """Once both processes are at ``barrier``: ``n`` one-row writes at rows ``first...``."""
    barrier.wait(60)
    for row in range(first, first + n):
        storage.set(torch.tensor([row]), rows(row, 1))
