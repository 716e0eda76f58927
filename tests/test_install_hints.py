"""Every install hint a user reads (error messages, docstrings, README and docs) names an
extra the one way it installs: ``pip install -e ".[extra]"`` from a checkout of this
repository (the ``torchstore`` on PyPI is another project), and names an extra that holds
what is missing."""

from __future__ import annotations

import ast
import configparser
import importlib
import re
import sys
from pathlib import Path

import pytest

from torchstore.extras import EXTRAS, install_hint

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torchstore"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the one form of an extra in a hint: pip install -e ".[name]"
ONE_FORM = re.compile(r'-e "\.\[(\w+)\]"')
PIP = re.compile(r"pip install\b([^`\n]*)")


def _extras() -> dict[str, set[str]]:
    """setup.cfg's extras: name -> the distributions it installs (``%(train)s`` expanded)."""
    cfg = configparser.ConfigParser(interpolation=configparser.BasicInterpolation())
    cfg.read(ROOT / "setup.cfg")
    section = cfg["options.extras_require"]
    return {
        name: {
            re.split(r"[\[<>=!~ ;]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in section[name].splitlines()
            if line.strip() and not line.strip().startswith("#")
        }
        for name in section
    }


def _texts() -> list[tuple[str, str]]:
    """Every package module and doc page, but the helper's own module (its output is
    checked by running it)."""
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "extras.py"] + DOCS
    return [(str(path.relative_to(ROOT)), path.read_text()) for path in files]


def test_the_helper_knows_every_extra_setup_cfg_declares():
    assert set(EXTRAS) == set(_extras())
    with pytest.raises(ValueError, match="no extra 'vidoe'"):
        install_hint("vidoe")


def test_no_hint_names_the_pypi_project():
    found = [
        f"{where}: {m.group(0)}"
        for where, text in _texts()
        for m in re.finditer(r"torchstore\[\w*\]|pip install [\"']?torchstore\b", text)
    ]
    assert not found, "\n".join(found)


def test_every_pip_install_of_an_extra_has_the_one_form():
    problems = []
    for where, text in _texts():
        for match in PIP.finditer(text):
            command = match.group(1)
            named = ONE_FORM.findall(command)
            if command.count("[") != len(named):
                problems.append(f"{where}: pip install{command}")
            problems += [f"{where}: no extra {n!r} ({command})" for n in named if n not in EXTRAS]
    assert not problems, "\n".join(problems)


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(id(value))
    return out


def test_messages_build_their_extra_hint_with_the_helper():
    """A message names an extra only through install_hint, so no two can drift apart."""
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "extras.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and re.search(r"\.\[\w+\]|torchstore\[", node.value)
            ):
                written.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not written, "\n".join(written)


#: (module, function, the module it imports, the distribution that provides it)
REQUIREMENTS = [
    ("torchstore.io.frames.video_container", "require_av", "av", "av"),
    ("torchstore.io.remote.hub", "require_huggingface_hub", "huggingface_hub", "huggingface-hub"),
    ("torchstore.io.records.parquet", "require_pyarrow", "pyarrow", "pyarrow"),
    ("torchstore.formats.zarr_source", "require_zarr", "zarr", "zarr"),
    ("torchstore.minari.importer", "require_minari", "minari", "minari"),
    ("torchstore.remote.weights", "_require_safetensors", "safetensors", "safetensors"),
    ("torchstore.io.remote.object_store", "require_boto3", "boto3", "boto3"),
    (
        "torchstore.io.remote.object_store",
        "require_google_cloud_storage",
        "google.cloud.storage",
        "google-cloud-storage",
    ),
]


@pytest.mark.parametrize(("module", "function", "imported", "dist"), REQUIREMENTS)
def test_a_missing_package_names_extras_that_install_it(
    monkeypatch, module, function, imported, dist
):
    for name in [m for m in sys.modules if m == imported or m.startswith(imported + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, imported, None)  # import fails
    if imported == "safetensors":
        monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    require = getattr(importlib.import_module(module), function)
    with pytest.raises(ImportError) as raised:
        require()
    message = str(raised.value)
    named = re.findall(r'"\.\[(\w+)\]"', message)
    assert named and "in a checkout of the torchstore repository" in message, message
    extras = _extras()
    assert all(dist in extras[name] for name in named), (message, {n: extras[n] for n in named})
