from __future__ import annotations

import json
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning_fixtures import QUIET, Recorder, demo_xy
from tensordict import TensorDict

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.demo import write_demo_store
from torchstore.errors import ColumnError
from torchstore.lightning import DemonstrationDataModule, Normalizer, stats_path
from torchstore.lightning import normalizer as normalizer_module

EPISODES, STEPS = 6, 20
TAGGED = (
    ColumnSpec("state", torch.float32, (2,)),  # (episode, step)
    ColumnSpec("act", torch.float32, (2,)),  # (episode, step)
    ColumnSpec("flag", torch.bool),
)


def write_tagged(path: Path, lengths) -> Path:
    """A store whose rows say which episode and step they are."""
    with TrajectoryStoreWriter(path, TAGGED, overwrite=True) as w:
        for e, n in enumerate(lengths):
            tag = torch.stack([torch.full((n,), float(e)), torch.arange(n, dtype=torch.float32)], 1)
            w.add_episode({"state": tag, "act": tag + 0.5, "flag": torch.arange(n) % 2 == 0})
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(
        tmp_path_factory.mktemp("demo") / "demo.h5", episodes=EPISODES, steps=STEPS
    )


def make(path, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("obs_keys", ["obs"])
    kw.setdefault("action_keys", ["action"])
    kw.setdefault("n_obs_steps", 2)
    kw.setdefault("action_horizon", 4)
    kw.setdefault("steps_per_epoch", 3)
    kw.setdefault("device", "cpu")
    return DemonstrationDataModule(path, **kw)


def first(dm):
    return next(iter(dm.train_dataloader()))


def check_windows(batch, n_obs, horizon, lengths):
    """Windows come from t's episode; padding repeats the edge step; masks mark real steps."""
    obs, act = batch["obs", "state"], batch["action", "act"]
    episode = batch["episode"]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    t_step = batch["index"] - torch.as_tensor(offsets)[episode]
    length = torch.as_tensor(lengths)[episode]
    want_obs = t_step.unsqueeze(1) + torch.arange(1 - n_obs, 1)
    want_act = t_step.unsqueeze(1) + torch.arange(horizon)
    assert torch.equal(batch["obs_mask"], want_obs >= 0)
    assert torch.equal(batch["action_mask"], want_act < length.unsqueeze(1))
    assert torch.equal(obs[..., 0], episode.unsqueeze(1).float().expand_as(want_obs))
    assert torch.equal(act[..., 0], episode.unsqueeze(1).float().expand_as(want_act) + 0.5)
    assert torch.equal(obs[..., 1], want_obs.clamp(min=0).float())
    assert torch.equal(act[..., 1], torch.minimum(want_act, length.unsqueeze(1) - 1).float() + 0.5)


# ------------------------------------------------------------------ layout and windows
def test_batch_layout(store_path):
    batch = first(make(store_path, n_obs_steps=2, action_horizon=16))
    assert isinstance(batch, TensorDict) and batch.batch_size == torch.Size([8])
    assert batch["obs", "obs"].shape == (8, 2, 3)
    assert batch["action", "action"].shape == (8, 16, 1)
    assert batch["obs_mask"].shape == (8, 2) and batch["obs_mask"].dtype == torch.bool
    assert batch["action_mask"].shape == (8, 16) and batch["action_mask"].dtype == torch.bool
    assert batch["index"].shape == batch["episode"].shape == (8,)


def test_windows_pad_with_edge_steps_and_masks(tmp_path):
    lengths = [3, 1, 7, 2]
    path = write_tagged(tmp_path / "tagged.h5", lengths)
    dm = make(
        path,
        obs_keys=["state"],
        action_keys=["act"],
        n_obs_steps=3,
        action_horizon=4,
        batch_size=256,
        normalize=False,
    )
    batch = first(dm)
    check_windows(batch, 3, 4, lengths)
    assert set(batch["index"].tolist()) == set(range(sum(lengths)))  # t covers every row


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    n_obs=st.integers(1, 5),
    horizon=st.integers(1, 8),
)
def test_windows_never_cross_an_episode(lengths, n_obs, horizon):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tagged(Path(tmp) / "tagged.h5", lengths)
        dm = make(
            path,
            obs_keys=["state"],
            action_keys=["act"],
            n_obs_steps=n_obs,
            action_horizon=horizon,
            batch_size=32,
            normalize=False,
            stats_cache=False,
        )
        check_windows(first(dm), n_obs, horizon, lengths)


def test_t_is_uniform_over_training_rows(store_path):
    dm = make(store_path, val_episodes=2, batch_size=512, steps_per_epoch=8)
    t = torch.cat([b["index"] for b in dm.train_dataloader()])
    counts = torch.bincount(t, minlength=EPISODES * STEPS)
    train_rows = (EPISODES - 2) * STEPS
    assert counts[train_rows:].sum() == 0
    assert (counts[:train_rows] > 0).all()
    # 4096 draws over 80 rows: about 51 each
    assert counts[:train_rows].float().std() < 15


def test_val_dataloader_takes_every_validation_row_in_order(store_path):
    dm = make(store_path, val_episodes=1, batch_size=8)
    val = list(dm.val_dataloader())
    assert torch.cat([b["index"] for b in val]).tolist() == list(range(100, 120))
    assert val[0]["obs_mask"][0].tolist() == [False, True]  # the episode's first step


def test_default_steps_per_epoch_is_a_pass_over_training_rows(store_path):
    dm = make(store_path, steps_per_epoch=None, batch_size=16, val_episodes=1)
    assert dm.steps_per_epoch == 100 // 16 and len(dm.train_dataloader()) == 6


