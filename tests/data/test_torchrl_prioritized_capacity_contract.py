"""A prioritized sampler whose capacity is below the storage's, on both storages.

torchrl's ``PrioritizedSampler(max_capacity)`` keeps its priorities in C++ segment trees of
the smallest power of two above ``max_capacity`` leaves: rows past ``max_capacity`` but
inside that size are stored and drawn like any other, and rows past it alias other
leaves (the tree ORs the index with its size). Over a StoreReplay it behaves exactly as
over a LazyTensorStorage. torchstore's ``PrioritizedSampler(capacity)`` holds ``capacity``
rows and refuses any row past it with a ValueError naming the capacity.

torchrl's trees are a C++ extension that may not load with the installed torch; the
torchrl cases then use the build ``benchmarks/_torchrl_tree.py`` caches, or are skipped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import prioritized as trl_prioritized

from tests.file_module import load_module
from torchstore.data.replay.ring import StoreReplay
from torchstore.samplers import PrioritizedSampler

logging.getLogger("torchrl").setLevel(logging.WARNING)

TREES = ("MinSegmentTreeFp32", "MinSegmentTreeFp64", "SumSegmentTreeFp32", "SumSegmentTreeFp64")


@pytest.fixture
def torchrl_trees(monkeypatch):
    """torchrl's C++ trees: from its wheel, else from a cached build, else skip."""
    if trl_prioritized.SumSegmentTreeFp32 is not None:
        return
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    tag = torch.__version__.replace("+", "_")
    built = base / "torchstore-benchmarks" / f"torchrl-csrc-torch{tag}" / "_torchrl.so"
    if not built.is_file():
        pytest.skip("torchrl's C++ segment trees do not load with this torch and none are built")
    ext = load_module(built, "_torchrl")
    for name in TREES:
        monkeypatch.setattr(trl_prioritized, name, getattr(ext, name))


def rows(n: int) -> TensorDict:
    return TensorDict({"obs": torch.arange(float(n)).unsqueeze(-1)}, [n])


def draws(storage) -> tuple:
    sampler = trl_prioritized.PrioritizedSampler(max_capacity=8, alpha=1.0, beta=1.0)
    rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=sampler,
        batch_size=64,
        generator=torch.Generator().manual_seed(0),
    )
    rb.extend(rows(12))  # rows 8..11 lie past max_capacity, inside torchrl's 16-leaf tree
    rb.update_priority(torch.tensor([3, 10]), torch.tensor([5.0, 100.0]))
    batch = rb.sample()
    leaves = [sampler._sum_tree[i] for i in range(16)]
    return batch["index"].tolist(), batch["priority_weight"].tolist(), leaves


def test_torchrls_sampler_past_max_capacity_behaves_alike_on_both_storages(torchrl_trees):
    torchrl = draws(LazyTensorStorage(20))
    ours = draws(StoreReplay(20))
    assert ours == torchrl
    index, _, leaves = ours
    assert leaves[10] == 100.0 and leaves[3] == 5.0  # row 10 kept past max_capacity 8
    assert max(index) >= 8


def test_torchstores_sampler_refuses_rows_past_its_capacity():
    storage = StoreReplay(20)
    rb = TensorDictReplayBuffer(storage=storage, sampler=PrioritizedSampler(8), batch_size=4)
    rb.extend(rows(8))
    with pytest.raises(ValueError, match=r"capacity \(8\)"):
        rb.update_priority(torch.tensor([9]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"capacity \(8\)"):
        rb.extend(rows(2))  # fresh rows 8 and 9 get the default priority
