"""One seed, the same rows on every face of the sampling core.

The torchrl samplers (``UniformSampler(seed=)``, ``PhiloxSampler``, ``PrioritizedSampler(seed=)``
in a ``ReplayBuffer``), the device path (``sample_into``) and both DataModules draw from the
one Philox stream through the same policy functions, so over the same rows they return the
same indices (and importance weights) batch after batch. Also: ERE, windows and prioritized
sampling through the DataModules, and their defaults.
"""

from __future__ import annotations

import pytest
import torch
from torchrl.data import ReplayBuffer

from torchstore.data import TrajectoryStore
from torchstore.data.replay.ring import StoreReplay
from torchstore.demo import write_demo_store
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule
from torchstore.samplers import (
    ERE,
    PhiloxSampler,
    PrioritizedSampler,
    SequenceWindowSampler,
    UniformSampler,
    empty_batch,
    sample_into,
)

EPISODES, STEPS, BATCH = 6, 25, 32


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("faces") / "demo.h5"
    return write_demo_store(path, episodes=EPISODES, steps=STEPS)


@pytest.fixture
def ring(store_path):
    with TrajectoryStore(store_path) as store:
        return StoreReplay.from_store(store)


def batches(dm, n=3):
    """The first ``n`` training batches, over as many epochs as that takes."""
    out = []
    while len(out) < n:
        out.extend(b for _, b in zip(range(n - len(out)), dm.train_dataloader()))
    return out


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_uniform_rows_are_the_same_on_every_face(store_path, ring, seed):
    dm = OfflineDataModule(store_path, batch_size=BATCH, seed=seed, device="cpu")
    demo = DemonstrationDataModule(
        store_path,
        batch_size=BATCH,
        obs_keys=["obs"],
        action_keys=["action"],
        seed=seed,
        device="cpu",
        normalize=False,
    )
    rb = ReplayBuffer(storage=ring, sampler=UniformSampler(seed=seed), batch_size=BATCH)
    philox_rb = ReplayBuffer(storage=ring, sampler=PhiloxSampler(seed=seed), batch_size=BATCH)
    device_sampler = PhiloxSampler(seed=seed)
    out = empty_batch(ring, BATCH)
    for offline, demonstration in zip(batches(dm), batches(demo)):
        want = offline["index"]
        assert torch.equal(demonstration["index"], want)
        _, info = rb.sample(return_info=True)
        assert torch.equal(info["index"], want)
        _, info = philox_rb.sample(return_info=True)
        assert torch.equal(info["index"], want)
        assert torch.equal(sample_into(ring, device_sampler, out)["index"], want)
        assert torch.equal(out["obs"], offline["obs"])


def test_prioritized_rows_and_weights_are_the_same_on_every_face(store_path, ring):
    rows = EPISODES * STEPS
    dm = OfflineDataModule(
        store_path,
        batch_size=BATCH,
        seed=5,
        sampler="prioritized",
        device="cpu",
        prioritized_alpha=0.7,
        prioritized_beta=0.5,
    )
    demo = DemonstrationDataModule(
        store_path,
        batch_size=BATCH,
        obs_keys=["obs"],
        action_keys=["action"],
        seed=5,
        device="cpu",
        normalize=False,
        sampler="prioritized",
        prioritized_alpha=0.7,
        prioritized_beta=0.5,
    )
    eager = PrioritizedSampler(ring.capacity, alpha=0.7, beta=0.5, seed=5)
    device = PrioritizedSampler(ring.capacity, alpha=0.7, beta=0.5, seed=5)
    rb = ReplayBuffer(storage=ring, sampler=eager, batch_size=BATCH)
    priority = (torch.arange(rows) % 9 + 1).double()
    for face in (dm, demo):
        face.setup()
        face.update_priority(torch.arange(rows), priority)
    rb.update_priority(torch.arange(rows), priority)
    device.update_priority(torch.arange(rows), priority)
    out = empty_batch(ring, BATCH)
    for offline, demonstration in zip(batches(dm), batches(demo)):
        want, weight = offline["index"], offline["priority_weight"]
        assert len(set(want.tolist())) > 1 and not torch.all(weight == 1)
        assert torch.equal(demonstration["index"], want)
        assert torch.equal(demonstration["priority_weight"], weight)
        _, info = rb.sample(return_info=True)
        assert torch.equal(info["index"], want) and torch.equal(info["priority_weight"], weight)
        sample_into(ring, device, out)
        assert torch.equal(out["index"], want) and torch.equal(out["priority_weight"], weight)


def test_ere_draws_only_the_newest_training_rows(store_path, ring):
    ere = ERE(eta=0.5, c_min=10)
    ere.set_progress(3, 3)  # c = max(150 * 0.5**1000, 10) = 10
    dm = OfflineDataModule(store_path, batch_size=256, seed=3, device="cpu", ere=ere)
    seen = torch.cat([b["index"] for b in batches(dm, 4)])
    total = EPISODES * STEPS
    assert set(seen.tolist()) == set(range(total - 10, total))
    # the same rows as the torchrl face with the same schedule and seed
    twin = ERE(eta=0.5, c_min=10)
    twin.set_progress(3, 3)
    rb = ReplayBuffer(storage=ring, sampler=UniformSampler(seed=3, ere=twin), batch_size=256)
    first = batches(OfflineDataModule(store_path, batch_size=256, seed=3, device="cpu", ere=ere), 1)
    assert torch.equal(rb.sample(return_info=True)[1]["index"], first[0]["index"])
    # the schedule is checkpointed with the stream
    state = dm.state_dict()
    ere.set_progress(1, 3)
    dm.load_state_dict(state)
    assert (dm.ere.k, dm.ere.K) == (3, 3)


