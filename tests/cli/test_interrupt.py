"""Ctrl-C (a real SIGINT to a real ``torchstore`` process) and a closed stdout pipe."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from torchstore.data.store.store import TrajectoryStore

ENV = {**os.environ, "TORCHSTORE_DISABLE_PROGRESS": "1"}


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchstore.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _committed(path: Path) -> int:
    # The writer creates the store under another name and renames it into place, so a
    # reader sees no file or a whole store: any other failure to read is a finding.
    try:
        with TrajectoryStore(path) as store:
            return store.num_episodes
    except FileNotFoundError:
        return 0


def _interrupt_after(proc: subprocess.Popen, path: Path, episodes: int) -> tuple[int, str]:
    """SIGINT ``proc`` once ``path`` holds ``episodes`` committed episodes."""
    deadline = time.monotonic() + 180
    while _committed(path) < episodes:
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no episode committed in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _rows(path: Path, columns: list[str]) -> dict[str, np.ndarray]:
    with TrajectoryStore(path) as store:
        slab = store.read_slab(0, store.num_rows, columns)
        return {c: slab.get(c).numpy() for c in columns}


def test_ctrl_c_during_demo_reports_committed_episodes_and_resumes_to_the_same_rows(tmp_path):
    from torchstore.demo import write_demo_store

    path = tmp_path / "runs.h5"
    proc = _start("demo", str(path), "--episodes", "600", "--steps", "5", "--seed", "3")
    code, err = _interrupt_after(proc, path, 3)
    assert code == 130, err  # 0: the SIGINT was lost ("Exception ignored in ...")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    match = re.fullmatch(
        r"interrupted; (\d+) episodes committed to (\S+), resume with: (.+)", err.strip()
    )
    assert match, err
    n = int(match.group(1))
    assert 3 <= n < 600 and match.group(2) == str(path) and _committed(path) == n
    resume = shlex.split(match.group(3))
    assert resume[:2] == ["torchstore", "demo"] and "--resume" in resume
    done = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *resume[1:]],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    whole = write_demo_store(tmp_path / "whole.h5", episodes=600, steps=5, seed=3)
    columns = ["obs", "action", "reward", "done"]
    got, want = _rows(path, columns), _rows(whole, columns)
    for c in columns:
        np.testing.assert_array_equal(got[c], want[c])
    with TrajectoryStore(path) as store:
        assert [store.episode_metadata(i)["episode"] for i in (0, n, 599)] == [0, n, 599]


def _lafan_folder(root: Path, files: int, frames: int) -> Path:
    root.mkdir()
    t = np.linspace(0.0, 1.0, frames)
    for i in range(files):
        data = np.zeros((frames, 36))
        data[:, 0] = t * (i + 1)
        data[:, 6] = 1.0  # identity orientation, scalar last
        data[:, 7:] = np.sin(t[:, None] * (i + 1))
        np.savetxt(root / f"clip{i:03d}.csv", data, delimiter=",", fmt="%.6f")
    return root


def test_ctrl_c_during_import_lafan_then_the_printed_resume_command_finishes_it(tmp_path):
    from torchstore.motion import import_lafan

    # the import spends most of its time per file, not per frame: 200 short clips keep it
    # writing for seconds past the second commit
    source = _lafan_folder(tmp_path / "g1", files=200, frames=60)
    dest = tmp_path / "out" / "lafan.h5"
    proc = _start("import-lafan", str(source), str(dest), "--fps", "60")
    code, err = _interrupt_after(proc, dest, 2)
    assert code == 130 and "Traceback" not in err, err
    line = err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("interrupted; "), err
    resume = shlex.split(line.split("resume with: ", 1)[1])
    assert resume[1] == "import" and "--resume" in resume and "--fps" in resume
    assert resume[resume.index("--format") + 1] == "lafan"
    done = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *resume[1:]],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    whole = import_lafan(source, tmp_path / "whole.h5", fps=60)
    got, want = _rows(dest, ["root_pos", "joint_pos"]), _rows(whole, ["root_pos", "joint_pos"])
    for c in got:
        np.testing.assert_array_equal(got[c], want[c])


def has_open(pid: int, ending: str) -> bool:
    """Whether process ``pid`` has a file whose path ends with ``ending`` open (/proc)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(ending):
                return True
        except OSError:
            continue
    return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".csv"):
                return True
        except OSError:
            continue
    return False


