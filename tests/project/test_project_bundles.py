"""Project bundles: a real recipe run pushed, pulled on a "fresh machine" and rolled out the same;
hostile projects and hostile bundles refused with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchstore.cli import main
from torchstore.errors import DestinationExistsError, IntegrityError, StoreFormatError
from torchstore.project import (
    MANIFEST_NAME,
    ProjectError,
    ProjectManifest,
    pull_project,
    push_project,
)
from torchstore.remote import RemoteCatalog, push

REPO = Path(__file__).resolve().parents[2]


def _run(server, argv, cwd, env, timeout=600):
    """``argv`` (a recipe) as its own process in ``cwd`` with ``env``, forked from the
    preloaded interpreter; returns what it printed."""
    proc = server.run(argv, cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _cli(argv, cwd, env, monkeypatch, capsys) -> str:
    """``torchstore ARGV`` in this process (the CLI spares a torch import per call), with
    ``cwd`` and ``env`` as a shell would give them; returns what it printed."""
    with monkeypatch.context() as m:
        m.chdir(cwd)
        for key, value in env.items():
            if os.environ.get(key) != value:
                m.setenv(key, value)
        for key in set(os.environ) - set(env):
            m.delenv(key)
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-3000:]
    return out


def _env(cache: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(TORCHSTORE_CACHE=str(cache), TORCHSTORE_DISABLE_PROGRESS="1", **extra)
    return env


def _learned(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("learned"))


def _new_project(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copytree(REPO / "configs", root / "configs")
    shutil.copytree(
        REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


@pytest.fixture
def reach_location(tmp_path, file_server):
    """The demo data published as dataset ``reach-demo`` at an HTTP location."""
    from torchstore.tasks import write_demo_data

    (tmp_path / "src" / "reach-demo").mkdir(parents=True)
    write_demo_data(tmp_path / "src" / "reach-demo" / "reach_demo.h5")
    entry = push(tmp_path / "src" / "reach-demo", file_server.url, "reach-demo", progress=False)
    return file_server.url, entry


def test_a_recipe_run_bundled_pulled_elsewhere_rolls_out_and_retrains_the_same(
    tmp_path, reach_location, monkeypatch, capsys, preloaded
):
    url, dataset = reach_location
    here = tmp_path / "machine-a"
    env_a = _env(here / "cache", TORCHSTORE_LOCATIONS=url)
    project = _new_project(here / "project")
    store_path = _cli(["datasets", "reach-demo", "--path"], here, env_a, monkeypatch, capsys)
    store_path = store_path.strip()
    trained = _run(
        preloaded,
        [
            sys.executable,
            "recipes/bc.py",
            "trainer.max_steps=20",
            "eval.episodes=3",
            f"store.path={store_path}",
        ],
        project,
        env_a,
    )
    (run,) = list((project / "outputs" / "bc").iterdir())
    run_rel = run.relative_to(project).as_posix()
    rolled = _run(preloaded, [sys.executable, "recipes/rollout.py", run_rel], project, env_a)
    assert _learned(rolled) == _learned(trained)
    (project / "recipes" / "__pycache__").mkdir(exist_ok=True)
    (project / "recipes" / "__pycache__" / "bc.cpython-311.pyc").write_bytes(b"\0" * 16)
    pushed = _cli(
        ["project", "push", str(project), url, "reach-bc"], here, env_a, monkeypatch, capsys
    )
    assert f"dataset reach-demo@{dataset.revision[:12]}" in pushed and run_rel in pushed
    shutil.rmtree(here)  # the first machine is gone: its project and its cache

    there = tmp_path / "machine-b"
    there.mkdir()
    env_b = _env(there / "cache")  # no locations configured: the bundle pins them
    pulled = _cli(["project", "pull", url, "reach-bc", "proj"], there, env_b, monkeypatch, capsys)
    fresh = there / "proj"
    manifest = ProjectManifest.parse((fresh / MANIFEST_NAME).read_bytes())
    (ds,) = manifest.datasets
    assert (ds.name, ds.location, ds.revision) == ("reach-demo", url, dataset.revision)
    (recorded,) = manifest.runs
    assert recorded.path == run_rel and recorded.recipe == "bc"
    assert recorded.command == (
        "python",
        "recipes/bc.py",
        "trainer.max_steps=20",
        "eval.episodes=3",
        "store.path=datasets/reach-demo/reach_demo.h5",
    )
    assert not list(fresh.rglob("__pycache__"))
    assert (fresh / "datasets" / "reach-demo" / "reach_demo.h5").is_file()
    assert "reproduce (in proj): python recipes/bc.py" in pulled
    again = _run(preloaded, [sys.executable, "recipes/rollout.py", run_rel], fresh, env_b)
    assert again == rolled  # the same printed result, to the digit
    retrained = _run(preloaded, [sys.executable, *recorded.command[1:]], fresh, env_b)
    assert _learned(retrained) == _learned(trained)


def _tiny_project(root: Path) -> Path:
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "train.yaml").write_text("seed: 0\n")
    (root / "recipes").mkdir()
    (root / "recipes" / "train.py").write_text("print('training')\n")
    run = root / "outputs" / "train" / "2026-01-01_00-00-00"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    _save_weights(run / "policy.safetensors")
    return root


def _save_weights(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(path))


@pytest.mark.parametrize(
    ("bad_file", "words"),
    [
        ("outputs/train/2026-01-01_00-00-00/epoch=3.ckpt", "pickle-based"),
        ("outputs/train/2026-01-01_00-00-00/policy.pt", "pickle-based"),
        ("configs/data.h5", "datasets travel by name"),
    ],
)
def test_pickles_and_stores_are_never_bundled(tmp_path, bad_file, words):
    project = _tiny_project(tmp_path / "p")
    (project / bad_file).write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ProjectError, match=words):
        push_project(project, tmp_path / "loc", "p", progress=False)
    assert not (tmp_path / "loc").exists()  # nothing published


def test_a_runs_resume_checkpoint_is_left_out_not_refused(tmp_path):
    """Recipes keep last.ckpt to resume from; the bundle carries the run's safetensors."""
    project = _tiny_project(tmp_path / "p")
    (project / "outputs/train/2026-01-01_00-00-00/last.ckpt").write_bytes(b"\x80\x04K\x01.")
    done = push_project(project, tmp_path / "loc", "p", progress=False)
    left = dict(done.listing.left_out)
    assert "resume checkpoint" in left["outputs/train/2026-01-01_00-00-00/last.ckpt"]
    assert not any(rel.endswith(".ckpt") for rel, _ in done.listing.bundled)


