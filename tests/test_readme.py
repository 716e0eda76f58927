"""The README's and docs/'s examples run as written, each on its own, as a new user runs them.

Every ```python block is saved to a file in a fresh temporary folder and run there as
``__main__`` with fresh globals: a block may use only what it imports and builds itself,
never a name from an earlier block, a file of the repository, or the repository as working
directory. The README's quickstart runs in a fresh interpreter of its own; the other blocks
share one interpreter (started outside the repository, without PYTHONPATH), which spares
each of them the import of torch, torchrl and Lightning.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, language: str = "python") -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced block of ``language`` in ``path``."""
    text = path.read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == language
    ]


PYTHON_BLOCKS = [
    pytest.param(path, line, code, id=f"{path.relative_to(ROOT)}:{line}")
    for path in DOCS
    for line, code in blocks(path)
]
#: the README's first example, run as a new user runs it: by a fresh interpreter
QUICKSTART = PYTHON_BLOCKS[:1]
#: every other block, in one interpreter (one test worker: the run is cached per process)
SHARED_BLOCKS = [
    pytest.param(*p.values, id=p.id, marks=pytest.mark.xdist_group("doc-blocks"))
    for p in PYTHON_BLOCKS[1:]
]
#: runs each job's block from its own folder as ``python NAME`` would, in this interpreter;
#: prints ``block result [id, traceback or null]`` after each; each block's output goes to
#: its folder
RUNNER = r"""
import gc, json, os, runpy, sys, traceback
from pathlib import Path

environ = dict(os.environ)
for job in json.loads(sys.stdin.read()):
    folder = Path(job["folder"])
    (folder / job["name"]).write_text(job["code"])
    log = open(folder / "output.txt", "w")
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
    os.chdir(folder)
    sys.argv, sys.path[0], error = [job["name"]], str(folder), None
    try:
        runpy.run_path(job["name"], run_name="__main__")
    except SystemExit as exc:
        error = None if exc.code in (None, 0) else f"SystemExit({exc.code!r})"
    except BaseException:
        error = traceback.format_exc()
    gc.collect()
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    os.close(saved[0]), os.close(saved[1]), log.close()
    os.environ.clear(), os.environ.update(environ)
    print("block result", json.dumps([job["id"], error]), flush=True)
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}


def test_every_doc_has_its_blocks_collected():
    assert len(DOCS) >= 3, "docs/design.md and docs/integrity.md are missing"
    assert blocks(README) and all(blocks(path) for path in DOCS if path.parent.name == "docs"), (
        "a docs page without a runnable example"
    )
    assert QUICKSTART[0].values[0] == README


@pytest.mark.parametrize(("path", "line", "code"), QUICKSTART)
def test_python_block_runs_on_its_own(path, line, code, tmp_path):
    script = tmp_path / f"{path.stem}_line{line}.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{path.name} block at line {line} failed on its own in a fresh folder:\n"
        + proc.stdout[-2000:]
        + proc.stderr[-4000:]
    )


_SHARED_RUN: dict[str, dict] = {}


@pytest.fixture
def shared_run(request, tmp_path_factory) -> dict[str, dict]:
    """``{id: {"error": traceback or None, "output": path}}`` for the selected shared blocks,
    all run by one interpreter on first use."""
    if not _SHARED_RUN:
        root = tmp_path_factory.mktemp("blocks")
        selected = {
            item.callspec.id
            for item in request.session.items
            if item.originalname == "test_python_block_runs_in_a_shared_interpreter"
        }
        jobs = []
        for i, p in enumerate(p for p in SHARED_BLOCKS if p.id in selected):
            path, line, code = p.values
            folder = root / f"block{i}"
            folder.mkdir()
            name = f"{path.stem}_line{line}.py"
            jobs.append({"id": p.id, "folder": str(folder), "name": name, "code": code})
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=json.dumps(jobs),
            cwd=root,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        errors = dict(
            json.loads(line.removeprefix("block result "))
            for line in proc.stdout.splitlines()
            if line.startswith("block result ")
        )
        died = f"the shared interpreter ended ({proc.returncode}) in this block:\n{proc.stderr}"
        for job in jobs:
            output = Path(job["folder"]) / "output.txt"
            error = errors.get(job["id"], died)
            _SHARED_RUN[job["id"]] = {"error": error, "output": output}
            if job["id"] not in errors:  # the blocks after it did not run
                died = f"not run: the shared interpreter ended in {job['id']}"
    return _SHARED_RUN


@pytest.mark.parametrize(("path", "line", "code"), SHARED_BLOCKS)
def test_python_block_runs_in_a_shared_interpreter(path, line, code, shared_run, request):
    result = shared_run[request.node.callspec.id]
    output = result["output"]
    assert result["error"] is None, (
        f"{path.name} block at line {line} failed in a fresh folder with fresh globals:\n"
        + (output.read_text()[-4000:] if output.exists() else "")
        + result["error"][-4000:]
    )


def test_docs_link_only_to_files_in_the_repository():
    """Relative links resolve inside the repository; nothing points at files a user lacks."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    problems = []
    for path in DOCS:
        text = path.read_text()
        for target in link.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                problems.append(f"{path.name}: link to {target}")
        for word in ("../shared", "shared/specs", "DESIGN.md"):
            if word in text:
                problems.append(f"{path.name}: mentions {word}")
    assert not problems, "\n".join(problems)


def test_readme_links_the_docs():
    text = README.read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, f"README does not link docs/{page.name}"


def test_repository_names_no_notes_outside_it():
    """Code, tests and docs point at what a user has, not at notes outside the repository."""
    notes = re.compile(r"\.\./shared|shared/(specs|DESIGN|STYLE)")
    files = [
        p
        for folder in ("torchstore", "tests", "benchmarks", "recipes", "configs", "docs")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".md", ".yaml", ".sh", ".cfg", ".toml") and p != Path(__file__)
    ] + [README, ROOT / "CHANGELOG.md", ROOT / "setup.cfg"]
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if notes.search(line) or (ROOT / "torchstore" in p.parents and "shared/" in line)
    ]
    assert not found, found


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[dev]" && python -m pytest'
    assert test_command in text and test_command in ci
