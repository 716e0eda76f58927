"""A hostile index.json: every trick is refused with a clear error; nothing escapes the cache."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from torchstore.errors import IntegrityError, StoreFormatError, UnsafePathError
from torchstore.remote import pull

GOOD = b"good bytes\n"


def _index(files, name="ds"):
    return {
        "format": "torchstore-index",
        "version": 1,
        "entries": [{"name": name, "kind": "dataset", "files": files}],
    }


def _file(path, data=GOOD, **over):
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **over}


def _serve(server, index, files=None):
    (server.root / "index.json").write_text(json.dumps(index))
    for rel, data in (files or {}).items():
        target = server.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _everything_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize(
    ("files", "error", "match"),
    [
        (
            [_file("../../escaped.txt")],
            UnsafePathError,
            r"'\.\./\.\./escaped.txt' must stay inside its folder",
        ),
        ([_file("a/../../escaped.txt")], UnsafePathError, r"'\.\.' segments are not allowed"),
        ([_file("/tmp/escaped.txt")], UnsafePathError, "absolute paths are not allowed"),
        ([_file("..\\escaped.txt")], UnsafePathError, "backslashes are not allowed"),
        ([_file("x"), _file("x")], StoreFormatError, "lists file 'x' twice"),
        (
            [_file("x"), _file("x/y")],
            StoreFormatError,
            "'x' is both a file and the folder of 'x/y'",
        ),
        ([_file("x", size=-1)], StoreFormatError, r"size \(-1\) must be an int"),
        ([_file("x", size="11")], StoreFormatError, r"size \('11'\) must be an int"),
        ([_file("x", sha256="abc")], StoreFormatError, "sha256 .* must be 64 lowercase hex"),
        ([{"path": "x", "size": 1}], StoreFormatError, r"lacks \['sha256'\]"),
    ],
)
def test_hostile_file_lists_are_refused(file_server, tmp_path, files, error, match):
    _serve(file_server, _index(files), {"ds/x": GOOD})
    with pytest.raises(error, match=match):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    assert (
        not (tmp_path / "escaped.txt").exists()
        and not (tmp_path / "cache" / "escaped.txt").exists()
    )
    assert [
        r for r in file_server.requests if r["path"] != "index.json"
    ] == []  # refused before any download


@pytest.mark.parametrize(
    ("index", "match"),
    [
        (_index([], name=".."), "must be 1-128 characters"),
        (_index([], name="a/b"), "must be 1-128 characters"),
        (
            {"format": "other", "version": 1, "entries": []},
            "must have format 'torchstore-index', got 'other'",
        ),
        (
            {"format": "torchstore-index", "version": 99, "entries": []},
            "has version 99; this torchstore reads up to 2: upgrade",
        ),
        ({"format": "torchstore-index", "version": 1, "entries": {}}, "entries must be a list"),
        (
            {
                **_index([_file("x")]),
                "entries": [{**_index([_file("x")])["entries"][0], "kind": "weird"}],
            },
            r"kind \('weird'\) must be one of",
        ),
        (
            {
                **_index([_file("x")]),
                "entries": [{**_index([_file("x")])["entries"][0], "revision": "0" * 64}],
            },
            "does not match its file list",
        ),
        (
            {
                **_index([_file("x")]),
                "entries": [{**_index([_file("x")])["entries"][0], "size": 5}],
            },
            "is not the sum of its file sizes",
        ),
    ],
)
def test_hostile_index_documents_are_refused(file_server, tmp_path, index, match):
    _serve(file_server, index)
    with pytest.raises((UnsafePathError, StoreFormatError), match=match):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)


def test_not_json_is_refused(file_server, tmp_path):
    (file_server.root / "index.json").write_text("{nope")
    with pytest.raises(StoreFormatError, match="index.json is not valid JSON"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)


def test_sha256_mismatch_is_refused(file_server, tmp_path):
    _serve(
        file_server,
        _index([_file("x", sha256=hashlib.sha256(b"other").hexdigest())]),
        {"ds/x": GOOD},
    )
    with pytest.raises(IntegrityError, match="'x' of 'ds' from .*: sha256 mismatch"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    assert [p for p in _everything_under(tmp_path / "cache") if p.endswith("/ds/x")] == []


def test_file_larger_than_declared_is_refused(file_server, tmp_path):
    _serve(
        file_server,
        _index([_file("x")]),
        {"ds/x": GOOD + b"and a payload the index never mentioned" * 100},
    )
    with pytest.raises(
        IntegrityError,
        match="/data/ds/x: the server has 3911 bytes, larger than the 11 bytes declared",
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    assert [p for p in _everything_under(tmp_path / "cache") if p.endswith("/ds/x")] == []


def test_body_longer_than_its_content_length_is_cut_at_the_declared_size(file_server, tmp_path):
    # a server whose Content-Length matches the index but whose bytes do not: sha256 catches it
    _serve(file_server, _index([_file("x")]))
    file_server.serve_instead["ds/x"] = b"BAD bytes\n!"
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)


def test_symlink_planted_in_the_cache_is_never_followed(file_server, tmp_path):
    _serve(file_server, _index([_file("sub/x")]), {"ds/sub/x": GOOD})
    outside = tmp_path / "outside"
    outside.mkdir()
    pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    entry_dir = next(p for p in (tmp_path / "cache").iterdir()) / "ds"
    (entry_dir / "sub" / "x").unlink()
    (entry_dir / "sub").rmdir()
    os.symlink(outside, entry_dir / "sub")
    with pytest.raises(UnsafePathError, match="passes through a symlink"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    assert list(outside.iterdir()) == []


def test_symlinked_file_in_the_cache_is_not_trusted(file_server, tmp_path):
    _serve(file_server, _index([_file("x")]), {"ds/x": GOOD})
    secret = tmp_path / "secret"
    secret.write_bytes(GOOD)
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
    (got / "x").unlink()
    (got / "x").symlink_to(secret)
    with pytest.raises(UnsafePathError, match="symlinks inside .* are never followed"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "cache", progress=False)
