"""The README's and docs/'s examples run as written, each on its own, as a new user runs them.

Every ```python block is saved to a file in a fresh temporary folder and run by a fresh
interpreter there: a block may use only what it imports and builds itself, never a name
from an earlier block, a file of the repository, or the repository as working directory.
"""

from __future__ import annotations

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


def test_every_doc_has_its_blocks_collected():
    assert len(DOCS) >= 3, "docs/design.md and docs/integrity.md are missing"
    assert blocks(README) and all(blocks(path) for path in DOCS if path.parent.name == "docs"), (
        "a docs page without a runnable example"
    )


@pytest.mark.parametrize(("path", "line", "code"), PYTHON_BLOCKS)
def test_python_block_runs_on_its_own(path, line, code, tmp_path):
    script = tmp_path / f"{path.stem}_line{line}.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{path.name} block at line {line} failed on its own in a fresh folder:\n"
        + proc.stdout[-2000:]
        + proc.stderr[-4000:]
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