def test_non_floating_columns_are_not_normalised(tmp_path):
    path = write_tagged(tmp_path / "tagged.h5", [5, 5])
    dm = make(path, obs_keys=["state", "flag"], action_keys=["act"], stats_cache=False)
    batch = first(dm)
    assert batch["obs", "flag"].dtype == torch.bool
    assert set(dm.normalizer.keys) == {"state", "act"}


def test_dict_output(store_path):
    batch = first(make(store_path, output="dict"))
    assert type(batch) is dict and batch["obs"]["obs"].shape == (8, 2, 3)


# ------------------------------------------------------------------ normalisation
def test_mean_std_normalisation_and_inverse(store_path):
    with TrajectoryStore(store_path) as store:
        rows = store.read_slab(0, store.num_rows)
    raw = make(store_path, normalize=False, seed=3)
    norm = make(store_path, seed=3)
    assert raw.normalizer is None
    a, b = first(raw), first(norm)
    assert torch.equal(a["index"], b["index"])
    mean, std = rows["action"].double().mean(0), rows["action"].double().std(0, unbiased=False)
    expected = ((a["action", "action"].double() - mean) / std).float()
    assert torch.allclose(b["action", "action"], expected, atol=1e-5)
    back = norm.normalizer.unnormalize("action", b["action", "action"])
    assert torch.allclose(back, a["action", "action"], atol=1e-5)
    stats = norm.normalizer.stats["obs"]
    assert torch.allclose(stats.mean, rows["obs"].double().mean(0))
    assert stats.count == EPISODES * STEPS


def test_min_max_normalisation_maps_onto_unit_interval(store_path):
    dm = make(store_path, normalization="min_max", batch_size=512, stats_cache=False)
    batch = first(dm)
    for key in (("obs", "obs"), ("action", "action")):
        assert float(batch[key].min()) >= -1 - 1e-5 and float(batch[key].max()) <= 1 + 1e-5
    obs = torch.tensor([[0.0, 0.5, -1.0]])
    assert torch.allclose(
        dm.normalizer.unnormalize("obs", dm.normalizer.normalize("obs", obs)), obs, atol=1e-5
    )


def test_normalizer_is_a_module_with_buffers(store_path):
    norm = make(store_path).normalizer
    assert isinstance(norm, Normalizer)
    assert {k for k in norm.state_dict()} == {"loc_0", "scale_0", "loc_1", "scale_1"}
    with pytest.raises(ColumnError, match="no normalisation statistics for column 'reward'"):
        norm.normalize("reward", torch.zeros(3))


def test_statistics_are_cached(tmp_path, monkeypatch):
    path = write_demo_store(tmp_path / "cached.h5", episodes=3, steps=10)
    dm = make(path)
    dm.setup()
    sidecar = stats_path(path)
    assert sidecar.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["cached.h5"]
    data = json.loads(sidecar.read_text())
    assert set(data["columns"]) == {"obs", "action"} and data["fingerprint"]["rows"] == 30

    def fail(*args, **kwargs):
        raise AssertionError("statistics were recomputed")

    monkeypatch.setattr(normalizer_module, "column_stats", fail)
    again = make(path)  # served from the sidecar
    assert torch.equal(again.normalizer.loc_0, dm.normalizer.loc_0)
    monkeypatch.undo()

    write_demo_store(path, episodes=4, steps=10, seed=1, overwrite=True)  # changed: recompute
    fresh = make(path)
    assert not torch.equal(fresh.normalizer.loc_0, dm.normalizer.loc_0)
    assert json.loads(sidecar.read_text())["fingerprint"]["rows"] == 40


def test_statistics_without_cache_write_no_file(tmp_path):
    path = write_demo_store(tmp_path / "nocache.h5", episodes=2, steps=10)
    make(path, stats_cache=False).setup()
    assert not stats_path(path).exists()


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"obs_keys": ["obs", "pixels"]}, ColumnError, "no column 'pixels'"),
        ({"action_keys": ["act"]}, ColumnError, "no column 'act'"),
        ({"obs_keys": []}, ValueError, "obs_keys .* must be a non-empty list"),
        ({"obs_keys": ["obs", "obs"]}, ValueError, "must not repeat a column"),
        ({"n_obs_steps": 0}, ValueError, r"n_obs_steps \(0\) must be an int >= 1"),
        ({"action_horizon": 0}, ValueError, r"action_horizon \(0\) must be an int >= 1"),
        ({"batch_size": 0}, ValueError, r"batch_size \(0\) must be an int >= 1"),
        ({"steps_per_epoch": 0}, ValueError, r"steps_per_epoch \(0\) must be an int >= 1"),
        ({"val_episodes": 6}, ValueError, "leaves no training episodes"),
        (
            {"normalization": "zscore"},
            ValueError,
            "normalization .* must be one of 'mean_std', 'min_max'",
        ),
        ({"output": "list"}, ValueError, "output"),
    ],
)
def test_bad_arguments(store_path, kw, error, match):
    with pytest.raises(error, match=match):
        make(store_path, **kw)


# ------------------------------------------------------------------ Lightning
def test_trainer_fits(store_path):
    dm = DemonstrationDataModule(
        store_path,
        batch_size=16,
        obs_keys=["obs"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=4,
        steps_per_epoch=3,
        val_episodes=1,
    )
    model = Recorder(demo_xy, 6, 4)
    trainer = pl.Trainer(max_steps=5, **QUIET)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 5 and len(model.seen) == 5
    assert torch.cat(model.val_rows).tolist() == list(range(100, 120))
