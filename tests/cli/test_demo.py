"""``torchstore demo``: one verb for both demo stores (``--task pendulum|reach``), and the
deprecated ``demo-data`` that still writes the same reach demonstrations."""

from __future__ import annotations

import subprocess
import sys
import time

from torchstore.cli import main
from torchstore.data.store.store import TrajectoryStore


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *args], capture_output=True, text=True
    )


def test_reach_demonstrations_are_byte_reproducible_and_never_replace_a_foreign_file(
    tmp_path, capsys
):
    first, second = tmp_path / "a" / "reach.h5", tmp_path / "b" / "reach.h5"
    run = _cli("demo", str(first), "--task", "reach", "--episodes", "3")
    assert run.returncode == 0 and run.stdout == f"wrote 3 reach demonstrations to {first}\n"
    time.sleep(1.1)  # a whole-second timestamp written by either command would now differ
    # The second copy is written in this interpreter: another process (its own hash seed,
    # its own import order) must write the same bytes as the command did.
    assert main(["demo", str(second), "--task", "reach", "--episodes", "3"]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert sorted(p.name for p in first.parent.iterdir()) == ["reach.h5"]  # no leftovers
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    capsys.readouterr()
    for extra in ([], ["--overwrite"]):
        assert main(["demo", str(notes), "--task", "reach", "--episodes", "2", *extra]) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1, err
    assert notes.read_text() == "my notes\n"
    assert main(["demo", str(first), "--task", "reach", "--episodes", "2"]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_each_task_writes_its_own_store_with_its_own_default_count(tmp_path, capsys):
    assert main(["demo", str(tmp_path / "p.h5"), "--steps", "5"]) == 0
    assert capsys.readouterr().out == f"wrote 20 episodes of 5 steps to {tmp_path / 'p.h5'}\n"
    with TrajectoryStore(tmp_path / "p.h5") as store:
        assert store.manifest.env_id == "Pendulum-v1" and store.num_episodes == 20
    assert main(["demo", str(tmp_path / "r.h5"), "--task", "reach"]) == 0
    with TrajectoryStore(tmp_path / "r.h5") as store:
        assert store.manifest.env_id == "torchstore/Reach2D-v0" and store.num_episodes == 50


def test_pendulum_options_are_refused_for_reach_before_anything_is_written(tmp_path, capsys):
    for flag in (["--steps", "10"], ["--resume"]):
        assert main(["demo", str(tmp_path / "r.h5"), "--task", "reach", *flag]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"torchstore demo: {flag[0]} applies to --task pendulum")
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "r.h5").exists()
    assert main(["demo", str(tmp_path / "r.h5"), "--task", "cartpole"]) == 2
    assert "invalid choice: 'cartpole'" in capsys.readouterr().err


def test_demo_data_still_works_and_says_once_that_it_is_deprecated(tmp_path, capsys):
    old, new = tmp_path / "old.h5", tmp_path / "new.h5"
    assert main(["demo-data", str(old), "--episodes", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "torchstore demo-data is deprecated and goes in the next release: use "
        f"torchstore demo {old} --task reach\n"
    )
    assert captured.out == f"wrote 2 reach demonstrations to {old}\n"
    assert main(["demo", str(new), "--task", "reach", "--episodes", "2"]) == 0
    assert old.read_bytes() == new.read_bytes()
    # hidden from the command list, named once in the epilog
    listing, epilog = _cli("--help").stdout.split("older spellings")
    assert "demo-data = demo PATH --task reach" in " ".join(epilog.split())
    assert "demo-data" not in listing
