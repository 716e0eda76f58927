"""benchmarks/gpu_check.sh, where no GPU is: it installs nothing that is present, refuses
clearly without CUDA, and names a wrong argument (its GPU steps run on a CUDA machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run")
def test_without_cuda_it_installs_nothing_and_says_why_it_stops():
    proc = _run()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "installing" not in proc.stdout
    assert "needs a CUDA device; torch sees none" in proc.stderr


def test_a_wrong_argument_is_named():
    proc = _run("--rowz", "5")
    assert proc.returncode == 2
    assert "unknown argument --rowz" in proc.stderr
