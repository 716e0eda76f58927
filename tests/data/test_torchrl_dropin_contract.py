"""Drop-in cases a torchrl user meets, each run on LazyTensorStorage and on StoreReplay.

Column reads (``storage.get(key)``), torchrl's ``Sequence`` sample unit, and state dicts:
every case does the same operations on both storages, for ``ndim`` 1 and 2, and asserts
the same observable results.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers import Sequence

from torchstore.data.replay import StoreReplay

logging.getLogger("torchrl").setLevel(logging.WARNING)

STORAGES = {"LazyTensorStorage": LazyTensorStorage, "StoreReplay": StoreReplay}


def data(ndim: int) -> TensorDict:
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[6, 9, 15]] = True
    td = TensorDict({"obs": torch.arange(20.0), ("next", "done"): done}, [20])
    return td if ndim == 1 else td.reshape(2, 10)


def run_both(fn, ndim):
    return [fn(cls(20, ndim=ndim)) for cls in STORAGES.values()]


@pytest.mark.parametrize("ndim", [1, 2])
def test_get_by_key_returns_the_column(ndim):
    def run(storage):
        rb = TensorDictReplayBuffer(storage=storage)
        rb.extend(data(ndim)[..., :7] if ndim == 2 else data(ndim)[:13])
        return [
            (tuple(storage.get(key).shape), storage.get(key).tolist())
            for key in ("obs", ("next", "done"), "index")
        ]

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl


def test_get_of_a_missing_key_is_a_key_error():
    rb = TensorDictReplayBuffer(storage=StoreReplay(10))
    rb.extend(data(1)[:4])
    with pytest.raises(KeyError, match="no column 'reward'"):
        rb.storage.get("reward")


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("length", [1, 4])
def test_sequence_sample_unit_gives_the_same_batches(ndim, length):
    def run(storage):
        rb = TensorDictReplayBuffer(
            storage=storage, batch_size=3, sample_unit=Sequence(length=length)
        )
        rb.extend(data(ndim))
        out = []
        for seed in range(4):
            torch.manual_seed(seed)
            sample = rb.sample()
            out.append((tuple(sample.shape), sample["obs"].tolist()))
        return out

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl
    assert torchrl[0][0] == (3 * length,)
