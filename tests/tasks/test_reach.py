from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from torchstore import TrajectoryStore
from torchstore.cli import main
from torchstore.errors import DestinationError
from torchstore.tasks import (
    TASK_ID,
    RandomPolicy,
    ReachExpert,
    ReachTask,
    evaluate,
    reach_columns,
    write_demo_data,
)

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "reach_demo.h5"


def test_expert_succeeds_and_random_rarely_does():
    task = ReachTask()
    expert = evaluate(task, ReachExpert(seed=0), episodes=30, seed=500)
    random = evaluate(task, RandomPolicy(2, seed=0), episodes=30, seed=500)
    assert expert["success_rate"] >= 0.9
    assert random["success_rate"] <= 0.15
    assert expert["mean_length"] < random["mean_length"]
    assert expert["mean_return"] > random["mean_return"]


def test_reset_and_step_follow_gymnasium_and_are_deterministic_by_seed():
    task = ReachTask()
    obs, info = task.reset(seed=3)
    assert set(obs) == {"state", "pixels"} and info["success"] is False
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (6,)
    assert np.all(obs["state"][2:4] == 0)  # starts at rest
    again, _ = ReachTask().reset(seed=3)
    np.testing.assert_array_equal(obs["state"], again["state"])
    other, _ = task.reset(seed=4)
    assert not np.array_equal(obs["state"], other["state"])
    obs, reward, terminated, truncated, info = task.step(np.array([1.0, 0.0]))
    assert isinstance(reward, float) and reward == pytest.approx(-info["distance"])
    assert obs["state"][2] > 0 and not terminated and not truncated


def test_success_terminates_and_max_steps_truncates():
    task = ReachTask(max_steps=5)
    task.reset(seed=0)
    task._state.update(pos=np.array([0.3, 0.3]), target=np.array([0.32, 0.3]), vel=np.zeros(2))
    _, reward, terminated, truncated, info = task.step(np.zeros(2))
    assert terminated and not truncated and info["success"] and reward > -0.1
    task.reset(seed=0)
    flags = [task.step(np.zeros(2))[2:4] for _ in range(5)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])


def test_moving_fast_through_the_target_is_not_success():
    task = ReachTask()
    task.reset(seed=0)
    task._state.update(
        pos=np.array([0.0, 0.0]), target=np.array([0.1, 0.0]), vel=np.array([1.0, 0.0])
    )
    _, _, terminated, _, info = task.step(np.zeros(2))
    assert info["distance"] < task.target_radius and not terminated


def test_render_shape_dtype_and_colours():
    task = ReachTask(image_size=40)
    task.reset(seed=1)
    task._state.update(pos=np.array([-0.5, 0.5]), target=np.array([0.5, -0.5]))
    frame = task.render()
    assert frame.shape == (40, 40, 3) and frame.dtype == np.uint8
    # target (red) in the lower right, agent (blue) in the upper left; row 0 is the top
    r, c = 30, 30
    assert frame[r, c, 0] > 150 and frame[r, c, 2] < 100
    r, c = 10, 10
    assert frame[r, c, 2] > 150 and frame[r, c, 0] < 100
    assert ReachTask().reset(seed=0)[0]["pixels"].shape == (32, 32, 3)


def test_errors_a_user_can_hit():
    with pytest.raises(ValueError, match=r"max_steps \(0\) must be an int >= 1"):
        ReachTask(max_steps=0)
    with pytest.raises(ValueError, match=r"image_size \(4\) must be an int >= 8"):
        ReachTask(image_size=4)
    with pytest.raises(TypeError, match=r"max_steps \(2.5\) must be an int >= 1"):
        ReachTask(max_steps=2.5)
    with pytest.raises(ValueError, match=r"target_radius \(0.0\) must be a finite number > 0"):
        ReachTask(target_radius=0.0)
    with pytest.raises(ValueError, match=r"damping \(-1.0\) must be a finite number >= 0"):
        ReachTask(damping=-1.0)
    with pytest.raises(RuntimeError, match=r"step\(\) called before reset\(\)"):
        ReachTask().step(np.zeros(2))
    with pytest.raises(RuntimeError, match=r"render\(\) called before reset\(\)"):
        ReachTask().render()
    with pytest.raises(ValueError, match=r"noise \(-0.1\) must be a finite number >= 0"):
        ReachExpert(noise=-0.1)
    with pytest.raises(ValueError, match=r"episodes \(0\) must be an int >= 1"):
        evaluate(ReachTask(), ReachExpert(), episodes=0)
    with pytest.raises(ValueError, match=r"action_dim \(0\) must be an int >= 1"):
        RandomPolicy(0)
    with pytest.raises(ValueError, match=r"high \(0.0\) must be greater than low \(1.0\)"):
        RandomPolicy(2, low=1.0, high=0.0)
    with pytest.raises(ValueError, match=r"episodes \(0\) must be an int >= 1"):
        write_demo_data("unused.h5", episodes=0)


