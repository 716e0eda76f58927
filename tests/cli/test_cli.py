from __future__ import annotations

import json
import subprocess
import sys

from torchstore.cli import main


def test_demo_then_info_as_a_user_types_it(tmp_path):
    path = tmp_path / "demo.h5"
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "demo", str(path), "--episodes", "3", "--steps", "50"],
        capture_output=True, text=True, check=True,
    )
    assert "wrote 3 episodes" in run.stdout
    out = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "info", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "Pendulum-v1" in out and "rows       150" in out
    assert "length min 50, median 50, max 50" in out
    assert "next/obs   float32  3" in out


def test_info_json_and_errors(tmp_path, capsys):
    from torchstore.demo import write_demo_store

    write_demo_store(tmp_path / "d.h5", episodes=2, steps=10)
    assert main(["info", str(tmp_path / "d.h5"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 20 and info["episodes"] == 2 and info["seed"] == 0
    assert [c["name"] for c in info["columns"]][:2] == ["obs", "action"]
    (tmp_path / "junk.h5").write_bytes(b"junk")
    assert main(["info", str(tmp_path / "junk.h5")]) == 1
    assert "not an HDF5 file" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "nope.h5")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_import_lafan_command(tmp_path, capsys):
    import numpy as np

    frames = np.zeros((20, 36))
    frames[:, 6] = 1.0  # qw: identity orientation, scalar last
    frames[:, 7:] = np.linspace(0, 1, 20)[:, None]
    np.savetxt(tmp_path / "walk1_subject1.csv", frames, delimiter=",")
    assert main(["import-lafan", str(tmp_path), str(tmp_path / "g1.h5")]) == 0
    assert main(["info", str(tmp_path / "g1.h5")]) == 0
    out = capsys.readouterr().out
    assert "left_hip_pitch_joint" in out and "lafan1/g1" in out