def test_a_broken_safetensors_file_is_refused(tmp_path):
    project = _tiny_project(tmp_path / "p")
    weights = project / "outputs" / "train" / "2026-01-01_00-00-00" / "policy.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    with pytest.raises(ValueError, match="incomplete safetensors"):
        push_project(project, tmp_path / "loc", "p", progress=False)
    # complete, but a tensor's bytes do not fit its dtype and shape
    _save_weights(weights)
    data = weights.read_bytes()
    weights.write_bytes(data.replace(b'"shape":[2,3]', b'"shape":[3,2]').replace(b"F32", b"F16"))
    with pytest.raises(StoreFormatError, match="needs"):
        push_project(project, tmp_path / "loc", "p", progress=False)


def test_a_symlink_in_a_project_is_refused(tmp_path):
    project = _tiny_project(tmp_path / "p")
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    (project / "configs" / "link.yaml").symlink_to(secret)
    with pytest.raises(ProjectError, match="symlink"):
        push_project(project, tmp_path / "loc", "p", progress=False)


def test_a_project_without_configs_or_recipes_is_refused(tmp_path):
    (tmp_path / "p" / "configs").mkdir(parents=True)
    with pytest.raises(ProjectError, match="recipes/"):
        push_project(tmp_path / "p", tmp_path / "loc", "p", progress=False)