def test_evaluate_calls_a_policys_reset_each_episode():
    class Counting:
        resets = 0

        def reset(self):
            self.resets += 1

        def __call__(self, obs):
            return np.zeros(2, dtype=np.float32)

    policy = Counting()
    result = evaluate(ReachTask(max_steps=3), policy, episodes=4)
    assert policy.resets == 4 and result["mean_length"] == 3 and result["success_rate"] == 0


def _contents(path):
    with TrajectoryStore(path) as store:
        return (
            store.read_slab(0, store.num_rows, raw=True),
            store.episodes.lengths.clone(),
            store.manifest,
        )


def test_write_demo_data_columns_metadata_and_determinism(tmp_path):
    a = write_demo_data(tmp_path / "a.h5", episodes=4, seed=7)
    b = write_demo_data(tmp_path / "b.h5", episodes=4, seed=7)
    c = write_demo_data(tmp_path / "c.h5", episodes=4, seed=8)
    rows_a, lengths_a, manifest = _contents(a)
    rows_b, lengths_b, _ = _contents(b)
    rows_c, _, _ = _contents(c)
    assert torch.equal(lengths_a, lengths_b)
    assert all(torch.equal(rows_a.get(k), rows_b.get(k)) for k in rows_a.keys(True, True))
    assert not torch.equal(rows_a["state"][:5], rows_c["state"][:5])
    assert [s.name for s in manifest.columns] == [s.name for s in reach_columns()]
    assert manifest.env_id == TASK_ID and manifest.seed == 7
    meta = manifest.metadata
    assert meta["expert_success_rate"] == 1.0 and meta["expert"]["kind"].startswith("PD")
    assert ReachTask(**meta["task_config"]) == ReachTask()
    # transitions are consistent: next/state of row t is state of row t + 1 inside an episode
    first = int(lengths_a[0])
    assert torch.equal(rows_a["next", "state"][: first - 1], rows_a["state"][1:first])
    done = rows_a["done"]
    assert torch.equal(done, rows_a["terminated"] | rows_a["truncated"])
    assert int(done.sum()) == 4 and bool(done[first - 1])
    assert rows_a["pixels"].dtype == torch.uint8  # stored quantised
    assert a.read_bytes() == b.read_bytes()  # byte-reproducible: no timestamps anywhere
    assert manifest.created == ""


def test_write_demo_data_replaces_only_its_own_stores(tmp_path):
    path = write_demo_data(tmp_path / "sub" / "reach.h5", episodes=2)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="already exists"):
        write_demo_data(path, episodes=3)
    assert path.read_bytes() == before
    assert write_demo_data(path, episodes=3, overwrite=True) == path
    assert _contents(path)[1].numel() == 3
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    with pytest.raises(DestinationError, match="not a torchstore store"):
        write_demo_data(notes, episodes=2, overwrite=True)
    assert notes.read_text() == "keep me"
    with pytest.raises(ValueError, match="seed"):
        write_demo_data(tmp_path / "x.h5", episodes=2, seed=-1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "sub"]


def test_shipped_demo_file_matches_what_demo_data_regenerates(tmp_path):
    assert SHIPPED.exists(), (
        "data/reach_demo.h5 is missing: run `torchstore demo data/reach_demo.h5 --task reach`"
    )
    assert SHIPPED.stat().st_size < 4 * 2**20
    assert main(["demo", str(tmp_path / "again.h5"), "--task", "reach"]) == 0
    shipped_rows, shipped_lengths, shipped_manifest = _contents(SHIPPED)
    rows, lengths, manifest = _contents(tmp_path / "again.h5")
    assert torch.equal(shipped_lengths, lengths)
    assert all(torch.equal(shipped_rows.get(k), rows.get(k)) for k in rows.keys(True, True))
    assert shipped_manifest.metadata == manifest.metadata


def test_the_reproducible_demo_store_is_an_ordinary_store(tmp_path):
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.io.hdf5.reproducible import lookup3

    # lookup3 known answers (Bob Jenkins' lookup3.c driver), the checksum HDF5 metadata uses
    assert lookup3(b"") == 0xDEADBEEF
    assert lookup3(b"Four score and seven years ago") == 0x17770551
    assert lookup3(b"Four score and seven years ago", 1) == 0xCD628161
    path = write_demo_data(tmp_path / "reach.h5", episodes=2)
    rows, lengths, _ = _contents(path)
    first = int(lengths[0])
    with TrajectoryStore(path) as store:
        episode = store.read_slab(0, first)
    with TrajectoryStoreWriter.resume(path) as writer:  # appendable like any store
        writer.add_episode(episode)
    grown, grown_lengths, _ = _contents(path)
    assert grown_lengths.tolist() == [*lengths.tolist(), first]
    assert torch.equal(grown["state"][-first:], rows["state"][:first])
