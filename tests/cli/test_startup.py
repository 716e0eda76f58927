"""Start-up cost: what ``import torchstore`` and ``torchstore --help`` pull in.

The timing lives in benchmarks/startup.py.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import torchstore

HEAVY = ("torch", "tensordict", "torchrl", "torch._dynamo", "h5py", "numpy")
PACKAGES = (
    "torchstore",
    "torchstore.data",
    "torchstore.samplers",
    "torchstore.io",
    "torchstore.lightning",
    "torchstore.lerobot",
    "torchstore.motion",
    "torchstore.remote",
    "torchstore.tasks",
)


def _loaded_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_imports_no_heavy_dependency(package):
    assert _loaded_after(f"import {package}") == []


def test_help_and_version_import_no_heavy_dependency():
    code = (
        "import contextlib, io\nfrom torchstore.cli import main\n"
        "for argv in (['--help'], ['--version'], ['info', '--help'], ['import-lafan', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)"
    )
    assert _loaded_after(code) == []


def test_a_name_that_needs_torch_imports_it_on_first_use():
    assert "torch" in _loaded_after("import torchstore\ntorchstore.TrajectoryStore")
    loaded = _loaded_after("from torchstore import UniformSampler")
    assert "torchrl" in loaded


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_both_ways(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        namespace: dict = {}
        exec(f"from {package} import {name}", namespace)
        assert namespace[name] is value
        assert name in dir(module)


def test_store_replay_is_public_and_unknown_names_raise_attribute_error():
    from torchstore.data.replay import StoreReplay

    assert torchstore.StoreReplay is StoreReplay and "StoreReplay" in torchstore.__all__
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        torchstore.Nope  # noqa: B018
    assert not hasattr(torchstore.data, "Nope")


def test_submodules_stay_reachable_as_attributes():
    code = (
        "import torchstore\n"
        "assert torchstore.data.store.TrajectoryStore and torchstore.samplers.sumtree.SumTree"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
