"""Compiled writes on LazyTensorStorage(compilable=True) and on StoreReplay(compilable=True).

torchrl's compilable storage takes ``set`` under ``torch.compile(fullgraph=True)``: on a full
ring, a stream of writes compiles once. StoreReplay does the same after its first (eager)
write, with the same rows; its episode index catches up on the next eager read. Its
``get`` is opaque to the compiler, as torchrl's is.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.testing import CompileCounter
from torchrl.data import LazyTensorStorage

from torchstore.data.replay.ring import StoreReplay

logging.getLogger("torchrl").setLevel(logging.WARNING)


def chunk(k: int) -> TensorDict:
    done = torch.zeros(8, 1, dtype=torch.bool)
    done[-1] = k % 2 == 1  # an episode ends every other chunk (16 rows)
    return TensorDict({"obs": torch.full((8, 3), float(k)), "done": done}, [8], device="cpu")


def compiled_writes(storage, backend) -> list[float]:
    for k in range(8):  # fill the ring eagerly
        storage.set(torch.arange(8) + 8 * k, chunk(k))
    write = torch.compile(lambda idx, data: storage.set(idx, data), fullgraph=True, backend=backend)
    for k in range(8, 13):
        write((torch.arange(8) + 8 * k) % 64, chunk(k))
    return storage[:]["obs"][:, 0].tolist()


@pytest.mark.parametrize("backend", ["counter", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_compiled_set_of_a_full_ring_compiles_once_with_torchrls_rows(backend):
    counters = {}
    rows = {}
    for cls in (LazyTensorStorage, StoreReplay):
        counters[cls] = CompileCounter()
        storage = cls(64, compilable=True)
        rows[cls] = compiled_writes(storage, counters[cls] if backend == "counter" else backend)
    assert rows[StoreReplay] == rows[LazyTensorStorage]
    if backend == "counter":
        assert counters[StoreReplay].frame_count == counters[LazyTensorStorage].frame_count == 1


def test_the_episode_index_catches_up_after_compiled_writes():
    storage = StoreReplay(64, compilable=True)
    compiled_writes(storage, CompileCounter())
    assert len(storage) == 64 and storage.cursor == 40
    start, length, ids = storage.episode_segments()
    assert (start.tolist(), length.tolist()) == ([40, 48, 0, 16, 32], [8, 16, 16, 16, 8])
    assert bool((ids[1:] > ids[:-1]).all())
    storage.set(torch.arange(40, 48), chunk(13))  # eager again: an append at the cursor
    start, length, _ = storage.episode_segments()
    assert (start.tolist(), length.tolist()) == ([48, 0, 16, 32], [16, 16, 16, 16])


@pytest.mark.parametrize(
    "case",
    ["not compilable", "other leaves", "first write"],
)
def test_compiled_writes_outside_the_graph_safe_case_are_refused(case):
    storage = StoreReplay(16, compilable=case != "not compilable")
    if case != "first write":
        storage.set(torch.arange(8), chunk(0))
    data = chunk(1)
    if case == "other leaves":
        data = data.exclude("done")
    write = torch.compile(lambda idx, d: storage.set(idx, d), fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="write this one eagerly"):
        write(torch.arange(8, 16), data)
    # without fullgraph the same write breaks the graph and runs eagerly
    torch.compile(lambda idx, d: storage.set(idx, d), backend="eager")(torch.arange(8, 16), data)
    if case == "first write":  # rows 8..15 written, the length grows by 8 (as torchrl's)
        assert len(storage) == 8
    else:
        assert len(storage) == 16 and storage[8:16]["obs"][:, 0].tolist() == [1.0] * 8
