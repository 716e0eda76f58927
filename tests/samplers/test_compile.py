"""No recompiles: a compiled extend + sample loop over every torchstore sampler compiles once.

The fill level changes on every extend. A sampler that handed ``torch.randint`` the row
count as a Python int burnt it into the graph and recompiled at every new count until
dynamo's recompile limit; here the frame count must stop growing after the warm-up calls,
over torchrl's ``LazyTensorStorage`` and over ``StoreReplay``, below and at capacity.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter

from torchstore.data.replay.ring import StoreReplay
from torchstore.samplers import (
    ERE,
    PhiloxSampler,
    PrioritizedSampler,
    SequenceWindowSampler,
    UniformSampler,
)

CAPACITY = 60
SAMPLERS = {
    "uniform": lambda: UniformSampler(),
    "uniform-seeded": lambda: UniformSampler(seed=1),
    "uniform-ere": lambda: UniformSampler(ere=ERE(c_min=3)),
    "uniform-seeded-ere": lambda: UniformSampler(seed=1, ere=ERE(c_min=3)),
    "philox": lambda: PhiloxSampler(seed=2),
    "prioritized": lambda: PrioritizedSampler(CAPACITY),
    "prioritized-seeded": lambda: PrioritizedSampler(CAPACITY, seed=3),
    "windows": lambda: SequenceWindowSampler(2, seed=4),
}
STORAGES = {
    "torchrl": lambda: LazyTensorStorage(CAPACITY, compilable=True),
    "store": lambda: StoreReplay(CAPACITY, compilable=True),
}


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_extend_and_sample_compile_once(sampler, storage):
    if sampler == "windows" and storage == "torchrl":
        pytest.skip("windows need a storage with an episode index")
    torch._dynamo.reset()
    rb = ReplayBuffer(
        storage=STORAGES[storage](),
        sampler=SAMPLERS[sampler](),
        writer=RoundRobinWriter(compilable=True),
        batch_size=8,
        compilable=True,
    )
    counter = CompileCounter()

    @torch.compile(backend=counter)
    def step(rows):
        rb.extend(rows)
        return rb.sample()

    frames = []
    for i in range(16):  # 5 rows a step: the ring fills at step 12 and then wraps
        batch = step(torch.arange(5 * i, 5 * i + 5, dtype=torch.float32).unsqueeze(-1))
        assert batch.shape == (8, 1)
        frames.append(counter.frame_count)
    assert len(rb) == CAPACITY
    assert frames[3] > 0, "nothing was compiled"
    assert frames[3:] == [frames[3]] * len(frames[3:]), f"recompiled: frame counts {frames}"
