"""A shard folder goes wherever a store goes: DataModules, replay prefill."""

from __future__ import annotations

import pytest
import torch

from torchstore.data import StoreSet, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.replay.ring import StoreReplay
from torchstore.demo import write_demo_store
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """One store, and the same episodes split over three shard files."""
    root = tmp_path_factory.mktemp("sets")
    single = write_demo_store(root / "one.h5", episodes=9, steps=15)
    folder = root / "shards"
    folder.mkdir()
    with TrajectoryStore(single) as store:
        for k, episodes in enumerate([range(0, 2), range(2, 7), range(7, 9)]):
            with TrajectoryStoreWriter(folder / f"part-{k}.h5", list(store.columns)) as w:
                for e in episodes:
                    w.add_episode(store.episode(e, raw=True), raw=True)
    return single, folder


def _batches(dm, n=3):
    return [b.clone() for _, b in zip(range(n), dm.train_dataloader())]


@pytest.mark.parametrize("resident", ["all", 40])
def test_offline_module_over_a_folder_draws_what_one_store_draws(layouts, resident):
    single, folder = layouts
    kw = dict(batch_size=8, steps_per_epoch=3, device="cpu", seed=3, val_episodes=2)
    if resident != "all":
        kw.update(resident=resident, resident_blocks=2)
    got = _batches(OfflineDataModule(folder, **kw))
    want = _batches(OfflineDataModule(single, **kw))
    for a, b in zip(got, want):
        assert (a == b).all()
    with StoreSet(folder) as opened:  # an open set is accepted as an open store is
        assert all((a == b).all() for a, b in zip(_batches(OfflineDataModule(opened, **kw)), want))


def test_demonstration_module_windows_stay_inside_episodes_across_shards(layouts):
    single, folder = layouts
    kw = dict(batch_size=4, steps_per_epoch=2, device="cpu", seed=1, val_episodes=1)
    with TrajectoryStore(single) as store:
        names = [c.name for c in store.columns]
    obs = "obs" if "obs" in names else names[0]
    act = "action"
    got = _batches(DemonstrationDataModule(folder, obs_keys=[obs], action_keys=[act], **kw), 2)
    want = _batches(DemonstrationDataModule(single, obs_keys=[obs], action_keys=[act], **kw), 2)
    for a, b in zip(got, want):
        assert (a == b).all()


def test_replay_prefilled_from_a_set(layouts):
    single, folder = layouts
    with StoreSet(folder) as shards, TrajectoryStore(single) as store:
        ring = StoreReplay.from_store(shards, 100)
        want = StoreReplay.from_store(store, 100)
        assert len(ring) == len(want) == 100
        idx = torch.arange(100)
        assert (ring.get(idx) == want.get(idx)).all()
