"""What ``torchstore project push`` bundles and leaves out, as a user sees it: the listing it
prints, weights outside ``outputs/`` round-tripped, and ``--dry-run`` sending nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from torchstore.cli import main
from torchstore.project import push_project


def _cli(*argv: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", *argv],
        cwd=cwd,
        env=env,  # the conftest's own cache, no locations, progress off
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _save_weights(path: Path, value: float = 0.0) -> None:
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((2, 3), value)}, str(path))


def _project(root: Path) -> Path:
    """A project as a user has it: weights beside configs/, and plenty that is not bundled."""
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "train.yaml").write_text("seed: 0\n")
    (root / "recipes" / "__pycache__").mkdir(parents=True)
    (root / "recipes" / "train.py").write_text("print('training')\n")
    (root / "recipes" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0" * 16)
    run = root / "outputs" / "train" / "2026-01-01_00-00-00"
    (run / ".hydra").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    _save_weights(run / "policy.safetensors")
    _save_weights(root / "weights" / "policy.safetensors", 1.5)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "data").mkdir()
    (root / "data" / "big.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    (root / "notes").mkdir()
    for i in range(40):  # many files: one line for the folder, not forty
        (root / "notes" / f"day{i:02d}.md").write_text(f"notes {i}\n")
    (root / "README.md").write_text("# my project\n")
    return root


def _listing(stdout: str) -> list[str]:
    """The bundle/left-out lines, sizes blanked (they follow the safetensors header layout)."""
    lines = [line for line in stdout.splitlines() if line.startswith(("bundle: ", "left out: "))]
    return [re.sub(r"\d+(\.\d)? (B|KiB|MiB)\)", "SIZE)", line) for line in lines]


def test_push_lists_what_it_bundles_and_leaves_out_and_pull_brings_the_weights_back(tmp_path):
    project = _project(tmp_path / "proj")
    _save_weights(project / "checkpoints" / "best" / "policy.safetensors", 2.0)
    loc = str(tmp_path / "loc")
    out = _cli("project", "push", str(project), loc, "proj", cwd=tmp_path).stdout
    assert _listing(out) == [
        "bundle: configs/train.yaml (SIZE)",
        "bundle: recipes/train.py (SIZE)",
        "bundle: outputs/ (2 files, SIZE)",
        "bundle: checkpoints/best/policy.safetensors (SIZE)",
        "bundle: weights/policy.safetensors (SIZE)",
        "left out: .git/ (version control)",
        "left out: README.md (only configs/, recipes/, outputs/ and *.safetensors files are "
        "bundled)",
        "left out: data/big.h5 (stores travel as dataset entries: torchstore push DIR LOCATION "
        "NAME, then --dataset NAME)",
        "left out: notes/ (40 files; only configs/, recipes/, outputs/ and *.safetensors files "
        "are bundled)",
        "left out: outputs/train/2026-01-01_00-00-00/.hydra/ (Hydra's record: the manifest "
        "keeps the run's command)",
        "left out: recipes/__pycache__/ (interpreter caches, rebuilt where the recipes run)",
    ]
    assert "project proj pushed at" in out and "run outputs/train/2026-01-01_00-00-00" in out
    assert len(out.splitlines()) < 15  # 40 notes and all: short

    _cli("project", "pull", loc, "proj", "back", cwd=tmp_path)
    back = tmp_path / "back"
    for rel in ("weights/policy.safetensors", "checkpoints/best/policy.safetensors"):
        assert (back / rel).read_bytes() == (project / rel).read_bytes(), rel
    left = [".git", "notes", "data", "README.md", "recipes/__pycache__"]
    assert not [rel for rel in left if (back / rel).exists()]


def test_a_broken_weights_file_outside_outputs_refuses_the_push_in_one_line(tmp_path, capsys):
    project = _project(tmp_path / "proj")
    weights = project / "weights" / "policy.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    loc = tmp_path / "loc"
    assert main(["project", "push", str(project), str(loc), "proj", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "weights/policy.safetensors" in err
    assert not loc.exists()


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]] | None:
    if not root.exists():
        return None
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_dry_run_prints_the_same_list_and_leaves_the_location_untouched(tmp_path):
    project = _project(tmp_path / "proj")
    loc = tmp_path / "loc"
    argv = ("project", "push", str(project), str(loc), "proj", "--dry-run")
    dry = _cli(*argv, cwd=tmp_path).stdout
    assert not loc.exists()  # not even created
    assert "dry run: nothing pushed" in dry and "run outputs/train/2026-01-01_00-00-00" in dry
    done = push_project(project, loc, "proj", progress=False)
    assert _listing(dry) == _listing("\n".join(done.listing.lines()))
    assert "bundle: weights/policy.safetensors (SIZE)" in _listing(dry)

    (project / "configs" / "train.yaml").write_text("seed: 1\n")  # a push would send this
    before = _snapshot(loc)
    again = _cli(*argv, "--dataset", "some-dataset@abcdef0", cwd=tmp_path).stdout
    assert _snapshot(loc) == before  # nothing written at the location
    assert "dataset some-dataset@abcdef0 (--dataset: resolved and pinned by the push)" in again
    assert not push_project(project, loc, "proj", replace=True, progress=False).up_to_date
