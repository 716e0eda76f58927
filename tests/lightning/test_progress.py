"""The run callbacks with a real Trainer: plain progress lines, and metrics copied out."""

from __future__ import annotations

import io
import logging

import lightning.pytorch as pl
import pytest
from lightning_fixtures import QUIET, Recorder, demo_xy

from torchstore.demo import write_demo_store
from torchstore.errors import ArgumentError
from torchstore.lightning import (
    DemonstrationDataModule,
    MetricsRecorder,
    ProgressLines,
    plain_progress_off_a_terminal,
)

STEPS = 40


class _Logged(Recorder):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, batch_size=batch.shape[0])
        return loss


@pytest.fixture(scope="module")
def dm(tmp_path_factory):
    store = write_demo_store(tmp_path_factory.mktemp("demo") / "demo.h5", episodes=4, steps=30)
    return DemonstrationDataModule(
        store,
        batch_size=8,
        obs_keys=["obs"],
        action_keys=["action"],
        steps_per_epoch=10,
        val_episodes=1,
        device="cpu",
        stats_cache=False,
    )


def _fit(dm, callbacks, **kw) -> pl.Trainer:
    settings = {**QUIET, "num_sanity_val_steps": 2, **kw}
    trainer = pl.Trainer(max_steps=STEPS, callbacks=callbacks, **settings)
    dm.setup("fit")
    obs, act = demo_xy(next(iter(dm.train_dataloader())))
    trainer.fit(_Logged(demo_xy, obs.shape[1], act.shape[1]), datamodule=dm)
    return trainer


def test_progress_is_about_ten_plain_lines_ending_at_the_last_step(dm, caplog):
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        _fit(dm, [ProgressLines(log, lines=10)])
    lines = [r.getMessage() for r in caplog.records if r.name == "test.progress"]
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == list(range(4, STEPS + 1, 4))
    assert lines[-1].startswith(f"step {STEPS}/{STEPS} (100%): ")
    assert "train/loss" in lines[-1] and "val_loss" in lines[-1]
    assert lines[-1].endswith(" steps/s") and "\r" not in "".join(lines)


def test_metrics_go_to_the_sink_at_step_one_every_n_and_after_validation(dm):
    rows: list[tuple[int, list[str]]] = []
    _fit(dm, [MetricsRecorder(lambda step, m: rows.append((step, sorted(m))), every=20)])
    train = [step for step, keys in rows if keys == ["train/loss"]]
    val = [step for step, keys in rows if keys == ["val_loss"]]
    assert train == [1, 20, 40]
    assert val == [10, 20, 30, 40]  # one per validation run; the sanity check is not a row


def test_a_terminal_gets_lightnings_bar_and_anything_else_plain_lines(monkeypatch):
    import os

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 1

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((80, 24)))

    assert plain_progress_off_a_terminal(stream=Terminal()) == ([], True)
    callbacks, bar = plain_progress_off_a_terminal(stream=io.StringIO())
    assert [type(c) for c in callbacks] == [ProgressLines] and bar is False
    assert plain_progress_off_a_terminal(enabled=False, stream=Terminal()) == ([], False)


def test_counts_below_one_are_refused():
    with pytest.raises(ArgumentError, match=r"lines \(0\) must be an int >= 1"):
        ProgressLines(lines=0)
    with pytest.raises(ArgumentError, match=r"every \(0\) must be an int >= 1"):
        MetricsRecorder(print, every=0)


def test_a_terminal_that_reports_no_size_gets_plain_lines(monkeypatch):
    """``script -qc CMD /dev/null`` gives a 0x0 pseudo-terminal: tqdm draws nothing there."""
    import os

    from torchstore.io.console import bar_width, terminal_columns

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 1

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert terminal_columns(Terminal()) == 0
    callbacks, bar = plain_progress_off_a_terminal(stream=Terminal())
    assert [type(c) for c in callbacks] == [ProgressLines] and bar is False
    assert bar_width(Terminal()) == {"ncols": 80, "nrows": 24}
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((120, 40)))
    assert plain_progress_off_a_terminal(stream=Terminal()) == ([], True)
    assert bar_width(Terminal()) == {"dynamic_ncols": True}


class _Stop(BaseException):
    pass


class _StopAt(pl.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise _Stop


def test_last_checkpoint_is_kept_every_n_steps_at_the_end_and_at_an_interrupt(dm, tmp_path):
    from torchstore.lightning.progress import LastCheckpoint, read_checkpoint_state

    path = tmp_path / "last.ckpt"
    saved = []

    class Seen(LastCheckpoint):
        def save(self, trainer) -> None:
            super().save(trainer)
            saved.append(trainer.global_step)

    _fit(dm, [Seen(path, 15, state={"recipe": "bc"})])
    assert saved == [15, 30, 40]  # every 15 steps, and the end
    assert read_checkpoint_state(path) == (40, {"recipe": "bc"})
    saved.clear()
    with pytest.raises(_Stop):
        _fit(dm, [Seen(path, 15, on=(_Stop,)), _StopAt(22)])
    assert saved == [15, 22] and read_checkpoint_state(path)[0] == 22
    saved.clear()
    with pytest.raises(_Stop):  # an exception not named in `on`: the step may be half-done
        _fit(dm, [Seen(path, 15), _StopAt(22)])
    assert saved == [15] and read_checkpoint_state(path)[0] == 15
    assert not (tmp_path / "last.ckpt.tmp").exists()


def test_a_run_goes_on_from_its_last_checkpoint(dm, tmp_path):
    from torchstore.lightning.progress import LastCheckpoint

    path = tmp_path / "last.ckpt"
    rows: list[int] = []
    with pytest.raises(_Stop):
        _fit(dm, [LastCheckpoint(path, 100, on=(_Stop,)), _StopAt(25)])
    settings = {**QUIET, "num_sanity_val_steps": 0}
    trainer = pl.Trainer(
        max_steps=STEPS,
        callbacks=[MetricsRecorder(lambda step, m: rows.append(step), every=5)],
        **settings,
    )
    obs, act = demo_xy(next(iter(dm.train_dataloader())))
    trainer.fit(
        _Logged(demo_xy, obs.shape[1], act.shape[1]),
        datamodule=dm,
        ckpt_path=path,
        weights_only=True,
    )
    assert trainer.global_step == STEPS
    assert [s for s in rows if s % 5 == 0][0] == 30  # the step count went on from 25


def test_read_checkpoint_state_refuses_what_is_not_a_checkpoint(tmp_path):
    from torchstore.errors import StoreFormatError
    from torchstore.lightning.progress import read_checkpoint_state

    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        read_checkpoint_state(tmp_path / "last.ckpt")
    (tmp_path / "last.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(StoreFormatError, match="is not a readable Lightning checkpoint"):
        read_checkpoint_state(tmp_path / "last.ckpt")
