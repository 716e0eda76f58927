"""A run folder as a user sees it: a policy trained by Lightning behind a normaliser, its
config and metrics written, then all of it read back and the rebuilt policy acting the same."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from torchstore.data import TrajectoryStore
from torchstore.demo import write_demo_store
from torchstore.errors import ArgumentTypeError
from torchstore.lightning import DemonstrationDataModule, MetricsRecorder
from torchstore.training import RunFolder, masked_mse

N_OBS, HORIZON, STEPS = 2, 4, 6


class ChunkPolicy(pl.LightningModule):
    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.action_dim = action_dim
        self.net = nn.Sequential(
            nn.Linear(N_OBS * obs_dim, 32), nn.ReLU(), nn.Linear(32, HORIZON * action_dim)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.flatten(-2)).unflatten(-1, (HORIZON, self.action_dim))

    def training_step(self, batch, batch_idx):
        pred = self(batch["obs", "obs"])
        loss = masked_mse(pred, batch["action", "action"], batch["action_mask"])
        self.log("train/loss", loss, batch_size=batch.shape[0])
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def act(net: nn.Module, normalizer, history: torch.Tensor) -> torch.Tensor:
    """An action chunk in the data's units from an observation history in its units."""
    with torch.no_grad():
        x = normalizer.normalize("obs", history).flatten(-2)
        return normalizer.unnormalize("action", net(x).unflatten(-1, (HORIZON, -1)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    store = write_demo_store(folder / "demo.h5", episodes=4, steps=30)
    dm = DemonstrationDataModule(
        store,
        batch_size=8,
        obs_keys=["obs"],
        action_keys=["action"],
        n_obs_steps=N_OBS,
        action_horizon=HORIZON,
        steps_per_epoch=STEPS,
        device="cpu",
        normalization="min_max",
    )
    dm.setup("fit")
    with TrajectoryStore(store) as opened:
        obs_dim, action_dim = opened.column("obs").shape[0], opened.column("action").shape[0]
    model = ChunkPolicy(obs_dim, action_dim)
    run = RunFolder(folder / "outputs")
    run.write_config({"lr": 1e-2, "data": {"horizon": HORIZON, "chunk": "${data.horizon}"}})
    metrics = run.metrics_log()
    trainer = pl.Trainer(
        max_steps=STEPS,
        callbacks=[MetricsRecorder(metrics.log, every=2)],
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule=dm)
    metrics.close()
    run.save_policy(
        {f"net.{k}": v for k, v in model.net.state_dict().items()},
        normalizer=dm.normalizer,
        metadata={"step": trainer.global_step, "complete": True},
    )
    return run, model, dm.normalizer, obs_dim


def test_config_and_metrics_read_back(trained):
    run, *_ = trained
    cfg = run.read_config()
    assert cfg.lr == 1e-2 and cfg.data.chunk == HORIZON  # written resolved
    assert "${" not in run.config_path.read_text()
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2, 4, 6]  # step 1, then every 2
    assert all(r["train/loss"] > 0 for r in rows)
    assert run.describe() == (
        f"{run.path}: config.yaml, metrics.csv (4 rows), loss.png, policy.safetensors"
    )


def test_saved_policy_acts_as_the_trained_one(trained):
    run, model, normalizer, obs_dim = trained
    saved = run.read_policy()
    assert saved.metadata == {"step": str(STEPS), "complete": "true", "normalization": "min_max"}
    assert not any(k.startswith("normalizer.") for k in saved.tensors)
    rebuilt = ChunkPolicy(obs_dim, model.action_dim)
    rebuilt.net.load_state_dict({k[len("net.") :]: v for k, v in saved.tensors.items()})
    restored = saved.normalizer()
    assert restored.mode.value == "min_max" and set(restored.keys) == set(normalizer.keys)
    history = torch.randn(5, N_OBS, obs_dim) * 3
    want = act(model.net, normalizer, history)
    assert torch.equal(act(rebuilt.net, restored, history), want)
    # the mode is the file's unless the caller overrides it, which changes the actions
    other = saved.normalizer("mean_std")
    assert not torch.allclose(act(rebuilt.net, other, history), want)


def test_a_missing_or_foreign_config_is_refused(tmp_path):
    run = RunFolder(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no config.yaml"):
        run.read_config()
    with pytest.raises(ArgumentTypeError, match=r"config \(list\) must be a DictConfig"):
        run.write_config([1, 2])
    assert run.describe() == f"{tmp_path}: no run files"


def test_the_run_files_a_folder_holds_in_their_fixed_order(tmp_path):
    run = RunFolder(tmp_path)
    assert run.run_files() == []
    (tmp_path / "notes.txt").write_text("not a run file")
    run.write_config({"seed": 0})
    run.checkpoint_path.write_bytes(b"checkpoint")
    log = run.metrics_log()
    log.log(1, {"loss": 0.5})
    (tmp_path / "bc.log").write_text("printed\n")
    assert run.run_files() == ["config.yaml", "metrics.csv", "last.ckpt"]
    assert run.describe(rows=len(log)) == (
        f"{tmp_path}: config.yaml, metrics.csv (1 rows), last.ckpt, bc.log"
    )
    log.log(5, {"loss": 0.1})
    log.close()
    resumed = run.metrics_log(resume_at=1)  # a checkpoint at step 1: step 5 is redone
    assert len(resumed) == 1 and [r["step"] for r in run.read_metrics()] == [1]
