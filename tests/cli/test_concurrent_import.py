"""Two ``torchstore import`` processes writing one DEST: the second is refused in one line
and the first finishes as if it had been alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

from torchstore.data.store.store import TrajectoryStore

ENV = {**os.environ, "TORCHSTORE_DISABLE_PROGRESS": "1"}


def _robomimic(path, demos: int) -> None:
    with h5py.File(path, "w") as f:
        for i in range(demos):
            demo = f.create_group(f"data/demo_{i}")
            demo["actions"] = np.full((20, 7), i, dtype=np.float64)
            demo["obs/x"] = np.zeros((20, 3))
            demo.attrs["num_samples"] = 20


def _import(src, dest, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchstore.cli", "import", str(src), str(dest), "--no-progress"]
        + list(flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _second_import_while_the_first_is_stopped(tmp_path, *flags: str) -> None:
    src = tmp_path / "demos.hdf5"
    _robomimic(src, 2000)
    dest = tmp_path / "out" / "s.h5"
    first = _import(src, dest, *flags)
    partial = dest.with_name(f".{dest.name}.importing")
    deadline = time.monotonic() + 120
    while not partial.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert first.poll() is None, first.communicate()
    # frozen while the second runs to its end: the two meet whatever the machine's speed
    first.send_signal(signal.SIGSTOP)
    try:
        second = _import(src, dest, *flags)
        out, err = second.communicate(timeout=300)
        held = partial.exists()
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 1, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"torchstore import: another import is writing {dest}: process "), err
    assert f"process {first.pid} " in err
    assert held, "the refused import removed the first one's partial store"
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    with TrajectoryStore(dest) as store:
        assert store.num_episodes == 2000
        assert float(store.episode(1999)["action"][0, 0]) == 1999.0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["s.h5"]


def test_a_second_import_to_one_dest_is_refused_and_the_first_finishes(tmp_path):
    _second_import_while_the_first_is_stopped(tmp_path)


def test_a_second_overwriting_import_leaves_the_first_and_the_old_store(tmp_path):
    dest = tmp_path / "out" / "s.h5"
    dest.parent.mkdir()
    old = tmp_path / "old.hdf5"
    _robomimic(old, 3)
    done = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "import", str(old), str(dest)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    _second_import_while_the_first_is_stopped(tmp_path, "--overwrite")
