"""A recipe run as a new user meets it: every recipe with its shipped config (only the step
count shortened), run folders that are never written over unless asked, runs refused before
their folder exists, a failed run's traceback in its log, and ``resume=<run folder>``.

Each run is a process of its own, forked from a preloaded interpreter (``tests/preloaded.py``).
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))

#: each recipe's shipped config with only its length shortened (and no progress bar, which
#: a test's pipe would get as plain lines anyway)
DEFAULTS = {
    "bc": ["trainer.max_steps=6"],
    "bc_camera": ["trainer.max_steps=6"],
    "offline_rl": ["trainer.max_steps=6"],
    "bc_robomimic": ["trainer.max_steps=6"],  # store.path: a robomimic import (fixture)
    "sac": ["collector.total_frames=1100"],  # the first 1000 are random; 100 updates after
}
# distributed_sac runs end to end (outputs, shards, its replay checkpoint) in
# tests/recipes/test_distributed_sac_smoke.py: a second Ray run here cost 49 s


def _env() -> dict[str, str]:
    env = {**os.environ}
    env.pop("PYTHONWARNINGS", None)
    env.pop("HYDRA_FULL_ERROR", None)  # what a user sees
    return env


def _run(preloaded, recipe: str, args: list[str], cwd: Path, timeout: float = 300):
    cmd = [sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), *args]
    return preloaded.run(cmd, cwd=cwd, env=_env(), timeout=timeout)


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def robomimic_store(tmp_path_factory) -> Path:
    """A small robomimic import, built per test (a fraction of a second): a module fixture
    would put every recipe's run on one test worker (tests/conftest.py)."""
    from tests.formats.robomimic_files import write_robomimic
    from torchstore.formats import import_robomimic

    tmp = tmp_path_factory.mktemp("robomimic")
    src = write_robomimic(tmp / "lift.hdf5", lengths=[12] * 10)
    import_robomimic(src, tmp / "lift.h5", progress=False)
    return tmp / "lift.h5"


@pytest.mark.parametrize("recipe", list(DEFAULTS))
def test_every_recipe_runs_with_its_shipped_config(recipe, preloaded, robomimic_store, tmp_path):
    """Only the length is changed: a default that does not fit another (the old
    val_check_interval 500 > the robomimic data module's 200 steps per epoch) fails here."""
    args = [*DEFAULTS[recipe], f"hydra.run.dir={tmp_path / 'run'}"]
    if recipe == "bc_robomimic":
        args.append(f"store.path={robomimic_store}")
    proc = _run(preloaded, recipe, args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].startswith(f"outputs in {tmp_path / 'run'}: ")
    assert (tmp_path / "run" / "policy.safetensors").is_file()
    assert (tmp_path / "run" / "last.ckpt").is_file() == ("sac" not in recipe)


