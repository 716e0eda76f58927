"""Untrusted paths can only ever mean a file inside their folder."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.errors import UnsafePathError
from torchstore.io.paths import check_name, check_relpath, make_dirs_inside, resolve_inside


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("../evil", r"'\.\.' segments are not allowed"),
        ("data/../../evil", r"'\.\.' segments are not allowed"),
        ("/etc/passwd", "absolute paths are not allowed"),
        ("C:/Windows/x", "absolute paths are not allowed"),
        ("data\\..\\evil", "backslashes are not allowed"),
        ("data//x", "empty or '.' segments"),
        ("./x", "empty or '.' segments"),
        ("data/", "empty or '.' segments"),
        ("a\x00b", "control characters"),
        ("", "must not be empty"),
        ("a" * 2000, "at most 1024 allowed"),
        ("d/" + "x" * 300, "longer than 255 bytes"),
    ],
)
def test_hostile_relpaths_are_refused(path, match):
    with pytest.raises(UnsafePathError, match=match):
        check_relpath(path)


def test_non_string_path_is_refused():
    with pytest.raises(UnsafePathError, match="must be a string, got int"):
        check_relpath(3)


def test_clean_relpath_passes():
    assert check_relpath("data/chunk-000/file 000.parquet") == "data/chunk-000/file 000.parquet"
    assert check_relpath(".hidden/x") == ".hidden/x"


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "-x", "x" * 129, None, "a b"])
def test_bad_entry_names_are_refused(name):
    with pytest.raises(UnsafePathError, match="must be 1-128 characters"):
        check_name(name)


def test_entry_name_passes():
    assert check_name("pusht-v3.0_demo") == "pusht-v3.0_demo"


def test_symlink_on_the_way_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "data").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="passes through a symlink"):
        resolve_inside(root, "data/x.bin")
    with pytest.raises(UnsafePathError, match="passes through a symlink"):
        make_dirs_inside(root, "data/sub")
    assert list(outside.iterdir()) == []


def test_final_symlink_is_refused(tmp_path):
    (tmp_path / "target").write_text("secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "x.bin").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePathError, match="symlinks inside .* are never followed"):
        resolve_inside(root, "x.bin")


def test_symlink_to_inside_is_still_refused(tmp_path):
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real")
    with pytest.raises(UnsafePathError, match="symlink"):
        resolve_inside(root, "alias/x")


def test_make_dirs_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "data").write_text("x")
    with pytest.raises(UnsafePathError, match="needs .* to be a folder, but it is a file"):
        make_dirs_inside(tmp_path, "data/sub")


def test_make_dirs_creates_nested_folders(tmp_path):
    assert make_dirs_inside(tmp_path, "a/b/c").is_dir()
    assert make_dirs_inside(tmp_path, "a/b/c").is_dir()  # idempotent


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(["a", "b", "..", ".", "", "/", "\\", "c.d", "~", "x y", ":"]),
        min_size=1,
        max_size=8,
    )
)
def test_any_accepted_path_stays_inside(tmp_path_factory, parts):
    root = tmp_path_factory.getbasetemp() / "prop-root"
    root.mkdir(exist_ok=True)
    path = "/".join(parts) if parts[0] != "/" else "/" + "/".join(parts[1:])
    try:
        target = resolve_inside(root, path)
    except UnsafePathError:
        return
    real = os.path.realpath(target)
    assert os.path.commonpath([real, os.path.realpath(root)]) == os.path.realpath(root)
    assert real != os.path.realpath(root)