def test_ere_reaches_prioritized_and_demonstration_sampling(store_path):
    ere = ERE(eta=0.5, c_min=7)
    ere.set_progress(2, 2)
    dm = OfflineDataModule(
        store_path, batch_size=128, seed=1, device="cpu", ere=ere, sampler="prioritized"
    )
    seen = torch.cat([b["index"] for b in batches(dm, 3)])
    total = EPISODES * STEPS
    assert set(seen.tolist()) <= set(range(total - 7, total)) and len(set(seen.tolist())) > 3
    demo = DemonstrationDataModule(
        store_path,
        batch_size=128,
        obs_keys=["obs"],
        action_keys=["action"],
        seed=1,
        device="cpu",
        ere=ere,
        normalize=False,
    )
    seen = torch.cat([b["index"] for b in batches(demo, 3)])
    assert set(seen.tolist()) <= set(range(total - 7, total))


def test_windows_stay_inside_one_episode_and_cover_every_start(store_path):
    T = 5
    dm = OfflineDataModule(
        store_path, batch_size=64, seed=4, device="cpu", window=T, val_episodes=1, layout="torchrl"
    )
    starts = set()
    for batch in batches(dm, 20):
        index = batch["index"]
        assert index.shape == (64, T) and batch["observation"].shape[:2] == (64, T)
        assert batch[("next", "reward")].shape == (64, T, 1)
        assert torch.equal(index - index[:, :1], torch.arange(T).expand(64, T))
        episode = index // STEPS
        assert torch.equal(episode, batch["episode"].unsqueeze(1).expand(64, T))
        assert bool((batch["episode"] < EPISODES - 1).all())  # never a validation episode
        starts.update((index[:, 0] % STEPS).tolist())
    assert starts == set(range(STEPS - T + 1))  # every start, the last one included
    # one epoch is one pass over the training windows; validation walks every window
    assert dm.steps_per_epoch == (EPISODES - 1) * (STEPS - T + 1) // 64
    val = [b["index"] for b in dm.val_dataloader()]
    val = torch.cat(val)
    assert val.shape == (STEPS - T + 1, T) and bool((val // STEPS == EPISODES - 1).all())


def test_window_longer_than_every_episode_is_refused(store_path):
    dm = OfflineDataModule(store_path, batch_size=8, window=STEPS + 1, device="cpu")
    with pytest.raises(ValueError, match=r"window \(26\) is longer than every training episode"):
        dm.setup()


def test_prioritized_demonstration_batches_carry_weights_and_follow_priorities(store_path):
    demo = DemonstrationDataModule(
        store_path,
        batch_size=256,
        obs_keys=["obs"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=3,
        sampler="prioritized",
        device="cpu",
        normalize=False,
    )
    demo.setup()
    rows = torch.arange(EPISODES * STEPS)
    demo.update_priority(rows, (rows == 25).double())  # all mass on episode 1, step 0
    batch = batches(demo, 1)[0]
    assert bool((batch["index"] == 25).all()) and batch["priority_weight"].shape == (256,)
    assert batch["obs", "obs"].shape == (256, 2, 3) and bool(
        batch["obs_mask"][:, 0].logical_not().all()
    )
    assert bool((batch["episode"] == 1).all())
    with pytest.raises(RuntimeError, match="needs sampler='prioritized'"):
        DemonstrationDataModule(
            store_path, batch_size=4, obs_keys=["obs"], action_keys=["action"], device="cpu"
        ).update_priority(rows, 1.0)


def test_defaults_are_one_step_one_action_and_one_pass(store_path):
    demo = DemonstrationDataModule(
        store_path, batch_size=16, obs_keys=["obs"], action_keys=["action"], device="cpu"
    )
    assert (demo.n_obs_steps, demo.action_horizon) == (1, 1)
    batch = batches(demo, 1)[0]
    assert batch["obs", "obs"].shape == (16, 1, 3) and batch["action", "action"].shape == (16, 1, 1)
    assert demo.steps_per_epoch == EPISODES * STEPS // 16
    dm = OfflineDataModule(store_path, batch_size=16, val_episodes=1, device="cpu")
    assert dm.steps_per_epoch == (EPISODES - 1) * STEPS // 16
    assert len(dm.train_dataloader()) == dm.steps_per_epoch
    big = OfflineDataModule(store_path, batch_size=10_000, device="cpu")
    assert big.steps_per_epoch == 1


def test_windows_are_the_same_on_the_torchrl_face(store_path, ring):
    T = 6
    dm = OfflineDataModule(store_path, batch_size=16, seed=9, device="cpu", window=T)
    rb = ReplayBuffer(storage=ring, sampler=SequenceWindowSampler(T, seed=9), batch_size=16 * T)
    for batch in batches(dm, 3):
        _, info = rb.sample(return_info=True)
        assert torch.equal(info["index"].reshape(16, T), batch["index"])
        assert torch.equal(info["episode_id"][::T], batch["episode"])


def test_ere_with_prioritized_needs_contiguous_training_rows(store_path, monkeypatch):
    monkeypatch.setattr("torchstore.lightning.base.rank_info", lambda trainer: (0, 2))
    dm = OfflineDataModule(
        store_path,
        batch_size=8,
        device="cpu",
        sampler="prioritized",
        ere=ERE(c_min=5),
        shard_episodes=True,
    )
    with pytest.raises(ValueError, match="needs the training rows to be one contiguous block"):
        dm.setup()