def test_round_trip_with_a_named_dataset_and_revisions(tmp_path, monkeypatch):
    loc = tmp_path / "loc"
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.json").write_text("{}")
    ds = push(tmp_path / "ds", loc, "ds", progress=False)
    project = _tiny_project(tmp_path / "p")
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(loc))
    done = push_project(project, loc, "proj", datasets=["ds"], progress=False)
    assert [d.pinned for d in done.manifest.datasets] == [f"ds@{ds.revision}"]
    assert done.manifest.runs[0].command is None  # no .hydra/overrides.yaml to say it
    # the same project again: up to date; changed: needs replace, old revision pullable
    assert push_project(
        project, loc, "proj", datasets=[f"ds@{ds.revision}"], progress=False
    ).up_to_date
    (project / "configs" / "train.yaml").write_text("seed: 1\n")
    with pytest.raises(FileExistsError, match="--replace"):
        push_project(project, loc, "proj", datasets=[f"ds@{ds.revision}"], progress=False)
    push_project(project, loc, "proj", datasets=[f"ds@{ds.revision}"], replace=True, progress=False)
    old = pull_project(loc, f"proj@{done.entry.revision[:12]}", tmp_path / "old", progress=False)
    new = pull_project(loc, "proj", tmp_path / "new", progress=False)
    assert (old.path / "configs" / "train.yaml").read_text() == "seed: 0\n"
    assert (new.path / "configs" / "train.yaml").read_text() == "seed: 1\n"
    assert (new.path / "datasets" / "ds" / "notes.json").read_text() == "{}"
    assert RemoteCatalog(loc)["proj"].kind == "assets"
    (tmp_path / "ds" / "notes.json").write_text('{"v": 2}')
    ds2 = push(tmp_path / "ds", loc, "ds", replace=True, progress=False)
    assert (new.path / "datasets" / "ds" / "notes.json").read_text() == "{}"  # pinned, kept
    with pytest.raises(ProjectError, match="twice"):
        push_project(
            project,
            loc,
            "proj",
            datasets=[f"ds@{ds.revision}", f"ds@{ds2.revision}"],
            progress=False,
        )


