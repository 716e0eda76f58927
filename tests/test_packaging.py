"""What ``pip install`` puts on a user's machine: the package is marked as typed (PEP 561)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_py_typed_is_in_the_source_package():
    assert resources.files("torchstore").joinpath("py.typed").is_file()


def test_py_typed_is_installed_by_the_wheel(tmp_path):
    """Build the wheel from a copy of the sources; ``torchstore/py.typed`` must be in it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "torchstore", src / "torchstore", ignore=shutil.ignore_patterns("__pycache__")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("torchstore-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "torchstore/py.typed" in names
    assert "torchstore/__init__.py" in names
