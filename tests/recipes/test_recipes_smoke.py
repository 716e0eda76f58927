"""Each recipe end to end, as a user runs it (``python recipes/X.py overrides``), in smoke size.

Run from a scratch folder, so the recipes must find the shipped data and configs relative to
the repository, not the working directory. Each smoke run is started once per module, by a
fresh interpreter, and checked from several sides: its output (start-up noise included), its
run folder, its saved policy rolled out again (``recipes/rollout.py``) and fetched through
``torchstore.remote``. Interrupted runs get a real SIGINT / SIGTERM. Rollouts and interrupted
runs are processes forked from a preloaded interpreter (``tests/preloaded.py``): what they
check happens after the imports.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from _common import build_policy, load_policy, recipe_module  # noqa: E402

QUIET = ["trainer.enable_progress_bar=false"]

SMOKES = {
    "bc": ["trainer.max_steps=20", "eval.episodes=2", *QUIET],
    "bc_camera": ["trainer.max_steps=20", "eval.episodes=2", *QUIET],
    "offline_rl": [
        "trainer.max_steps=20",
        "eval.episodes=2",
        "datamodule.sampler=prioritized",
        *QUIET,
    ],
    "sac": [
        "collector.total_frames=300",
        "collector.init_random_frames=100",
        "updates_per_frame=0.5",
        "eval.episodes=1",
        "eval.max_steps=50",
        "sampler=prioritized",
        "sampler.ere=true",
    ],
    "sac_uniform": [
        "collector.total_frames=200",
        "collector.init_random_frames=100",
        "updates_per_frame=0.25",
        "eval.episodes=1",
        "eval.max_steps=20",
    ],
}
#: the line of the recipe's output that reports its trained policy's evaluation
RESULT = {
    "bc": r"^learned .*$",
    "bc_camera": r"^learned .*$",
    "offline_rl": r"^TD3\+BC .*$",
    "sac": r"^evaluation: mean return .*$",
    "sac_uniform": r"^evaluation: mean return .*$",
}
#: printed by third-party code on every run; none of it is the user's business
NOISE = ("litlogger", "💡 Tip", "LeafSpec", "Traceback")


def _script(name: str) -> Path:
    return ROOT / "recipes" / f"{name.split('_uniform')[0]}.py"


def _env() -> dict[str, str]:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    env.pop("PYTHONWARNINGS", None)  # the recipes themselves must keep the output clean
    return env


class Smoke:
    def __init__(self, name: str, folder: Path):
        self.name, self.folder, self.run_dir = name, folder, folder / "run"
        self.proc = subprocess.run(
            [sys.executable, str(_script(name)), *SMOKES[name], f"hydra.run.dir={self.run_dir}"],
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def result_line(self) -> str:
        found = re.findall(RESULT[self.name], self.proc.stdout, re.M)
        assert len(found) == 1, self.proc.stdout
        return found[0]


_SMOKES: dict[str, Smoke] = {}


def _runs(names) -> list:
    """Parameters for the ``smoke`` fixture. The run is cached per process, so every test
    of one recipe goes to the same test worker (``--dist loadgroup``): otherwise each
    worker that gets one would run the recipe again."""
    return [
        pytest.param(name, id=name, marks=pytest.mark.xdist_group(f"recipe-{name}"))
        for name in names
    ]


@pytest.fixture
def smoke(request, tmp_path_factory) -> Smoke:
    name = request.param
    if name not in _SMOKES:
        _SMOKES[name] = Smoke(name, tmp_path_factory.mktemp(name))
    return _SMOKES[name]


@pytest.mark.parametrize("smoke", _runs(SMOKES), indirect=True)
def test_recipe_smoke(smoke):
    proc, run_dir = smoke.proc, smoke.run_dir
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    smoke.result_line()
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2 and "step" in rows[0]
    assert any(k.startswith("eval/") and v for row in rows for k, v in row.items())
    assert (run_dir / "loss.png").stat().st_size > 5_000
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert (
        not any(smoke.folder.glob("*.stats.json"))
        and not (ROOT / "data" / "reach_demo.h5.stats.json").exists()
    )


@pytest.mark.parametrize("smoke", _runs(SMOKES), indirect=True)
def test_recipe_says_where_its_outputs_are(smoke):
    proc, run_dir, recipe = smoke.proc, smoke.run_dir, _script(smoke.name).stem
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first == f"outputs: {run_dir} (resolved config: {run_dir / 'config.yaml'})"
    last = proc.stdout.splitlines()[-1]
    assert last.startswith(f"outputs in {run_dir}: config.yaml, metrics.csv (")
    assert "loss.png, policy.safetensors" in last
    config = (run_dir / "config.yaml").read_text()
    assert "seed: 0" in config and "${" not in config  # resolved, not interpolations
    log = (run_dir / f"{recipe}.log").read_text()
    assert smoke.result_line() in log and "outputs: " in log


@pytest.mark.parametrize("smoke", _runs(SMOKES), indirect=True)
def test_recipe_output_has_no_third_party_noise(smoke):
    both = smoke.proc.stdout + smoke.proc.stderr
    assert not [word for word in NOISE if word in both], both[-3000:]


@pytest.mark.parametrize("smoke", _runs(["bc", "bc_camera", "offline_rl", "sac"]), indirect=True)
def test_saved_policy_rolls_out_as_the_run_evaluated_it(smoke, preloaded):
    """``recipes/rollout.py`` on the run folder prints the run's own evaluation, to the digit."""
    assert smoke.proc.returncode == 0, smoke.proc.stderr[-3000:]
    proc = preloaded.run(
        [sys.executable, str(ROOT / "recipes" / "rollout.py"), str(smoke.run_dir)],
        cwd=smoke.folder,
        env=_env(),
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert smoke.result_line() in proc.stdout.splitlines()
    assert proc.stdout.startswith(f"{smoke.name} policy after ")
    assert "interrupted" not in proc.stdout


@pytest.mark.parametrize("smoke", _runs(["bc"]), indirect=True)
def test_saved_policy_through_fetch_policy_weights(smoke, tmp_path):
    """Pushed to a folder location, fetched with ``fetch_policy_weights``, rebuilt, rolled out."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from torchstore.remote import fetch_policy_weights, pull, push

    assert smoke.proc.returncode == 0, smoke.proc.stderr[-3000:]
    location, cache = tmp_path / "models", tmp_path / "cache"
    location.mkdir()
    push(smoke.run_dir, location, "reach-bc", kind="policy", progress=False)
    state = fetch_policy_weights(location, "reach-bc", cache_dir=cache)
    saved = load_file(str(smoke.run_dir / "policy.safetensors"))
    assert state.keys() == saved.keys()
    assert all((state[k] == saved[k]).all() for k in saved)
    entry = pull(location, "reach-bc", cache_dir=cache, progress=False)
    cfg = OmegaConf.load(entry / "config.yaml")
    policy = build_policy("bc", cfg, state)
    rolled = recipe_module("bc").rollout_saved(cfg, policy)
    assert smoke.result_line() in rolled.splitlines()


def test_load_policy_refuses_a_folder_without_one(tmp_path, preloaded):
    with pytest.raises(FileNotFoundError, match="has no config.yaml"):
        load_policy(tmp_path)
    proc = preloaded.run(
        [sys.executable, str(ROOT / "recipes" / "rollout.py"), str(tmp_path)],
        cwd=tmp_path,
        env=_env(),
        timeout=120,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("error: ")
        and "Traceback" not in proc.stderr
    )


@pytest.mark.parametrize("smoke", _runs(["bc"]), indirect=True)
def test_rollout_refuses_damaged_or_mismatched_weights(smoke, tmp_path, preloaded):
    """A truncated weights file, or bc weights under an offline_rl label: one error line."""
    import shutil

    from safetensors.torch import load_file, save_file

    assert smoke.proc.returncode == 0, smoke.proc.stderr[-3000:]
    truncated, relabelled = tmp_path / "truncated", tmp_path / "relabelled"
    for folder in (truncated, relabelled):
        folder.mkdir()
        shutil.copy2(smoke.run_dir / "config.yaml", folder / "config.yaml")
    data = (smoke.run_dir / "policy.safetensors").read_bytes()
    (truncated / "policy.safetensors").write_bytes(data[: len(data) // 2])
    state = load_file(str(smoke.run_dir / "policy.safetensors"))
    save_file(state, str(relabelled / "policy.safetensors"), metadata={"recipe": "offline_rl"})
    for folder, said in (
        (truncated, "not a readable safetensors file"),
        (relabelled, "does not fit"),
    ):
        with pytest.raises(ValueError, match=said):
            load_policy(folder)
    proc = preloaded.run(
        [sys.executable, str(ROOT / "recipes" / "rollout.py"), str(truncated)],
        cwd=tmp_path,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "not a readable safetensors file" in proc.stderr


def test_load_policy_refuses_weights_of_no_known_recipe(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.yaml").write_text("seed: 0\n")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "policy.safetensors"), metadata={"x": "y"})
    with pytest.raises(ValueError, match="names recipe None"):
        load_policy(tmp_path)


# --------------------------------------------------------------------------- interrupts
#: runs far longer than the test waits; metrics rows come quickly
LONG = {
    "bc": ["trainer.max_steps=1000000", "eval.episodes=2", *QUIET],
    "offline_rl": ["trainer.max_steps=1000000", "eval.episodes=2", *QUIET],
    "sac": [
        "collector.total_frames=1000000",
        "collector.init_random_frames=100",
        "updates_per_frame=0.5",
        "log_every=5",
        "eval.episodes=1",
    ],
}


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


@pytest.mark.parametrize(
    ("name", "sig"),
    [("bc", signal.SIGINT), ("sac", signal.SIGINT), ("offline_rl", signal.SIGTERM)],
    ids=["bc-SIGINT", "sac-SIGINT", "offline_rl-SIGTERM"],
)
def test_interrupted_recipe_exits_cleanly_with_its_outputs(name, sig, tmp_path, preloaded):
    run_dir = tmp_path / "run"
    proc = preloaded.popen(
        [sys.executable, str(_script(name)), *LONG[name], f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while len(_rows(run_dir / "metrics.csv")) < 3:  # training is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no metrics rows in 240 s"
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, out[-3000:] + err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in out + err, err[-3000:]
    said = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1, out[-3000:]
    rows = _rows(run_dir / "metrics.csv")
    assert said[0].startswith(f"interrupted ({sig.name}) at step ")
    assert f"outputs in {run_dir}: config.yaml, metrics.csv ({len(rows)} rows), loss.png" in said[0]
    assert len(rows) >= 3 and all(row["step"] for row in rows)
    assert (run_dir / "loss.png").stat().st_size > 5_000
    assert (run_dir / "config.yaml").exists() and (run_dir / f"{name}.log").stat().st_size > 0
    saved = load_policy(run_dir)
    assert saved.recipe == name and not saved.complete and saved.step > 0
    assert f"at step {saved.step};" in said[0]
    result = saved.rollout(episodes=1)  # the policy as trained so far is usable
    assert "success" in result or "mean return" in result
    if name == "sac":
        return
    # the Lightning recipes kept last.ckpt at the interrupt: resume=<run folder> goes on
    assert (run_dir / "last.ckpt").is_file()
    resumed = preloaded.run(
        [
            sys.executable,
            str(_script(name)),
            f"resume={run_dir}",
            f"trainer.max_steps={saved.step + 5}",
        ],
        cwd=tmp_path,
        env=_env(),
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from last.ckpt at step {saved.step} ({len(rows)} rows kept)" in resumed.stdout
    after = _rows(run_dir / "metrics.csv")
    kept = [{k: row[k] for k in rows[0]} for row in after[: len(rows)]]  # columns were added
    assert kept == rows and len(after) > len(rows)
    again = load_policy(run_dir)
    assert again.complete and again.step == saved.step + 5


# --------------------------------------------------------------------------- quiet, narrowly
def test_only_the_leafspec_warning_is_filtered():
    import warnings

    leafspec = (
        "`isinstance(treespec, LeafSpec)` is deprecated, "
        "use `isinstance(treespec, TreeSpec) and treespec.is_leaf()` instead."
    )
    from _common import filter_third_party_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        filter_third_party_warnings()
        warnings.warn(leafspec, FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
        warnings.warn(leafspec, UserWarning, stacklevel=1)
    assert [(str(w.message), w.category) for w in seen] == [
        ("another deprecation", FutureWarning),
        (leafspec, UserWarning),
    ]


def test_only_lightnings_tip_is_dropped():
    import logging

    from _common import _Advert

    def record(msg):
        return logging.LogRecord("lightning", logging.INFO, __file__, 1, msg, None, None)

    assert not _Advert().filter(record("💡 Tip: For seamless cloud logging, try litlogger"))
    assert _Advert().filter(record("GPU available: False, used: False"))
