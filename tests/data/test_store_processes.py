"""A store crosses a process boundary as its recipe: pickled, it is the path it was opened
from, and the other side opens the file itself (before, pickling one raised ``TypeError:
cannot pickle '_thread._local'``, so a spawned ``DataLoader`` worker could not take one)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from _store_rows import StoreRows
from torch.utils.data import DataLoader

from torchstore.data.store.store import TrajectoryStore
from torchstore.data.store.store_set import StoreSet
from torchstore.demo import write_demo_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(tmp_path_factory.mktemp("processes") / "demo.h5", episodes=4, steps=25)


@pytest.fixture(scope="module")
def rows(store_path):
    with TrajectoryStore(store_path) as store:
        return store.read_slab(0, store.num_rows)


def test_a_store_pickles_as_the_path_it_was_opened_from(store_path, rows):
    with TrajectoryStore(store_path) as store:
        with pickle.loads(pickle.dumps(store)) as copy:
            assert type(copy) is TrajectoryStore and copy is not store
            assert copy.path == store.path
            assert torch.equal(copy.read_slab(0, copy.num_rows)["obs"], rows["obs"])
        assert torch.equal(store.read_slab(0, store.num_rows)["obs"], rows["obs"])  # still open


@pytest.mark.parametrize("given", ["folder", "shards"])
def test_a_store_set_pickles_as_its_folder_or_its_shards(tmp_path, given):
    folder = tmp_path / "set"
    folder.mkdir()
    shards = [write_demo_store(folder / f"{k}.h5", episodes=2 + k, steps=10) for k in range(2)]
    write_demo_store(tmp_path / "elsewhere.h5", episodes=1, steps=10)
    with StoreSet(folder if given == "folder" else shards) as store:
        with pickle.loads(pickle.dumps(store)) as copy:
            assert type(copy) is StoreSet and len(copy.shards) == 2
            assert torch.equal(copy.read_slab(0, 50)["obs"], store.read_slab(0, 50)["obs"])


def test_a_spawned_dataloader_worker_reads_the_parents_rows(store_path, rows):
    with TrajectoryStore(store_path) as store:
        loader = DataLoader(
            StoreRows(store),
            batch_size=25,
            num_workers=1,
            multiprocessing_context="spawn",
            timeout=120,
        )
        batches = list(loader)
    assert torch.equal(torch.cat([b["obs"] for b in batches]), rows["obs"])
    assert torch.equal(torch.cat([b["action"] for b in batches]), rows["action"])
    assert os.getpid() not in torch.cat([b["pid"] for b in batches]).tolist()  # read there