def test_a_folder_that_holds_a_run_is_not_written_over(preloaded, tmp_path):
    run = tmp_path / "run"
    args = ["trainer.max_steps=10", "eval.episodes=1", f"hydra.run.dir={run}"]
    assert _run(preloaded, "bc", args, tmp_path).returncode == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    again = _run(preloaded, "bc", ["trainer.max_steps=4", *args[1:]], tmp_path)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stderr.startswith(f"error: {run} already holds a run (config.yaml, metrics.csv")
    assert "resume=" in again.stderr and "overwrite=true" in again.stderr
    assert "Traceback" not in again.stderr and again.stdout == ""
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before

    bad_store = ["overwrite=true", "store.path=missing.h5", *args[1:]]
    refused = _run(preloaded, "bc", bad_store, tmp_path)
    assert refused.returncode == 2 and "store.path=missing.h5" in refused.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # kept

    replaced = _run(preloaded, "bc", ["trainer.max_steps=4", "overwrite=true", *args[1:]], tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert max(int(row["step"]) for row in _rows(run)) == 4
    log = (run / "bc.log").read_text()
    assert log.count("outputs: ") == 1  # the replaced run's log went with it


def test_a_store_path_that_is_not_there_leaves_no_folder(preloaded, tmp_path):
    run = tmp_path / "run"
    proc = _run(preloaded, "bc", ["store.path=missing.h5", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 2 and not run.exists() and not (tmp_path / "outputs").exists()
    assert proc.stderr.startswith("error: store.path=missing.h5: no such file or folder")
    assert "Traceback" not in proc.stderr
    unset = _run(preloaded, "bc_robomimic", [f"hydra.run.dir={run}"], tmp_path)
    assert unset.returncode == 2 and not run.exists()
    assert unset.stderr == "error: bc_robomimic needs store.path=STORE (a store file or folder)\n"


def test_a_failed_run_keeps_its_traceback_in_its_log(preloaded, tmp_path):
    run = tmp_path / "run"
    proc = _run(preloaded, "bc", ["datamodule.n_obs_steps=0", f"hydra.run.dir={run}"], tmp_path)
    # an option the data module refuses: one error: line on the console (status 2)
    assert proc.returncode == 2
    assert "error: n_obs_steps (0) must be an int >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    log = (run / "bc.log").read_text()
    assert "the run failed:" in log and "Traceback (most recent call last)" in log
    assert "n_obs_steps (0) must be an int >= 1" in log


def test_resume_continues_the_step_count_and_the_metrics(preloaded, tmp_path):
    run = tmp_path / "run"
    first = ["trainer.max_steps=20", "checkpoint_every=10", "eval.episodes=1"]
    assert _run(preloaded, "bc", [*first, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    rows = _rows(run)
    proc = _run(preloaded, "bc", [f"resume={run}", "trainer.max_steps=40"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming from last.ckpt at step 20 ({len(rows)} rows kept)" in proc.stdout
    assert "Restored all states from the checkpoint" in proc.stdout
    after = _rows(run)
    assert after[: len(rows)] == rows  # the first run's rows, as they were
    steps = [int(row["step"]) for row in after[len(rows) :]]
    assert steps[0] == 30 and steps[-1] == 40 and steps == sorted(steps)
    assert "40 gradient steps" in proc.stdout
    from _common import load_policy

    saved = load_policy(run)
    assert saved.step == 40 and saved.complete
    assert saved.cfg.trainer.max_steps == 40 and saved.cfg.resume == str(run)
    # the command line's settings on top of the run's: its checkpoint interval kept
    assert saved.cfg.checkpoint_every == 10 and saved.cfg.eval.episodes == 1
    assert (run / "bc.log").read_text().count("outputs: ") == 2  # one log, continued


def test_resume_refuses_what_it_cannot_continue(preloaded, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, said in (
        ([f"resume={tmp_path / 'nowhere'}"], "no such folder"),
        ([f"resume={empty}"], "no last.ckpt there"),
        ([f"resume={empty}", "overwrite=true"], "give one"),
    ):
        proc = _run(preloaded, "bc", args, tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.startswith("error: resume") and "Traceback" not in proc.stderr
    run = tmp_path / "run"
    args = ["trainer.max_steps=10", "eval.episodes=1", f"hydra.run.dir={run}"]
    assert _run(preloaded, "bc", args, tmp_path).returncode == 0
    done = _run(preloaded, "bc", [f"resume={run}"], tmp_path)  # nothing left to train
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the run is at step 10 of trainer.max_steps=10; give a larger" in done.stderr
    groups = _run(preloaded, "bc", [f"resume={run}", "datamodule=offline"], tmp_path)
    assert groups.returncode == 2 and "keeps the run's config groups" in groups.stderr
    other = _run(preloaded, "offline_rl", [f"resume={run}"], tmp_path)
    assert other.returncode == 2
    assert "its checkpoint is a bc run's, not offline_rl's" in other.stderr


def test_a_column_the_store_lacks_or_a_camera_for_bc_is_refused_before_the_run(preloaded, tmp_path):
    """``bc`` trains an MLP on state vectors: a camera column is refused in one line that
    names the camera recipe, and a column the store does not have in one line that lists
    its columns (both were a KeyError traceback from inside the run)."""
    run = tmp_path / "run"
    camera = _run(
        preloaded, "bc", ["datamodule.obs_keys=[pixels]", f"hydra.run.dir={run}"], tmp_path
    )
    assert camera.returncode == 2 and not run.exists(), camera.stderr[-2000:]
    assert camera.stderr.startswith("error: datamodule.obs_keys: 'pixels' is float32[32, 32, 3]")
    assert "python recipes/bc_camera.py 'obs.rgb=[pixels]'" in camera.stderr
    missing = _run(
        preloaded, "bc_camera", ["obs.low_dim=[speed]", f"hydra.run.dir={run}"], tmp_path
    )
    assert missing.returncode == 2 and not run.exists()
    assert missing.stderr.startswith("error: obs.low_dim: data/reach_demo.h5 has no column 'speed'")
    assert "Traceback" not in camera.stderr + missing.stderr