def _publish_bundle(tmp_path: Path, manifest: dict | None, extra: dict[str, bytes]) -> Path:
    """A hostile bundle, published with the plain entry push (which does not check projects)."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    if manifest is not None:
        (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    for rel, data in extra.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    loc = tmp_path / "loc"
    push(folder, loc, "proj", kind="assets", progress=False)
    return loc


_HEADER = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
#: ends where its header says, but F32 x [2] needs 8 bytes, not 4
BAD_WEIGHTS = len(_HEADER).to_bytes(8, "little") + _HEADER + b"\0" * 4
GOOD = {"format": "torchstore-project", "version": 1, "name": "proj", "datasets": [], "runs": []}


@pytest.mark.parametrize(
    ("manifest", "extra", "error", "words"),
    [
        (None, {"configs/a.yaml": b"a: 1\n"}, ProjectError, "not a project bundle"),
        (GOOD, {"outputs/r/model.pkl": b"\x80\x04."}, ProjectError, "pickle-based"),
        (GOOD, {"datasets/x/store.json": b"{}"}, ProjectError, "datasets travel by name"),
        (GOOD, {"outputs/r/w.safetensors": BAD_WEIGHTS}, StoreFormatError, "needs 8 bytes"),
        ({**GOOD, "version": 99}, {}, StoreFormatError, "upgrade torchstore"),
        ({**GOOD, "format": "other"}, {}, StoreFormatError, "format"),
        (
            {**GOOD, "runs": [{"path": "../../etc", "recipe": None, "command": None}]},
            {},
            ValueError,
            "etc",
        ),
        (
            {**GOOD, "runs": [{"path": "outputs/gone", "recipe": None, "command": None}]},
            {},
            StoreFormatError,
            "lacks",
        ),
        (
            {**GOOD, "datasets": [{"name": "d", "location": "/x", "revision": "HEAD; rm -rf"}]},
            {},
            StoreFormatError,
            "hex",
        ),
        (
            {**GOOD, "datasets": [{"name": "../d", "location": "/x", "revision": "abcdef0"}]},
            {},
            ValueError,
            "name",
        ),
        (
            {
                **GOOD,
                "datasets": [{"name": "d", "location": "http://u:p@h/x", "revision": "abcdef0"}],
            },
            {},
            StoreFormatError,
            "credentials",
        ),
    ],
)
def test_hostile_bundles_are_refused_and_nothing_is_written(
    tmp_path, manifest, extra, error, words
):
    loc = _publish_bundle(tmp_path, manifest, extra)
    with pytest.raises(error, match=words):
        pull_project(loc, "proj", tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dest")]


def test_tampered_bytes_at_the_location_are_never_placed(tmp_path):
    project = _tiny_project(tmp_path / "p")
    loc = tmp_path / "loc"
    push_project(project, loc, "proj", progress=False)
    target = loc / "proj" / "configs" / "train.yaml"
    target.write_text("seed: 666\n")  # same size, other bytes
    with pytest.raises(IntegrityError):
        pull_project(loc, "proj", tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()


def test_an_existing_destination_is_kept(tmp_path, capsys):
    project = _tiny_project(tmp_path / "p")
    loc = tmp_path / "loc"
    push_project(project, loc, "proj", progress=False)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine.txt").write_text("mine")
    with pytest.raises(DestinationExistsError):
        pull_project(loc, "proj", dest, progress=False)
    assert main(["project", "pull", str(loc), "proj", str(dest), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not an empty folder" in err
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["project", "pull", str(loc), "proj", str(empty), "--no-progress"]) == 0
    assert (empty / "configs" / "train.yaml").read_text() == "seed: 0\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert empty.stat().st_mode & 0o777 == 0o777 & ~umask


def test_cli_push_refusal_is_one_line(tmp_path, capsys):
    project = _tiny_project(tmp_path / "p")
    (project / "outputs" / "model.pth").write_bytes(b"\x80\x04.")
    code = main(["project", "push", str(project), str(tmp_path / "loc"), "p", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "torchstore project: " in err and "model.pth" in err and "pickle-based" in err
    assert not (tmp_path / "loc").exists()


def test_ctrl_c_during_a_project_pull_leaves_no_destination_and_the_next_pull_finishes(
    tmp_path, file_server, monkeypatch
):
    import signal
    import time

    (tmp_path / "ds").mkdir()
    payload = os.urandom(4000)
    (tmp_path / "ds" / "a.bin").write_bytes(payload)
    ds = push(tmp_path / "ds", file_server.url, "ds", progress=False)
    project = _tiny_project(tmp_path / "p")
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", file_server.url)
    push_project(project, file_server.url, "proj", datasets=[f"ds@{ds.revision}"], progress=False)
    env = _env(tmp_path / "fresh-cache", NO_PROXY="127.0.0.1,localhost")
    env.pop("TORCHSTORE_LOCATIONS", None)
    argv = [
        sys.executable,
        "-m",
        "torchstore.cli",
        "project",
        "pull",
        file_server.url,
        "proj",
        str(tmp_path / "dest"),
    ]
    file_server.drip_s["ds/a.bin"] = 0.01  # 40 s for the dataset's file: mid-transfer
    file_server.body_bytes.clear()  # the push pinned ds by pulling it here: count afresh
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 180
    while not file_server.body_bytes.get("ds/a.bin"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
    assert err.strip().startswith("interrupted; nothing was placed at the destination")
    assert not (tmp_path / "dest").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dest")]
    file_server.drip_s.clear()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "dest" / "datasets" / "ds" / "a.bin").read_bytes() == payload


def test_a_run_on_a_store_imported_from_lerobot_names_the_lerobot_dataset(tmp_path, monkeypatch):
    import numpy as np

    import torchstore
    from torchstore.data import TrajectoryStore
    from torchstore.lerobot import LeRobotWriter

    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    with LeRobotWriter(tmp_path / "lr", fps=10, features=features) as w:
        for episode in range(2):
            w.add_episode(
                {
                    "observation.state": np.full((5, 3), episode, np.float32),
                    "action": np.zeros((5, 2), np.float32),
                },
                task="reach",
            )
    loc = tmp_path / "loc"
    lr = push(tmp_path / "lr", loc, "lr", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(loc))
    with torchstore.load("lr", progress=False) as store:
        used = store.path  # <cache>/<location>/.stores/lr-<revision>.h5
    project = _tiny_project(tmp_path / "p")
    (project / "outputs" / "train" / "2026-01-01_00-00-00" / "config.yaml").write_text(
        f"store:\n  path: {used}\n"
    )
    done = push_project(project, loc, "proj", progress=False)
    assert [d.pinned for d in done.manifest.datasets] == [f"lr@{lr.revision}"]
    monkeypatch.setenv("TORCHSTORE_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.delenv("TORCHSTORE_LOCATIONS")
    pulled = pull_project(loc, "proj", tmp_path / "dest", progress=False)
    config = (pulled.path / "outputs" / "train" / "2026-01-01_00-00-00" / "config.yaml").read_text()
    assert config == "store:\n  path: datasets/lr.h5\n"
    assert (pulled.path / "datasets" / "lr" / "meta" / "info.json").is_file()
    with TrajectoryStore(pulled.path / "datasets" / "lr.h5") as store:
        assert store.num_episodes == 2 and store.num_rows == 10
