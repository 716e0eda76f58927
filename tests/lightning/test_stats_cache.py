"""Normalisation statistics are cached in the cache folder, keyed by the store's path and
its content: a read-only or shared dataset folder is never written to, and a changed store
is recomputed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning_fixtures import QUIET, Recorder, demo_xy

from torchstore.demo import write_demo_store
from torchstore.lightning import DemonstrationDataModule, stats_cache_dir, stats_path
from torchstore.lightning import normalizer as normalizer_module


def make(path, **kw) -> DemonstrationDataModule:
    kw = {
        "batch_size": 8,
        "obs_keys": ["obs"],
        "action_keys": ["action"],
        "n_obs_steps": 2,
        "action_horizon": 4,
        "steps_per_epoch": 3,
        "device": "cpu",
        **kw,
    }
    return DemonstrationDataModule(path, **kw)


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode) for p in folder.iterdir()
    }


def fail(*args, **kwargs):
    raise AssertionError("statistics were recomputed")


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTORE_CACHE", str(tmp_path / "ts"))
    assert stats_cache_dir() == tmp_path / "ts" / "stats"
    monkeypatch.delenv("TORCHSTORE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert stats_cache_dir() == tmp_path / "xdg" / "torchstore" / "stats"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stats_cache_dir() == tmp_path / "home" / ".cache" / "torchstore" / "stats"


def test_a_store_in_a_read_only_folder_trains_and_its_stats_go_to_the_cache(tmp_path):
    data = tmp_path / "shared"
    data.mkdir()
    path = write_demo_store(data / "demo.h5", episodes=4, steps=20)
    data.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)  # r-x
    try:
        before = snapshot(data)
        dm = make(path, val_episodes=1)
        model = Recorder(demo_xy, 6, 4)
        trainer = pl.Trainer(max_steps=3, **QUIET)
        trainer.fit(model, datamodule=dm)
        assert trainer.global_step == 3
        assert snapshot(data) == before  # nothing written beside the data
        assert not (data / "demo.h5.stats.json").exists()
    finally:
        data.chmod(0o755)
    entry = stats_path(path)
    assert entry.parent == stats_cache_dir() == Path(os.environ["TORCHSTORE_CACHE"]) / "stats"
    assert entry.name.startswith("demo.h5-") and entry.suffix == ".json"
    cached = json.loads(entry.read_text())
    assert set(cached["columns"]) == {"obs", "action"} and cached["fingerprint"]["rows"] == 80
    mean = torch.tensor(cached["columns"]["obs"]["mean"], dtype=torch.float32)
    assert torch.allclose(dm.normalizer.loc_0, mean)


def test_a_changed_store_is_recomputed_and_an_unchanged_one_is_not(tmp_path, monkeypatch):
    path = write_demo_store(tmp_path / "d.h5", episodes=3, steps=10)
    first = make(path).normalizer
    monkeypatch.setattr(normalizer_module, "column_stats", fail)
    again = make(path).normalizer  # served from the cache
    assert torch.equal(again.loc_0, first.loc_0)
    monkeypatch.undo()

    write_demo_store(path, episodes=3, steps=10, seed=1, overwrite=True)  # same size, rows
    fresh = make(path).normalizer
    assert not torch.equal(fresh.loc_0, first.loc_0)
    assert torch.allclose(
        fresh.loc_0, make(path, stats_cache=False).normalizer.loc_0, rtol=0, atol=1e-6
    )
    write_demo_store(path, episodes=4, steps=10, seed=1, overwrite=True)  # grown
    assert json.loads(stats_path(path).read_text())["fingerprint"]["rows"] == 30
    make(path).setup()
    assert json.loads(stats_path(path).read_text())["fingerprint"]["rows"] == 40


def test_two_stores_of_one_name_have_two_entries(tmp_path):
    a = write_demo_store(tmp_path / "a" / "demo.h5", episodes=2, steps=10, seed=0)
    b = write_demo_store(tmp_path / "b" / "demo.h5", episodes=2, steps=10, seed=1)
    assert stats_path(a) != stats_path(b)
    assert stats_path(a) == stats_path(tmp_path / "b" / ".." / "a" / "demo.h5")  # resolved
    na, nb = make(a).normalizer, make(b).normalizer
    assert not torch.equal(na.loc_0, nb.loc_0)
    assert sorted(p.name for p in stats_cache_dir().iterdir()) == sorted(
        [stats_path(a).name, stats_path(b).name]
    )


def test_a_cache_that_cannot_be_written_keeps_the_stats_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TORCHSTORE_CACHE", str(blocker))  # its stats/ cannot be made
    path = write_demo_store(tmp_path / "d.h5", episodes=2, steps=10)
    norm = make(path).normalizer
    assert norm is not None and norm.loc_0.shape == (3,)
    assert sorted(os.listdir(tmp_path)) == ["d.h5", "not-a-folder"]


def test_an_old_sidecar_beside_the_store_is_ignored(tmp_path):
    path = write_demo_store(tmp_path / "d.h5", episodes=2, steps=10)
    truth = make(path, stats_cache=False).normalizer.loc_0
    bogus = {"mean": [9.0] * 3, "std": [1.0] * 3, "min": [0.0] * 3, "max": [1.0] * 3}
    (tmp_path / "d.h5.stats.json").write_text(json.dumps({"columns": {"obs": bogus}}))
    assert torch.equal(make(path).normalizer.loc_0, truth)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_cache_folder_keeps_the_stats_in_memory(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "stats").mkdir(parents=True)
    (cache / "stats").chmod(0o500)
    monkeypatch.setenv("TORCHSTORE_CACHE", str(cache))
    try:
        path = write_demo_store(tmp_path / "d.h5", episodes=2, steps=10)
        assert make(path).normalizer is not None
        assert list((cache / "stats").iterdir()) == []
    finally:
        (cache / "stats").chmod(0o700)
