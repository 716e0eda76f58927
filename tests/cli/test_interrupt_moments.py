"""Ctrl-C at any moment of a command is exit 130 and one line on stderr, never a traceback:
while the parser is built, inside a C extension's callback, while the source is scanned,
while the store is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.cli.test_interrupt import has_open

ENV = {**os.environ, "TORCHSTORE_DISABLE_PROGRESS": "1"}


def _robomimic(path: Path, demos: int) -> Path:
    with h5py.File(path, "w") as f:
        for i in range(demos):
            demo = f.create_group(f"data/demo_{i}")
            demo["actions"] = np.zeros((20, 7))
            demo["obs/x"] = np.zeros((20, 3))
            demo["obs/y"] = np.zeros((20, 2))
            demo.attrs["num_samples"] = 20
    return path


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def _assert_one_line(rc: int, err: str, status: int = 130) -> None:
    assert rc == status and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), err


def test_ctrl_c_while_the_parser_is_built(tmp_path):
    code = """
import signal, sys
import torchstore.cli.main
cli = sys.modules['torchstore.cli.main']  # the package's ``main`` is the function
build = cli.build_parser
def interrupted_build():
    signal.raise_signal(signal.SIGINT)  # a real SIGINT, run by Python's own handler
    return build()
cli.build_parser = interrupted_build
sys.exit(cli.main(["info", sys.argv[1]]))
"""
    done = _python(code, str(tmp_path))
    _assert_one_line(done.returncode, done.stderr)
    assert done.stderr == "interrupted\n" and done.stdout == ""


def test_ctrl_c_inside_an_h5py_visit_callback_is_not_a_system_error(tmp_path):
    """h5py turns a KeyboardInterrupt raised in its link-visit callback into a SystemError
    (``FastRLock.__exit__ returned a result with an exception set``)."""
    code = """
import signal, sys
import h5py
import torchstore.cli.main
cli = sys.modules['torchstore.cli.main']  # the package's ``main`` is the function

def command(args):
    with h5py.File(args.path) as f:
        f.id.links.visit(lambda name, info: signal.raise_signal(signal.SIGINT), info=True)

build = cli.build_parser
def parser():
    p = build()
    sub = next(a for a in p._actions if a.dest == "command")
    sub.choices["info"].set_defaults(func=command)
    return p
cli.build_parser = parser
sys.exit(cli.main(["info", sys.argv[1]]))
"""
    done = _python(code, str(_robomimic(tmp_path / "demos.hdf5", 3)))
    _assert_one_line(done.returncode, done.stderr)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="watches the import through /proc")
@pytest.mark.parametrize("moment", ["scan", "scan+20ms", "scan+100ms", "writing"])
def test_ctrl_c_during_an_import_at_several_moments(tmp_path, moment):
    # thousands of demos: the scan alone visits their links for a second or more
    src = _robomimic(tmp_path / "demos.hdf5", 3000)
    dest = tmp_path / "out" / "s.h5"
    partial = dest.with_name(f".{dest.name}.importing")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchstore.cli", "import", str(src), str(dest), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if partial.exists() if moment == "writing" else has_open(proc.pid, src.name):
                break
            time.sleep(0.002)
        if moment.startswith("scan+"):
            time.sleep(int(moment[5:-2]) / 1000)
        # a slow start may reach a later moment first: Ctrl-C must be one line there too,
        # so the signal goes in wherever the import is; only a finished import cannot take it
        assert proc.poll() is None, f"the import of 3000 demos finished before the {moment}"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    _assert_one_line(proc.returncode, err)
    assert not partial.exists() and not dest.exists()
