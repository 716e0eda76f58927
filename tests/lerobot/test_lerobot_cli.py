"""The LeRobot commands as a user types them: import-lerobot, export-lerobot, push DIR REPO_ID."""

from __future__ import annotations

import subprocess
import sys

from tests.lerobot.test_lerobot_roundtrip import check_store, record
from torchstore.cli import main
from torchstore.data import TrajectoryStore


def test_import_then_export_from_the_shell(tmp_path):
    record(tmp_path / "ds", (5, 7))
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "import-lerobot",
         str(tmp_path / "ds"), str(tmp_path / "a.h5")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.startswith("imported 2 episodes, 12 frames from ")
    assert len(run.stdout.strip().splitlines()) == 1
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "export-lerobot",
         str(tmp_path / "a.h5"), str(tmp_path / "out"), "--codec", "h264", "--no-progress"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.startswith("exported 2 episodes, 12 frames to ")
    assert (tmp_path / "out/meta/info.json").exists()


def test_import_options_and_errors(tmp_path, capsys):
    written = record(tmp_path / "ds", (5, 7, 4))
    args = ["import-lerobot", str(tmp_path / "ds"), str(tmp_path / "b.h5"), "--no-progress"]
    assert main([*args, "--episodes", "0", "2", "--columns", "count", "action"]) == 0
    assert "imported 2 episodes, 9 frames" in capsys.readouterr().out
    with TrajectoryStore(tmp_path / "b.h5") as store:
        assert [c.name for c in store.columns] == ["count", "action"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "exists" in err and "overwrite" in err
    assert main([*args, "--overwrite"]) == 0
    check_store(tmp_path / "b.h5", written)
    assert main(["import-lerobot", str(tmp_path / "nowhere"), str(tmp_path / "c.h5")]) == 1
    assert "neither a local folder nor a Hub repo id" in capsys.readouterr().err
    (tmp_path / "ds/meta/info.json").write_text("{not json")
    assert main(["import-lerobot", str(tmp_path / "ds"), str(tmp_path / "c.h5")]) == 1
    assert "info.json is not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "c.h5").exists()


def test_push_a_lerobot_folder_to_a_repo_id(hub, tmp_path, capsys):
    record(tmp_path / "ds", (5,))
    repo_id = f"{hub.namespace}/demo"
    assert main(["push", str(tmp_path / "ds"), repo_id, "--private", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pushed LeRobot dataset {tmp_path / 'ds'} to {repo_id}")
    repo = hub.repos[("dataset", repo_id)]
    assert repo.private and "v3.0" in repo.tags
    (tmp_path / "plain").mkdir()
    assert main(["push", str(tmp_path / "plain"), repo_id]) == 1
    assert "not a LeRobot dataset" in capsys.readouterr().err


def test_export_flags_do_what_they_say(tmp_path, capsys):
    import json

    import numpy as np
    import torch

    from torchstore.data import ColumnSpec, TrajectoryStoreWriter

    record(tmp_path / "ds", (5, 7))
    assert (
        main(["import-lerobot", str(tmp_path / "ds"), str(tmp_path / "a.h5"), "--no-progress"]) == 0
    )
    out = tmp_path / "img"
    assert (
        main(
            [
                "export-lerobot",
                str(tmp_path / "a.h5"),
                str(out),
                "--cameras",
                "image",
                "--no-progress",
            ]
        )
        == 0
    )
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "image"  # was video
    with TrajectoryStoreWriter(tmp_path / "plain.h5", [ColumnSpec("x", torch.float32, (2,))]) as w:
        w.add_episode({"x": np.zeros((3, 2), np.float32)})
    capsys.readouterr()
    assert (
        main(["export-lerobot", str(tmp_path / "plain.h5"), str(tmp_path / "p"), "--no-progress"])
        == 1
    )
    assert "--fps" in capsys.readouterr().err
    assert (
        main(
            [
                "export-lerobot",
                str(tmp_path / "plain.h5"),
                str(tmp_path / "p"),
                "--fps",
                "15",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "p/meta/info.json").read_text())["fps"] == 15
