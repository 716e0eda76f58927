"""torchrl's checkpointers on StoreReplay, run the same way as on LazyTensorStorage.

``rb.dumps(path)`` / ``rb.loads(path)`` with ``checkpointer=`` one of torchrl's
``TensorStorageCheckpointer`` family: a folder written from either storage loads into
either, with the same rows and length; StoreReplay to StoreReplay also keeps the cursor and
the episode index.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.checkpointers import (
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    ListStorageCheckpointer,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

from torchstore.data.replay.ring import StoreReplay
from torchstore.data.replay.torchrl_checkpointers import RING_FILE
from torchstore.errors import UnsupportedError

logging.getLogger("torchrl").setLevel(logging.WARNING)

STORAGES = {"LazyTensorStorage": LazyTensorStorage, "StoreReplay": StoreReplay}
CHECKPOINTERS = [
    TensorStorageCheckpointer,
    FlatStorageCheckpointer,
    NestedStorageCheckpointer,
    H5StorageCheckpointer,
]


def ted(n: int) -> TensorDict:
    """Rows in torchrl's TED layout (what the flat and nested checkpointers assume)."""
    t = torch.arange(n, dtype=torch.float32)
    obs = t.unsqueeze(-1).expand(n, 3).clone()
    done = ((torch.arange(n) % 5) == 4).unsqueeze(-1)
    false = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict(
        {
            "obs": obs,
            "action": t.unsqueeze(-1).clone(),
            "done": false,
            "terminated": false.clone(),
            "truncated": false.clone(),
            "next": {
                "obs": obs + 1,
                "reward": t.unsqueeze(-1).clone(),
                "done": done,
                "terminated": done.clone(),
                "truncated": false.clone(),
            },
        },
        [n],
    )


def rows(storage) -> TensorDict:
    out = storage[:]
    return out.exclude("index") if "index" in out.keys() else out


