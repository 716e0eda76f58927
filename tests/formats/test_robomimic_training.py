"""Training from an imported robomimic file: its filter keys as the validation set, and the
``bc_robomimic`` recipe run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.formats.robomimic_files import write_robomimic
from torchstore.formats import import_robomimic
from torchstore.lightning import DemonstrationDataModule

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lift(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lift")
    src = write_robomimic(tmp / "lift.hdf5", lengths=[12] * 10)
    return src, import_robomimic(src, tmp / "lift.h5", progress=False)


def _dm(store, **kwargs):
    return DemonstrationDataModule(
        store,
        batch_size=8,
        obs_keys=["obs/object", "obs/agentview_image"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=4,
        device="cpu",
        **kwargs,
    )


def test_the_valid_filter_key_is_the_validation_set(lift):
    src, store = lift
    with h5py.File(src, "r") as f:
        valid = sorted(int(d.decode()[5:]) for d in f["mask/valid"][()])
    dm = _dm(store, val_episodes="valid")
    dm.setup("fit")
    assert dm.split.val.tolist() == valid
    assert sorted(dm.split.train.tolist() + valid) == list(range(10))
    batch = next(iter(dm.train_dataloader()))
    assert batch["obs", "obs", "agentview_image"].shape == (8, 2, 12, 10, 3)
    assert batch["obs", "obs", "agentview_image"].dtype == torch.uint8
    assert set(batch["episode"].tolist()).isdisjoint(valid)
    val = torch.cat([b["episode"] for b in dm.val_dataloader()]).unique()
    assert val.tolist() == valid


def test_a_named_set_the_store_lacks_is_named_with_the_sets_it_has(lift):
    with pytest.raises(ValueError, match=r"'test'.*\['train', 'valid'\]"):
        _dm(lift[1], val_episodes="test")
    with pytest.raises(ValueError, match="named validation set"):
        _dm(lift[1], val_episodes="valid", resident=40)


def test_the_recipe_trains_from_the_imported_store(lift, tmp_path):
    _, store = lift
    cmd = [
        sys.executable,
        str(ROOT / "recipes" / "bc_robomimic.py"),
        f"store.path={store}",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "datamodule.val_episodes=valid",
        "trainer.enable_progress_bar=false",
        "datamodule.batch_size=8",
        "'obs.low_dim=[obs/object,obs/robot0_eef_pos]'",
    ]
    cmd[-1] = cmd[-1].strip("'")
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "10 demonstrations (8 train, 2 validation), 6 gradient steps" in done.stdout + done.stderr
    )
    (run,) = (tmp_path / "outputs" / "bc_robomimic").iterdir()
    sys.path.insert(0, str(ROOT / "recipes"))
    from _common import load_policy

    saved = load_policy(run)
    assert saved.recipe == "bc_robomimic" and saved.step == 6 and saved.complete
    obs = TensorDict(
        {
            "obs": {
                "object": torch.zeros(1, 2, 10),
                "robot0_eef_pos": torch.zeros(1, 2, 3),
                "agentview_image": torch.zeros(1, 2, 12, 10, 3, dtype=torch.uint8),
            }
        },
        [1],
    )
    assert saved.policy(obs).shape == (1, 8, 7)


def test_an_empty_named_set_is_refused(tmp_path):
    src = write_robomimic(tmp_path / "lift.hdf5", lengths=[6] * 4)
    with h5py.File(src, "a") as f:
        del f["mask/valid"]
        f["mask/valid"] = np.array([], dtype="S6")
    store = import_robomimic(src, tmp_path / "lift.h5", progress=False)
    with pytest.raises(ValueError, match="'valid' is empty"):
        _dm(store, val_episodes="valid")
