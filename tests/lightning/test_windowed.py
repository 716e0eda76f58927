"""DataModules over a store larger than their resident budget (``resident=`` rows or bytes).

Batches hold the store's rows, validation reads its episodes by contiguous reads, a
Lightning ``Trainer`` fits from a store ten times the budget, a checkpoint resumes the
exact batches mid-epoch, and bad budgets are refused by name.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_fixtures import QUIET, Recorder, demo_xy, offline_xy

from torchstore.data.store.store import TrajectoryStore
from torchstore.demo import write_demo_store
from torchstore.errors import ResidencyError
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule

CHECKPOINTING = {k: v for k, v in QUIET.items() if k != "enable_checkpointing"}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_demo_store(tmp_path_factory.mktemp("windowed") / "demo.h5", episodes=10, steps=20)


@pytest.fixture(scope="module")
def rows(store_path):
    with TrajectoryStore(store_path) as store:
        return store.read_slab(0, store.num_rows)


def demo(store_path, **kw):
    return DemonstrationDataModule(
        store_path,
        batch_size=8,
        obs_keys=["obs"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=4,
        device="cpu",
        stats_cache=False,
        **kw,
    )


@pytest.mark.parametrize("layout", ["flat", "torchrl"])
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_offline_batches_are_store_rows(store_path, rows, layout, sampler):
    dm = OfflineDataModule(
        store_path,
        batch_size=16,
        resident=45,
        resident_blocks=2,
        device="cpu",
        val_episodes=2,
        layout=layout,
        sampler=sampler,
    )
    batches = list(dm.train_dataloader())
    assert len(batches) == 160 // 16
    obs = "obs" if layout == "flat" else "observation"
    for b in batches:
        assert torch.equal(b[obs], rows["obs"][b["index"]])
        assert int(b["index"].max()) < 160  # training episodes only
        assert ("priority_weight" in b.keys()) == (sampler == "prioritized")
    if layout == "torchrl":
        assert torch.equal(b["next", "reward"], rows["reward"][b["index"]].unsqueeze(-1))
    val = torch.cat([b["index"] for b in dm.val_dataloader()])
    assert val.tolist() == list(range(160, 200))
    assert dm.window.packed.capacity <= 45 and dm.window.stats["refills"] > 2
    dm.close()


def test_offline_sequence_windows_stay_in_an_episode(store_path, rows):
    dm = OfflineDataModule(
        store_path,
        batch_size=8,
        resident=60,
        resident_blocks=2,
        device="cpu",
        window=5,
        val_episodes=1,
    )
    for b in dm.train_dataloader():
        index = b["index"]
        assert index.shape == (8, 5)
        assert (index[:, 1:] - index[:, :-1] == 1).all()
        assert (index // 20 == b["episode"].unsqueeze(1)).all()  # demo episodes: 20 rows
        assert torch.equal(b["obs"], rows["obs"][index])
    val = [b for b in dm.val_dataloader()]
    assert sum(b["index"].shape[0] for b in val) == 16
    assert torch.equal(val[0]["obs"], rows["obs"][val[0]["index"]])
    dm.close()


def test_demonstration_windows_equal_the_resident_ones(store_path):
    windowed = demo(store_path, resident=60, resident_blocks=2, val_episodes=2)
    resident = demo(store_path, val_episodes=2)
    resident.setup()
    for b in list(windowed.train_dataloader()):
        t = b["index"]
        ref = resident._windows(t, resident.train_rows.segment_of(t), resident.train_rows, None)
        for key in [("obs", "obs"), ("action", "action"), "obs_mask", "action_mask", "episode"]:
            assert torch.equal(b[key], ref[key]), key
    for x, y in zip(windowed.val_dataloader(), resident.val_dataloader(), strict=True):
        assert torch.equal(x["obs", "obs"], y["obs", "obs"])
        assert torch.equal(x["action_mask"], y["action_mask"])
    # statistics over every committed row, read from disk in chunks
    torch.testing.assert_close(
        windowed.normalizer.stats["obs"].mean, resident.normalizer.stats["obs"].mean
    )
    windowed.close()


def test_a_trainer_fits_from_a_store_ten_times_the_budget(tmp_path):
    path = write_demo_store(tmp_path / "big.h5", episodes=40, steps=25)  # 1000 rows
    with TrajectoryStore(path) as store:
        row_bytes = 36  # obs 3 + action 1 + reward 1 + next/obs 3 float32, done, truncated
        budget = store.num_rows * row_bytes // 10
    for dm, model in [
        (
            OfflineDataModule(
                path,
                batch_size=16,
                resident=f"{budget}B",
                device="cpu",
                val_episodes=2,
                steps_per_epoch=30,
            ),
            Recorder(offline_xy, 3, 1),
        ),
        (
            demo(path, resident=100, resident_blocks=3, val_episodes=2, steps_per_epoch=60),
            Recorder(demo_xy, 6, 4),
        ),
    ]:
        trainer = pl.Trainer(max_epochs=2, limit_val_batches=2, **QUIET)
        trainer.fit(model, datamodule=dm)
        assert trainer.global_step == 2 * dm.steps_per_epoch
        seen = torch.cat(model.seen)
        window = dm.window
        assert window.packed.capacity <= window.budget_rows <= 100
        assert window.packed.nbytes <= budget + 4 * window.packed.row_bytes
        # the whole training set came through a window a tenth of its size
        assert len(window.blocks) >= 10 and window.stats["refills"] >= len(window.blocks)
        assert set((seen // 25).tolist()) == set(range(38))  # every training episode
        dm.close()


CONFIGS = {
    "offline-uniform": lambda p: (
        OfflineDataModule(
            p,
            batch_size=8,
            steps_per_epoch=4,
            seed=11,
            val_episodes=1,
            resident=30,
            resident_blocks=2,
            device="cpu",
        ),
        Recorder(offline_xy, 3, 1),
    ),
    "offline-prioritized": lambda p: (
        OfflineDataModule(
            p,
            batch_size=8,
            steps_per_epoch=4,
            sampler="prioritized",
            layout="torchrl",
            resident="1200B",
            resident_blocks=2,
            device="cpu",
        ),
        Recorder(offline_xy, 3, 1, priority=True),
    ),
    "offline-windows": lambda p: (
        OfflineDataModule(
            p,
            batch_size=4,
            steps_per_epoch=4,
            seed=3,
            window=4,
            resident=60,
            resident_blocks=2,
            device="cpu",
        ),
        Recorder(lambda b: (b["obs"].flatten(1), b["action"].flatten(1)), 12, 4),
    ),
    "demonstration": lambda p: (
        demo(p, steps_per_epoch=4, seed=2, resident=60, resident_blocks=2),
        Recorder(demo_xy, 6, 4),
    ),
}


def fit(config, store_path, max_steps, *, callbacks=(), ckpt_path=None):
    dm, model = CONFIGS[config](store_path)
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
        limit_val_batches=1,
        **CHECKPOINTING,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    assert trainer.global_step == max_steps
    dm.close()
    return [rows.tolist() for rows in model.seen]


@pytest.mark.filterwarnings("ignore:.*callbacks used to create the checkpoint")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_resume_mid_epoch_draws_the_uninterrupted_batches(config, tmp_path):
    store_path = write_demo_store(tmp_path / "demo.h5", episodes=5, steps=20)
    a = fit(config, store_path, 10)
    steps = ModelCheckpoint(
        dirpath=tmp_path, filename="step{step}", every_n_train_steps=3, save_top_k=-1
    )
    b = fit(config, store_path, 7, callbacks=[steps])
    assert b == a[:7]
    for step in (3, 6):
        path = tmp_path / f"stepstep={step}.ckpt"
        state = torch.load(path, weights_only=True)
        saved = state[type(CONFIGS[config](store_path)[0]).__name__]["ranks"][0]["window"]
        assert saved["phase"] > 0 or step == 3
        assert fit(config, store_path, 10, ckpt_path=path) == a[step:], f"from step {step}"


def test_bad_residency_options_are_refused(store_path):
    with pytest.raises(ResidencyError, match=r"resident \('lots'\)"):
        OfflineDataModule(store_path, batch_size=8, resident="lots")
    with pytest.raises(ValueError, match="drop shard_episodes"):
        OfflineDataModule(store_path, batch_size=8, resident=100, shard_episodes=True)
    from torchstore.samplers.ere import ERE

    with pytest.raises(ValueError, match="use resident='all' with ere"):
        demo(store_path, resident=100, ere=ERE())
    with pytest.raises(ResidencyError, match=r"resident_reuse \(0\)"):
        demo(store_path, resident=100, resident_reuse=0)
    with pytest.raises(ValueError, match=r"resident_blocks \(0\)"):
        OfflineDataModule(store_path, batch_size=8, resident=100, resident_blocks=0)
    dm = OfflineDataModule(store_path, batch_size=8, resident=30, device="cpu")
    with pytest.raises(ResidencyError, match="longest training episode has 20 rows"):
        OfflineDataModule(store_path, batch_size=8, resident=30, window=3, device="cpu").setup()
    # a checkpoint of one residency does not resume the other
    windowed_state = (dm.setup(), next(iter(dm.train_dataloader())), dm.state_dict())[2]
    resident = OfflineDataModule(store_path, batch_size=8, device="cpu")
    resident.setup()
    with pytest.raises(ValueError, match="resume with the same residency"):
        resident.load_state_dict(windowed_state)
    dm.close()


def test_a_checkpoint_of_another_budget_is_refused(store_path):
    dm = OfflineDataModule(store_path, batch_size=8, resident=30, device="cpu", seed=1)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    other = OfflineDataModule(store_path, batch_size=8, resident=60, device="cpu", seed=1)
    other.setup()
    with pytest.raises(ResidencyError, match="resume with the same resident budget"):
        other.load_state_dict(state)
    dm.close()
    other.close()


def _leaves(batch):
    if isinstance(batch, dict):
        out = {}
        for key, value in batch.items():
            if isinstance(value, dict):
                out.update({(key, k): v for k, v in _leaves(value).items()})
            else:
                out[key] = value
        return out
    return {k: batch[k] for k in batch.keys(include_nested=True, leaves_only=True)}


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"layout": "torchrl", "val_episodes": 2},
        {"output": "dict", "resident": 25, "resident_reuse": 3},
        {"columns": ["obs", "reward", "done"], "layout": "torchrl", "seed": 4},
    ],
)
def test_windowed_plain_row_draws_match_the_general_assembly(store_path, kw):
    """Uniform rows from a window take the plain-rows draw; its batches are bit for bit the
    general path's (the window's segment lookup and the general assembly), over phase
    changes and epochs, from the same stream positions."""
    kw = {"resident": 45, "resident_blocks": 2, **kw}
    fast = OfflineDataModule(store_path, batch_size=8, device="cpu", **kw)
    general = OfflineDataModule(store_path, batch_size=8, device="cpu", **kw)
    fast.setup()
    general.setup()
    assert fast._plain_rows
    for _ in range(120):
        a = fast._draw_train()
        packed, index, _, _ = general.window.draw_rows(general.philox, 8)
        b = general._assemble(index, None, at=packed)
        assert type(a) is type(b)
        x, y = _leaves(a), _leaves(b)
        assert list(x) == list(y)
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key
        assert int(fast.philox.position) == int(general.philox.position)
    assert fast.state_dict() == general.state_dict()
    assert fast.window.schedule.epoch >= 1 and fast.window.stats["refills"] > 8
    fast.close()
    general.close()