@pytest.mark.parametrize("checkpointer", CHECKPOINTERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("source", STORAGES)
@pytest.mark.parametrize("target", STORAGES)
def test_torchrl_checkpointer_folders_load_across_storages(tmp_path, checkpointer, source, target):
    written = TensorDictReplayBuffer(storage=STORAGES[source](12), checkpointer=checkpointer())
    written.extend(ted(17))  # wraps: the ring holds rows 5..16
    written.dumps(tmp_path)
    loaded = TensorDictReplayBuffer(storage=STORAGES[target](12), checkpointer=checkpointer())
    loaded.loads(tmp_path)
    assert len(loaded) == len(written) == 12
    assert (rows(loaded.storage) == rows(written.storage)).all()
    assert loaded._writer._cursor == written._writer._cursor == 5
    if source == target == "StoreReplay":
        a, b = written.storage, loaded.storage
        assert b.cursor == a.cursor == 5
        for x, y in zip(a.episode_segments(), b.episode_segments(), strict=True):
            assert x.tolist() == y.tolist()
        # writing on continues the same episodes
        loaded.extend(ted(3))
        written.extend(ted(3))
        assert (rows(loaded.storage) == rows(written.storage)).all()
        for x, y in zip(a.episode_segments(), b.episode_segments(), strict=True):
            assert x.tolist() == y.tolist()


def test_a_torchrl_folder_loads_as_a_wrapped_ring_with_episodes_from_the_done_flags(tmp_path):
    written = TensorDictReplayBuffer(
        storage=LazyTensorStorage(10), checkpointer=TensorStorageCheckpointer()
    )
    written.extend(ted(10))
    written.dumps(tmp_path)
    storage = StoreReplay(10)
    TensorDictReplayBuffer(storage=storage, checkpointer=TensorStorageCheckpointer()).loads(
        tmp_path
    )
    start, length, _ = storage.episode_segments()
    assert (start.tolist(), length.tolist()) == ([0, 5], [5, 5])
    assert storage.cursor == 0 and len(storage) == 10


def episodes_of(n: int, every: int, start: int = 0) -> TensorDict:
    step = torch.arange(start, start + n)
    done = (step % every == every - 1).unsqueeze(-1)
    return TensorDict({"obs": step.float().unsqueeze(-1), "done": done}, [n])


def test_a_ring_file_left_by_another_dump_is_not_trusted(tmp_path):
    """torchrl dumps another storage of the same length into a folder a StoreReplay dumped
    to: the ring file there describes other rows, so the load reads torchrl's convention
    (episodes from the done flags, wrapped exactly) instead of the stale cursor and index."""
    ours = StoreReplay(8)
    ours.checkpointer = TensorStorageCheckpointer()
    ours.set(torch.arange(8), episodes_of(8, 2))
    ours.set(torch.arange(3), episodes_of(3, 2, start=8))  # cursor 3
    ours.dumps(tmp_path)
    theirs = LazyTensorStorage(8)
    theirs.checkpointer = TensorStorageCheckpointer()
    theirs.set(torch.arange(8), episodes_of(8, 4))
    theirs.dumps(tmp_path)
    assert (tmp_path / RING_FILE).exists()
    back = StoreReplay(8)
    back.checkpointer = TensorStorageCheckpointer()
    back.loads(tmp_path)
    assert back.get(torch.arange(8))["obs"].reshape(-1).tolist() == list(range(8))
    start, length, _ = back.episode_segments()
    assert (start.tolist(), length.tolist(), back.cursor) == ([0, 4], [4, 4], 0)
    # the folder StoreReplay itself dumped is still restored exactly
    ours.dumps(tmp_path / "ours")
    again = StoreReplay(8)
    again.checkpointer = TensorStorageCheckpointer()
    again.loads(tmp_path / "ours")
    assert again.cursor == 3
    for x, y in zip(ours.episode_segments(), again.episode_segments(), strict=True):
        assert x.tolist() == y.tolist()


def test_multi_env_rings_checkpoint_through_torchrl_checkpointers(tmp_path):
    td = ted(16).reshape(2, 8)
    runs = []
    for name, cls in STORAGES.items():
        rb = TensorDictReplayBuffer(
            storage=cls(12, ndim=2), checkpointer=TensorStorageCheckpointer()
        )
        rb.extend(td)
        rb.dumps(tmp_path / name)
        runs.append(rb)
    for name in STORAGES:
        for cls in STORAGES.values():
            rb = TensorDictReplayBuffer(
                storage=cls(12, ndim=2), checkpointer=TensorStorageCheckpointer()
            )
            rb.loads(tmp_path / name)
            assert rb.storage.shape == runs[0].storage.shape
            assert (rows(rb.storage) == rows(runs[0].storage)).all()


def test_torchrl_checkpointer_hooks_run_on_store_replay(tmp_path):
    seen = []

    def hook(data, path=None):
        seen.append(tuple(data.batch_size))
        return data

    for cls in STORAGES.values():
        checkpointer = TensorStorageCheckpointer()
        checkpointer.register_save_hook(hook)
        rb = TensorDictReplayBuffer(storage=cls(8), checkpointer=checkpointer)
        rb.extend(ted(4))
        rb.dumps(tmp_path / cls.__name__)
    assert seen == [(8,), (8,)]


def test_other_checkpointers_are_refused_naming_what_to_use():
    with pytest.raises(UnsupportedError, match="StoreReplayCheckpointer .*TensorStorage"):
        TensorDictReplayBuffer(storage=StoreReplay(4), checkpointer=ListStorageCheckpointer())
    storage = StoreReplay(4)
    with pytest.raises(TypeError, match="TensorStorageCheckpointer"):
        storage.register_save_hook(lambda data, path: data)


def test_pytree_rings_refuse_torchrl_checkpointers(tmp_path):
    storage = StoreReplay(4)
    storage.checkpointer = TensorStorageCheckpointer()
    storage.set(torch.arange(2), (torch.zeros(2, 3), torch.ones(2)))
    with pytest.raises(UnsupportedError, match="pytrees"):
        storage.dumps(tmp_path)
