"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands assume the repo root: its data/ is linked in
    (tmp_path / "data").symlink_to(README.parent / "data")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    namespace: dict = {}  # one namespace, as a reader running the blocks in order would
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[dev]" && python -m pytest'
    assert test_command in text and test_command in ci
