"""The camera recipes as a user runs them: bc_robomimic on a store kept as AV1 through its
windowed config, bc_camera on an imported LeRobot dataset and with per-column frames."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_recipe(recipe: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python recipes/<recipe>.py args`` from ``cwd``, as a user runs it; asserts it ran."""
    cmd = [sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_bc_robomimic_trains_from_an_encoded_camera_store(tmp_path):
    from tests.formats.robomimic_files import write_robomimic
    from torchstore.data.store.recode import recode_store
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.formats import import_robomimic

    src = write_robomimic(tmp_path / "lift.hdf5", lengths=[12] * 10)
    import_robomimic(src, tmp_path / "lift.h5", progress=False)
    recode_store(tmp_path / "lift.h5", tmp_path / "lift_av1.h5", {"obs/agentview_image": "av1"},
                 progress=False)  # fmt: skip
    with TrajectoryStore(tmp_path / "lift_av1.h5") as store:
        assert store.column("obs/agentview_image").codec.kind == "av1"
        row_bytes = sum(c.row_nbytes for c in store.columns)
    run = tmp_path / "run"
    args = [
        "datamodule=robomimic_windowed",
        f"store.path={tmp_path / 'lift_av1.h5'}",
        f"datamodule.resident={row_bytes * 40}B",  # a third of the store's 120 rows
        "datamodule.resident_blocks=2",
        "trainer.max_steps=6",
        f"hydra.run.dir={run}",
    ]
    run_recipe("bc_robomimic", args, tmp_path)
    assert (run / "policy.safetensors").is_file() and (run / "last.ckpt").is_file()
    assert "resident: " in (run / "config.yaml").read_text()


def test_bc_camera_trains_from_an_imported_lerobot_camera_dataset(tmp_path):
    """A LeRobot v3.0 dataset (AV1 camera, LeRobot's column names) imported as it comes, then
    the camera recipe with only its keys and length given: the camera stays encoded in the
    store, the window decodes it, and the run reports that there is no simulator to roll out in."""
    import numpy as np

    from benchmarks._camera_frames import camera_frames
    from torchstore.lerobot import LeRobotWriter, import_lerobot

    cam = "observation.images.top"
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        cam: {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"]},
    }
    with LeRobotWriter(tmp_path / "ds", fps=10, features=features) as writer:
        for e in range(4):
            n = 20
            rng = np.random.default_rng(e)
            writer.add_episode(
                {
                    "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
                    "action": rng.standard_normal((n, 2)).astype(np.float32),
                    cam: camera_frames(n, 48, 64, episode=e, seed=1),
                },
                task="pick",
            )
    import_lerobot(tmp_path / "ds", tmp_path / "ds.h5", progress=False)
    run = tmp_path / "run"
    args = [
        f"store.path={tmp_path / 'ds.h5'}",
        f"obs.rgb=[{cam}]",
        "obs.low_dim=[observation.state]",
        "datamodule.action_horizon=5",
        "datamodule.resident=60",  # rows: three blocks of 20 (one refilling), of 80
        "+datamodule.resident_blocks=2",
        "trainer.max_steps=6",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run}",
    ]
    proc = run_recipe("bc_camera", args, tmp_path)
    assert "no rollout:" in proc.stdout
    assert (run / "policy.safetensors").is_file() and (run / "last.ckpt").is_file()


def test_bc_camera_takes_per_column_frames_and_rolls_out_with_them(tmp_path):
    """``datamodule.frame_offsets`` sizes the policy (a camera frame from 4 steps back and
    now, a 6-step chunk), and the saved policy, rebuilt from its run folder, picks the same
    frames from its history in a rollout as the run's own evaluation did. Its camera is
    kept at 24x24 (``datamodule.resize``) and shifted in training (``datamodule.augment``):
    the saved policy resizes the task's frames as the run's evaluation did."""
    run = tmp_path / "run"
    args = [
        "datamodule.frame_offsets={pixels: [-4, 0], state: [0], action: [0, 1, 2, 3, 4, 5]}",
        "datamodule.resize=[24, 24]",
        "datamodule.augment=[{_target_: torchstore.lightning.augment.RandomShift, pad: 2}]",
        "exec_horizon=3",
        "trainer.max_steps=6",
        "eval.episodes=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run}",
    ]
    proc = run_recipe("bc_camera", args, tmp_path)
    learned = [line for line in proc.stdout.splitlines() if line.startswith("learned ")]
    assert len(learned) == 1
    sys.path.insert(0, str(ROOT / "recipes"))
    from _common import load_policy

    saved = load_policy(run)
    assert saved.policy.model.obs_frames == {"state": (0,), "pixels": (-4, 0)}
    assert saved.policy.model.horizon == 6
    from torchstore.io.frames.resize import FrameResize

    assert saved.policy.resizes == {"pixels": FrameResize(24, 24)}
    assert learned[0] in saved.rollout().splitlines()


@pytest.mark.parametrize(
    "override, said",
    [
        ("datamodule.resident=30", "more than a block of the resident budget holds"),
        ("datamodule.resize={state: [8, 8]}", "'state' holds [6] rows, not camera frames"),
    ],
)
def test_an_option_the_data_does_not_allow_ends_in_one_line(tmp_path, override, said):
    """A window budget that cannot hold a whole episode, or a resize of a state column, is
    said in one ``error:`` line with status 2 (the traceback goes to the run's log), not a
    traceback on the console (whether the data module or Hydra's instantiate raised it)."""
    cmd = [
        sys.executable, str(ROOT / "recipes" / "bc_camera.py"), override,
        "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert said in line
    assert "Traceback" in (tmp_path / "run" / "bc_camera.log").read_text()
