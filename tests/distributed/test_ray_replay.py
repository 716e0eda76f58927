"""The Ray-served StoreReplay on a local cluster: collectors, a learner, checkpoints, a kill."""

from __future__ import annotations

import time

import pytest
import torch

ray = pytest.importorskip("ray")

from torchstore.data import StoreSet  # noqa: E402
from torchstore.distributed import init_local_ray, serve_replay, start_collectors  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    init_local_ray(num_cpus=2)
    yield
    ray.shutdown()


def test_collectors_feed_the_served_buffer_and_their_shards(cluster, tmp_path):
    """Two collector actors feed a served prioritized buffer and write shards; the buffer is
    steered, checkpointed and resumed in a new actor; then one collector is killed mid-run
    (one set of actors for both parts: each actor start imports torch and torchrl)."""
    buffer = serve_replay(20000, batch_size=64, sampler="prioritized")
    try:
        collectors = start_collectors(buffer, tmp_path / "shards", 2, frames_per_batch=50)
        stats = ray.get([c.collect.remote(450) for c in collectors], timeout=300)
        assert [s["rows"] for s in stats] == [450, 450] and len(buffer) == 900
        with StoreSet(tmp_path / "shards") as shards:
            # Pendulum episodes are 200 steps: two finished episodes per collector
            assert shards.num_episodes == 4 and len(shards.shards) == 2
            assert torch.equal(shards.episodes.lengths, torch.full((4,), 200))
            assert bool(shards.episode(0)["next", "truncated"][-1])
        batch = buffer.sample()
        assert batch.batch_size == torch.Size([64]) and ("next", "reward") in batch.keys(True)
        # the learner steers the sampler through update_priority: one row gets all the mass
        batch["td_error"] = torch.where(batch["index"] == batch["index"][0], 1e6, 1e-6)
        buffer.update_tensordict_priority(batch)
        favourite = int(batch["index"][0])
        hits = torch.cat([buffer.sample()["index"] for _ in range(5)])
        assert (hits == favourite).float().mean() > 0.5  # uniform: 1/900
        buffer.dumps(tmp_path / "checkpoint")
        _kill_a_collector_and_lose_nothing_committed(buffer, *collectors, tmp_path / "shards")
    finally:
        buffer.close()
    # a new actor resumes from the checkpoint: rows and priorities
    resumed = serve_replay(
        20000, batch_size=64, sampler="prioritized", resume=tmp_path / "checkpoint"
    )
    try:
        assert len(resumed) == 900
        hits = torch.cat([resumed.sample()["index"] for _ in range(5)])
        assert (hits == favourite).float().mean() > 0.5  # uniform: 1/900
    finally:
        resumed.close()


def _kill_a_collector_and_lose_nothing_committed(buffer, victim, survivor, folder) -> None:
    with StoreSet([folder / "collector-0.h5"]) as one:
        had = one.num_episodes
    running = victim.collect.remote(1_000_000)
    deadline = time.monotonic() + 300
    while True:
        with StoreSet([folder / "collector-0.h5"]) as one:
            if one.num_episodes >= had + 1:  # killed mid-run, after a commit of this run
                break
        assert time.monotonic() < deadline, "the collector never committed another episode"
        time.sleep(0.2)
    ray.kill(victim)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running, timeout=120)
    before = len(buffer)
    with StoreSet(folder) as shards:
        committed = shards.num_episodes
        assert committed >= 5 and before >= len(shards)  # every committed row was extended
        first = shards.episode(0)
    # the learner goes on: the buffer still serves, and the other collector still feeds it
    assert buffer.sample().batch_size == torch.Size([64])
    ray.get(survivor.collect.remote(200), timeout=300)
    assert len(buffer) >= before + 200
    with StoreSet(folder) as shards:
        assert shards.num_episodes >= committed + 1
        assert (shards.episode(0) == first).all()
    ray.get(survivor.close.remote(), timeout=120)