def test_ctrl_c_before_anything_is_written_says_so(tmp_path):
    """An interrupted import-lafan still validating its files leaves no store."""
    source = _lafan_folder(tmp_path / "g1", files=400, frames=300)
    dest = tmp_path / "new" / "lafan.h5"
    proc = _start("import-lafan", str(source), str(dest))
    # Signal while the validation pass has a CSV open and before any store file exists:
    # watched through /proc, so the moment does not depend on how fast the machine is.
    deadline = time.monotonic() + 120
    while not has_open(proc.pid, ".csv") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is not None or (dest.parent.exists() and any(dest.parent.iterdir())):
        proc.kill()
        pytest.skip("the import got past validation before the signal; nothing to check")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip() in (f"interrupted; nothing written to {dest}", "interrupted"), err
    assert not dest.exists() and not dest.parent.exists()


def test_info_json_into_a_closed_pipe_ends_without_a_traceback(tmp_path):
    from torchstore.data.columns import ColumnSpec
    from torchstore.data.file.writer import TrajectoryStoreWriter

    path = tmp_path / "big_meta.h5"
    notes = {f"note_{i}": "x" * 200 for i in range(2000)}  # ~400 KB of JSON: more than a pipe holds
    with TrajectoryStoreWriter(path, [ColumnSpec("obs", "float32", (2,))], metadata=notes) as w:
        w.add_episode({"obs": np.zeros((3, 2), dtype=np.float32)})
    run = subprocess.run(
        f"{shlex.quote(sys.executable)} -m torchstore.cli info {shlex.quote(str(path))} --json | "
        "head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert run.stdout == "{\n"
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.stderr == ""


def test_ctrl_c_during_a_pull_is_one_line_and_the_next_pull_finishes(tmp_path):
    from tests.fileserver import FileServer
    from torchstore.remote import write_index

    payload = os.urandom(4000)
    (tmp_path / "loc" / "ds").mkdir(parents=True)
    (tmp_path / "loc" / "ds" / "a.bin").write_bytes(payload)
    write_index(tmp_path / "loc")
    cache = tmp_path / "cache"
    with FileServer(tmp_path / "loc") as server:
        server.drip_s["ds/a.bin"] = 0.01  # 40 s for the file: the pull is mid-transfer
        proc = _start("pull", server.url, "ds", "--cache-dir", str(cache))
        deadline = time.monotonic() + 180
        while not server.body_bytes.get("ds/a.bin"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert err.strip() == (
            "interrupted; verified files stay in the cache, run the same command again to continue"
        )
        server.drip_s.clear()
        done = _start("pull", server.url, "ds", "--cache-dir", str(cache))
        out, err = done.communicate(timeout=300)
        assert done.returncode == 0, err
    assert (Path(out.strip()) / "a.bin").read_bytes() == payload


def test_sigterm_during_an_import_cleans_up_like_ctrl_c(tmp_path):
    """``timeout``, Slurm and ``docker stop`` send SIGTERM: the import stops with 143, one
    line, and no hidden partial store (or its lock) beside the destination."""
    import h5py

    src = tmp_path / "many.hdf5"
    with h5py.File(src, "w") as f:  # thousands of small demos: an import of a few seconds
        for i in range(3000):
            demo = f.create_group(f"data/demo_{i}")
            demo["actions"] = np.zeros((20, 7))
            demo["obs/x"] = np.zeros((20, 3))
            demo.attrs["num_samples"] = 20
    dest = tmp_path / "out" / "s.h5"
    proc = _start("import", str(src), str(dest), "--no-progress")
    partial = dest.with_name(f".{dest.name}.importing")
    deadline = time.monotonic() + 120
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the import finished before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), err
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
