"""The documentation site builds with ``mkdocs build --strict``, offline, with every page.

Skipped (with the reason) where mkdocs, mkdocs-material or mkdocstrings is not installed
(``pip install -e ".[docs]"``; the ``dev`` extra has them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _missing() -> list[str]:
    import importlib.util

    out = []
    for module, package in (
        ("mkdocs", "mkdocs"),
        ("material", "mkdocs-material"),
        ("mkdocstrings", "mkdocstrings"),
        ("mkdocstrings_handlers.python", "mkdocstrings[python]"),
    ):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(package)
    return out


def _nav_pages(text: str) -> set[str]:
    return set(re.findall(r":\s*([\w./-]+\.md)\s*$", text, re.M))


def test_every_docs_page_is_in_the_nav():
    nav = _nav_pages((ROOT / "mkdocs.yml").read_text())
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == nav, (
        f"pages not in the nav: {pages - nav}; nav entries without a page: {nav - pages}"
    )


@pytest.mark.skipif(bool(_missing()), reason=f"the docs extra is not installed: {_missing()}")
def test_the_site_builds_strict_and_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    # any request at build time goes to a closed port and fails the build
    dead = "http://127.0.0.1:9"
    env.update(
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        http_proxy=dead,
        https_proxy=dead,
        NO_PROXY="",
        no_proxy="",
        NO_MKDOCS_2_WARNING="1",
    )
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    for page in _nav_pages((ROOT / "mkdocs.yml").read_text()):
        built = site / (page[:-3] + "/index.html" if page != "index.md" else "index.html")
        assert built.is_file(), f"{page} was not built"
    api = (site / "api" / "index.html").read_text()
    for rendered in ("TrajectoryStoreWriter", "push_project", "load", "IntegrityError"):
        assert rendered in api, f"{rendered} is missing from the API reference"
    assert "Open dataset" in api  # a docstring's own words, not only the name
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()
