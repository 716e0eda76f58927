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


HELP = (
    "import contextlib, io\nfrom torchstore.cli import main\n"
    "for argv in (['--help'], ['--version'], ['info', '--help'], ['import-lafan', '--help']):\n"
    "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
    "        main(argv)"
)
#: the probes expected to load nothing heavy, run by one interpreter that imports nothing
#: of torchstore and forks a child per probe: each child starts from that interpreter's
#: modules, as ``python -c`` would, at the cost of a fork instead of an interpreter start
LIGHT = {**{package: f"import {package}" for package in PACKAGES}, "help": HELP}
FORK_PER_PROBE = r"""
import json, os, sys

heavy, results = json.loads(sys.argv[1]), {}
for name, code in json.loads(sys.stdin.read()).items():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
            out = sorted(m for m in heavy if m in sys.modules)
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        results[name] = json.loads(f.read())
    os.waitpid(pid, 0)
print(json.dumps(results))
"""
_LIGHT_RESULTS: dict[str, list] = {}


def _loaded_by_light_probe(name: str) -> list[str]:
    if not _LIGHT_RESULTS:
        run = subprocess.run(
            [sys.executable, "-c", FORK_PER_PROBE, json.dumps(HEAVY)],
            input=json.dumps(LIGHT),
            capture_output=True,
            text=True,
            check=True,
        )
        _LIGHT_RESULTS.update(json.loads(run.stdout.strip().splitlines()[-1]))
    return _LIGHT_RESULTS[name]


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_imports_no_heavy_dependency(package):
    assert _loaded_by_light_probe(package) == []


def test_help_and_version_import_no_heavy_dependency():
    assert _loaded_by_light_probe("help") == []


def test_a_forked_probe_sees_what_a_fresh_interpreter_sees():
    """The probe server itself: a heavy import in one child shows, and does not leak into
    the next child."""
    run = subprocess.run(
        [sys.executable, "-c", FORK_PER_PROBE, json.dumps(HEAVY)],
        input=json.dumps({"a": "import numpy", "b": "import torchstore", "c": "1/0"}),
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["a"] == ["numpy"] and got["b"] == [] and "ZeroDivisionError" in got["c"]["error"]


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
    from torchstore.data.replay.ring import StoreReplay

    assert torchstore.StoreReplay is StoreReplay and "StoreReplay" in torchstore.__all__
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        torchstore.Nope  # noqa: B018
    assert not hasattr(torchstore.data, "Nope")


def test_submodules_stay_reachable_as_attributes():
    code = (
        "import torchstore\n"
        "assert torchstore.data.store.store.TrajectoryStore and torchstore.samplers.sumtree.SumTree"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: verbs that answer from h5py, numpy, xxhash (and pyarrow for a LeRobot folder): each
#: probe runs the command in-process and checks its exit status
TORCH_FREE_VERBS = {
    "info STORE": (["info", "{store}"], 0),
    "info STORE --json": (["info", "{store}", "--json"], 0),
    "verify STORE": (["verify", "{store}", "--no-progress"], 0),
    "verify CAMERA STORE (PNG packets)": (["verify", "{camera}", "--no-progress"], 0),
    "info LEROBOT": (["info", "{lerobot}"], 0),
    "verify LEROBOT": (["verify", "{lerobot}"], 0),
    "verify EMPTY": (["verify", "{empty}"], 1),
    "import ROBOMIMIC (sniffed, DEST exists)": (["import", "{robomimic}", "{store}"], 1),
    "import JUNK (no known format)": (["import", "{junk}", "{out}"], 1),
    "encode --help": (["encode", "--help"], 0),
}
VERB_PROBE = (
    "import contextlib, io\nfrom torchstore.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
    "    status = main({argv!r})\n"
    "assert status == {status}, status\n"
)


def write_camera_store(path) -> None:
    """A store with one PNG camera column, written in a process of its own (the probes
    must start without torch; writing needs it)."""
    code = (
        "import sys, numpy as np, torch\n"
        "from torchstore.data import ColumnSpec, TrajectoryStoreWriter\n"
        "spec = ColumnSpec('cam', torch.uint8, (16, 16, 3), codec='png')\n"
        "with TrajectoryStoreWriter(sys.argv[1], [spec]) as w:\n"
        "    w.add_episode({'cam': np.zeros((5, 16, 16, 3), np.uint8)})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)


@pytest.fixture(scope="module")
def verb_results(tmp_path_factory):
    import h5py
    import numpy as np

    from tests.lerobot.test_lerobot_roundtrip import record
    from torchstore.demo import write_demo_store

    tmp = tmp_path_factory.mktemp("verbs")
    paths = {
        "store": write_demo_store(tmp / "demo.h5", episodes=3, steps=20),
        "camera": tmp / "camera.h5",
        "lerobot": tmp / "lerobot",
        "empty": tmp / "empty",
        "robomimic": tmp / "lift.hdf5",
        "junk": tmp / "notes.txt",
        "out": tmp / "out.h5",
    }
    record(paths["lerobot"], (5, 7))
    paths["empty"].mkdir()
    write_camera_store(paths["camera"])
    with h5py.File(paths["robomimic"], "w") as f:
        f["data/demo_0/actions"] = np.zeros((4, 2), np.float32)
        f["data/demo_0/obs/pos"] = np.zeros((4, 3), np.float32)
        f["data/demo_0"].attrs["num_samples"] = 4
    paths["junk"].write_text("not a dataset\n")
    probes = {
        name: VERB_PROBE.format(
            argv=[a.format(**{k: str(v) for k, v in paths.items()}) for a in argv], status=status
        )
        for name, (argv, status) in TORCH_FREE_VERBS.items()
    }
    run = subprocess.run(
        [sys.executable, "-c", FORK_PER_PROBE, json.dumps(["torch", "tensordict", "torchrl"])],
        input=json.dumps(probes),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("verb", sorted(TORCH_FREE_VERBS))
def test_verbs_that_read_facts_import_no_torch(verb, verb_results):
    """``info``, ``verify``, an import refused after sniffing and ``--help`` read manifests,
    checksums and footers without torch (seconds of start-up on a small machine)."""
    assert verb_results[verb] == [], verb_results[verb]
