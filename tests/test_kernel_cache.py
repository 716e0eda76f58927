"""The compiled kernels are kept on disk between processes, and a read-only install with no
writable home still imports and runs them (kept in a private temporary folder)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

numba = pytest.importorskip("numba")

from numba.core.caching import NullCache  # noqa: E402
from numba.core.dispatcher import Dispatcher  # noqa: E402

import torchstore  # noqa: E402
from torchstore.kernel_cache import fallback_cache_dir  # noqa: E402

KERNEL_MODULES = [
    "torchstore.samplers.kernels",
    "torchstore.data.rows.rowcopy",
    "torchstore.data.rows.rowgather",
    "torchstore.io.hdf5.xxh3_rows",
    "torchstore.io.records._varints",
    "torchstore.data.residency.direct_read",
]


@pytest.mark.parametrize("name", KERNEL_MODULES)
def test_every_kernel_is_compiled_with_an_on_disk_cache(name):
    module = importlib.import_module(name)
    kernels = {
        attr: fn
        for attr, fn in vars(module).items()
        if isinstance(fn, Dispatcher) and fn.py_func.__module__ == name
    }
    assert kernels, f"no compiled kernels found in {name}"
    for attr, fn in kernels.items():
        if fn.targetoptions.get("inline") == "always":
            continue  # compiled into its callers, and cached with them
        assert not isinstance(fn._cache, NullCache), f"{name}.{attr} is compiled in every process"


_RUN = """
import numpy as np
import numba
from torchstore.io.records._varints import decode_varints
out = np.empty(2, dtype=np.int64)
assert decode_varints(np.array([5, 0x80, 0x01], dtype=np.uint8), out) == 2
assert out.tolist() == [5, 128]
print("cache:", numba.config.CACHE_DIR)
"""


def test_a_read_only_install_without_a_writable_home_keeps_kernels_in_a_private_folder(tmp_path):
    # the package copied where numba cannot keep its cache beside the modules (each
    # ``__pycache__`` is a file, as good as a read-only folder for a process run as root),
    # and a home whose cache folder cannot be made
    site = tmp_path / "site"
    shutil.copytree(
        Path(torchstore.__file__).parent,
        site / "torchstore",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for folder in [site / "torchstore", *(site / "torchstore").rglob("*")]:
        if folder.is_dir():
            (folder / "__pycache__").write_text("not a folder")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("not a folder")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
    env.update(
        PYTHONPATH=str(site),
        HOME=str(home),
        TMPDIR=str(temp),
        PYTHONDONTWRITEBYTECODE="1",
        NUMBA_DEBUG_CACHE="1",
    )
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _RUN],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout)
    private = temp / f"torchstore-numba-{os.getuid()}"
    assert f"cache: {private}\n" in runs[0]
    assert private.is_dir() and oct(private.stat().st_mode & 0o777) == "0o700"
    assert list(private.rglob("_varints.decode_varints-*.nbi"))
    # the second process loads the machine code the first one kept
    assert "[cache] data saved" in runs[0] and "[cache] data saved" not in runs[1]
    assert "[cache] data loaded" in runs[1]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_private_folder_another_user_could_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    path = tmp_path / f"torchstore-numba-{os.getuid()}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    assert fallback_cache_dir() is None
    path.chmod(0o700)
    assert fallback_cache_dir() == str(path)
    path.rmdir()
    path.symlink_to(tmp_path)  # a link (to a folder anyone may have made) is not ours
    assert fallback_cache_dir() is None
