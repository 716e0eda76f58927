from __future__ import annotations

import json
import subprocess
import sys

import torch

from torchstore.cli import main
from torchstore.data.store.store import TrajectoryStore


def test_demo_then_info_as_a_user_types_it(tmp_path):
    path = tmp_path / "demo.h5"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchstore.cli",
            "demo",
            str(path),
            "--episodes",
            "3",
            "--steps",
            "50",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote 3 episodes" in run.stdout
    out = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "info", str(path)],
        capture_output=True,
        text=True,
        check=True,
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


def _cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *args], capture_output=True, text=True, **kw
    )


def test_version_and_help_show_defaults():
    from torchstore import __version__

    run = _cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"torchstore {__version__}"
    text = " ".join(_cli("demo", "--help").stdout.split())
    assert "--episodes EPISODES episodes to write (default: 20 for pendulum, 50 for reach)" in text
    assert "--seed SEED random seed (same seed, same rows) (default: 0)" in text
    remote = _cli("remote", "--help").stdout
    assert "index.json" in remote and "remote index DIR" in remote


def test_demo_refuses_an_existing_store_unless_overwrite(tmp_path, capsys):
    # In-process: what is checked is the refusal, its one-line message and the untouched
    # bytes; main() returns the exit status `python -m torchstore.cli` exits with, and
    # test_demo_then_info_as_a_user_types_it covers the real process.
    path = tmp_path / "runs.h5"
    assert main(["demo", str(path), "--episodes", "3", "--steps", "100"]) == 0
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["demo", str(path), "--episodes", "2"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.splitlines()) == 1
    assert path.read_bytes() == before
    assert main(["demo", str(path), "--episodes", "2", "--steps", "5", "--overwrite"]) == 0
    with TrajectoryStore(path) as store:
        assert store.num_rows == 10


