"""docs/design.md's package diagram says what the code imports: every arrow it draws is an
import the code has, no arrow runs against one, and every name on the batch path exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"


def _diagram() -> str:
    text = DESIGN.read_text()
    match = re.search(r"^```mermaid\n(.*?)^```", text, re.S | re.M)
    assert match, "docs/design.md has no mermaid diagram"
    return match.group(1)


def _nodes(diagram: str) -> dict[str, str]:
    """node id -> the package it names (``torchstore.io``, or ``recipes``)."""
    out = {}
    for node, label in re.findall(r'(\w+)\["([^"]+)"\]', diagram):
        name = label.split("<br/>")[0]
        if name.startswith("torchstore.") or name == "recipes/":
            out[node] = name.rstrip("/")
    return out


def _package_arrows(diagram: str) -> list[tuple[str, str]]:
    arrows = []
    for line in diagram.splitlines():
        if "-->" not in line or "==>" in line:
            continue
        left, right = (side.strip() for side in line.split("-->"))
        arrows += [(left, target.strip()) for target in right.split("&")]
    return arrows


def _files(package: str) -> list[Path]:
    if package == "recipes":
        return sorted((ROOT / "recipes").glob("*.py"))
    folder = ROOT / Path(*package.split("."))
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]


def _imported(package: str) -> set[str]:
    """Every torchstore module the files of ``package`` import, at any depth of the code."""
    out = set()
    for path in _files(package):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
    return {name for name in out if name.startswith("torchstore")}


def _imports(a: str, b: str) -> bool:
    return any(name == b or name.startswith(b + ".") for name in _imported(a))


def test_every_arrow_is_an_import_and_none_runs_back_up():
    diagram = _diagram()
    nodes = _nodes(diagram)
    arrows = _package_arrows(diagram)
    assert len(arrows) >= 10, arrows
    problems = []
    for a, b in arrows:
        assert a in nodes and b in nodes, f"arrow {a} --> {b} names an undeclared node"
        src, dst = nodes[a], nodes[b]
        if not _imports(src, dst):
            problems.append(f"{src} --> {dst} is drawn, but {src} imports nothing of {dst}")
        if dst != "recipes" and src != "recipes" and _imports(dst, src):
            problems.append(f"{dst} imports {src}: the arrow {src} --> {dst} runs both ways")
    assert not problems, "\n".join(problems)


def test_the_layers_never_import_upwards():
    layers = ["torchstore.io", "torchstore.data", "torchstore.samplers", "torchstore.window"]
    for high in range(len(layers)):
        for low in range(high):
            assert not _imports(layers[low], layers[high]), f"{layers[low]} imports {layers[high]}"


def test_every_name_on_the_batch_path_exists():
    names = re.findall(r"\b((?:io|data|samplers|lightning)\.\w+(?:\.\w+)?)\b", _diagram())
    assert len(names) >= 5, names
    for dotted in names:
        parts = dotted.split(".")
        module = importlib.import_module("torchstore." + ".".join(parts[:2]))
        if len(parts) == 3:
            assert hasattr(module, parts[2]), f"torchstore.{dotted} does not exist"


IO_MEDIA = ["hdf5", "frames", "remote", "records"]


def test_each_io_medium_is_a_room_that_imports_no_other_medium():
    io_top = {path.stem for path in (ROOT / "torchstore" / "io").glob("*.py")} - {"__init__"}
    rooms = {path.name for path in (ROOT / "torchstore" / "io").iterdir() if path.is_dir()}
    assert rooms - {"__pycache__"} == set(IO_MEDIA)
    for medium in IO_MEDIA:
        package = f"torchstore.io.{medium}"
        doc = importlib.import_module(package).__doc__ or ""
        assert "must not know" in doc, f"{package} does not say what it must not know"
        for name in _imported(package):
            if not name.startswith("torchstore.io") or name.startswith(package):
                continue
            assert name.split(".")[2] in io_top, f"{package} imports {name}, another medium's"


def test_old_io_module_paths_still_import_with_a_deprecation_warning():
    import subprocess
    import sys

    # a fresh interpreter: an alias is registered in sys.modules at its first import
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from torchstore.io.frame_codec import FrameCodec\n"
        "    import torchstore.io.hdf5 as hdf5\n"
        "from torchstore.io.frames.codec import FrameCodec as New\n"
        "assert FrameCodec is New\n"
        "assert hdf5.open_for_read and hdf5.MANIFEST_ATTR\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "torchstore.io.frame_codec moved to torchstore.io.frames.codec" in out.stdout