def test_info_median_of_an_even_count_and_a_store_with_no_episodes(tmp_path, capsys):
    from torchstore.data.columns import ColumnSpec
    from torchstore.data.file.writer import TrajectoryStoreWriter

    path = tmp_path / "two.h5"
    with TrajectoryStoreWriter(path, [ColumnSpec("obs", "float32", (2,))]) as w:
        w.add_episode({"obs": torch.zeros(20, 2)})
        w.add_episode({"obs": torch.zeros(30, 2)})
    assert main(["info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episode_length"] == {
        "min": 20,
        "median": 25.0,
        "max": 30,
    }
    assert main(["info", str(path)]) == 0
    assert "length min 20, median 25, max 30" in capsys.readouterr().out
    empty = tmp_path / "empty.h5"
    TrajectoryStoreWriter(empty, [ColumnSpec("obs", "float32", (2,))]).close()
    assert main(["info", str(empty), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == 0 and info["episode_length"] is None
    assert main(["info", str(empty)]) == 0
    assert "episodes   0  (no episodes)" in capsys.readouterr().out


def _minari_hdf5(root):
    """A Minari 0.5 HDF5 dataset laid out as Minari writes it (CartPole, episodes of 28 and 40)."""
    import h5py
    import numpy as np

    data = root / "data"
    data.mkdir(parents=True)
    meta = {
        "total_episodes": 2,
        "total_steps": 68,
        "data_format": "hdf5",
        "minari_version": "0.5.4",
        "dataset_id": "probe/cartpole-hdf5-v0",
        "env_spec": json.dumps({"id": "CartPole-v1"}),
        "observation_space": json.dumps({"type": "Box", "dtype": "float32", "shape": [4]}),
    }
    (data / "metadata.json").write_text(json.dumps(meta))
    with h5py.File(data / "main_data.hdf5", "w") as f:
        for i, steps in enumerate((28, 40)):
            g = f.create_group(f"episode_{i}")
            g.attrs.update({"id": i, "seed": i, "total_steps": steps})
            g["observations"] = np.zeros((steps + 1, 4), np.float32)
            g["actions"] = np.zeros(steps, np.int64)
            g["rewards"] = np.ones(steps)
            g.create_group("infos")
    return root


def test_info_on_folders_that_are_not_stores(tmp_path, capsys):
    minari = _minari_hdf5(tmp_path / "cartpole-hdf5-v0")
    before = {p: p.stat().st_mtime_ns for p in minari.rglob("*")}
    assert main(["info", str(minari), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == 2 and info["rows"] == 68 and info["env_id"] == "CartPole-v1"
    assert info["episode_length"] == {"min": 28, "median": 34.0, "max": 40}
    assert {"name": "observations", "dtype": "float32", "shape": [4], "quantize": None} in info[
        "columns"
    ]
    assert main(["info", str(minari / "data")]) == 0
    assert "Minari dataset (hdf5, minari 0.5.4" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in minari.rglob("*")} == before  # read-only
    arrow = tmp_path / "arrow" / "data"
    for i, steps in enumerate((5, 7, 9)):
        (arrow / str(i)).mkdir(parents=True)
        (arrow / str(i) / "metadata.json").write_text(json.dumps({"id": i, "total_steps": steps}))
    (arrow / "metadata.json").write_text(json.dumps({"data_format": "arrow", "total_episodes": 3}))
    assert main(["info", str(arrow.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episode_length"]["median"] == 7.0
    (arrow / "1" / "metadata.json").write_text("{}")
    assert main(["info", str(arrow.parent)]) == 1
    err = capsys.readouterr().err
    assert (
        "looks like a Minari dataset but KeyError('total_steps')" in err
        and len(err.splitlines()) == 1
    )
    assert main(["info", str(tmp_path / "cartpole-hdf5-v0" / "data" / "..")]) == 0
    capsys.readouterr()
    (tmp_path / "plain").mkdir()
    assert main(["info", str(tmp_path / "plain")]) == 1
    assert "is an empty folder: it holds no store" in capsys.readouterr().err
    (tmp_path / "plain" / "notes.txt").write_text("notes\n")
    assert main(["info", str(tmp_path / "plain")]) == 1
    assert "not a LeRobot dataset (no meta/info.json)" in capsys.readouterr().err


def test_progress_bars_written_to_a_log_redraw_rarely(tmp_path, capsys):
    import numpy as np

    src = tmp_path / "g1"
    src.mkdir()
    frames = np.zeros((400, 36))
    frames[:, 6] = 1.0
    for i in range(60):
        np.savetxt(src / f"m{i:02d}.csv", frames, delimiter=",", fmt="%.3f")
    # in-process: the captured stderr is not a tty, as a pipe or a log file is not
    code = main(["import-lafan", str(src), str(tmp_path / "g1.h5")])
    err = capsys.readouterr().err
    assert code == 0, err
    redraws = err.count("\r") + err.count("\n")
    assert "import-lafan" in err and "120/120" in err  # a bar, and it finished
    assert redraws <= 6, err  # tqdm's default would redraw on most of the 120 steps


def test_one_redraw_rule_for_every_bar():
    import io

    from torchstore.io.progress import LOG_INTERVAL_S, bar_options

    assert bar_options(file=io.StringIO())["mininterval"] == LOG_INTERVAL_S
    assert "mininterval" not in bar_options(file=_Tty())
    assert bar_options(file=io.StringIO(), mininterval=1.0)["mininterval"] == 1.0


class _Tty:
    def isatty(self):
        return True

    def write(self, text):
        return len(text)


def test_write_demo_store_refuses_to_replace_and_resumes_only_its_own_run(tmp_path):
    import pytest

    from torchstore.demo import write_demo_store
    from torchstore.errors import StoreFormatError

    path = write_demo_store(tmp_path / "d.h5", episodes=2, steps=5)
    with pytest.raises(FileExistsError, match="already exists"):
        write_demo_store(path, episodes=2, steps=5)
    with pytest.raises(StoreFormatError, match="not written by an interrupted demo"):
        write_demo_store(path, episodes=4, steps=5, resume=True)  # another run's arguments
    with pytest.raises(ValueError, match="steps"):
        write_demo_store(tmp_path / "e.h5", steps=0)
    assert write_demo_store(path, episodes=2, steps=5, resume=True) == path  # complete: no-op
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 2


def test_outputs_get_their_missing_folders_and_a_failure_leaves_none(tmp_path, capsys):
    import numpy as np

    good = tmp_path / "walk.csv"
    frames = np.zeros((10, 36))
    frames[:, 6] = 1.0
    np.savetxt(good, frames, delimiter=",")
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n")
    assert (
        main(["import-lafan", str(bad), str(tmp_path / "new" / "sub" / "x.h5"), "--no-progress"])
        == 1
    )
    err = capsys.readouterr().err
    assert "bad.csv line 1" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "new").exists()
    assert main(["import-lafan", str(good), str(tmp_path / "new" / "sub" / "x.h5")]) == 0
    with TrajectoryStore(tmp_path / "new" / "sub" / "x.h5") as store:
        assert store.num_rows == 10


def test_python_m_torchstore_runs_the_command_line(tmp_path):
    """``python -m torchstore`` is the ``torchstore`` command, as ``python -m pip`` is pip."""
    run = subprocess.run(
        [sys.executable, "-m", "torchstore", "--version"], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.startswith("torchstore ")
    path = tmp_path / "demo.h5"
    cmd = [sys.executable, "-m", "torchstore", "demo", str(path), "--episodes", "2", "--steps", "5"]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    bad = subprocess.run(
        [sys.executable, "-m", "torchstore", "import", str(path), str(tmp_path / "again.h5")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "already a torchstore store" in bad.stderr


def test_help_shows_one_verb_per_job_and_lists_the_older_spellings_once(capsys):
    from torchstore.cli.formats import OLDER_SPELLINGS

    try:
        main(["--help"])  # argparse's --help exits; main may return the status instead
    except SystemExit:
        pass
    out = capsys.readouterr().out
    listing, epilog = out.split("older spellings", 1)
    for old, new in OLDER_SPELLINGS.items():
        assert old not in listing, old  # not a command of its own in the list
        assert f"{old} = {new}" in " ".join(epilog.split())
    assert "  import " in listing and "  export " in listing


def test_an_older_spelling_runs_as_the_verb_it_stands_for(tmp_path, capsys):
    import numpy as np

    frames = np.zeros((20, 36))
    frames[:, 6] = 1.0
    np.savetxt(tmp_path / "walk1_subject1.csv", frames, delimiter=",")
    assert main(["import", str(tmp_path), str(tmp_path / "a.h5"), "--format", "lafan"]) == 0
    assert main(["import-lafan", str(tmp_path), str(tmp_path / "b.h5")]) == 0
    from torchstore.data import TrajectoryStore

    with TrajectoryStore(tmp_path / "a.h5") as a, TrajectoryStore(tmp_path / "b.h5") as b:
        assert a.num_rows == b.num_rows == 20 and a.columns == b.columns


def test_an_option_of_another_format_is_refused_in_one_line(tmp_path, capsys):
    import numpy as np

    np.savetxt(tmp_path / "walk1_subject1.csv", np.zeros((5, 36)), delimiter=",")
    code = main(["import", str(tmp_path), str(tmp_path / "a.h5"), "--format", "lafan",
                 "--revision", "v3.0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "--revision applies to lerobot" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a.h5").exists()


def test_a_dataset_id_needs_a_format_that_takes_ids(tmp_path, capsys):
    code = main(["import", "someone/some-dataset", str(tmp_path / "a.h5")])
    err = capsys.readouterr().err
    assert code != 0 and "--format lerobot" in err and len(err.splitlines()) == 1
