"""The index.json format, locations, push refusals and `torchstore remote index`."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.remote.remote_fixtures import make_dataset, parquet_bytes, tree_bytes
from torchstore.errors import StoreFormatError, UnsafePathError
from torchstore.remote import (
    IncompleteFileError,
    RemoteCatalog,
    RemoteEntry,
    RemoteFile,
    pull,
    push,
    write_index,
)
from torchstore.remote.index import dump_entry, dump_index, entry_revision, parse_entry, parse_index
from torchstore.remote.location import parse_location

SHA = "a" * 64


def test_index_round_trip():
    entry = RemoteEntry(
        "ds", "recording", (RemoteFile("b/x", 3, SHA, source="tag"), RemoteFile("a", 0, "b" * 64))
    )
    assert [f.path for f in entry.files] == ["a", "b/x"] and entry.size == 3
    assert entry.revision == entry_revision(entry.files)
    back = parse_index(dump_index([entry]))
    assert back == {"ds": entry} and back["ds"].file("b/x").source == "tag"
    assert parse_entry(dump_entry(entry)) == entry
    doc = json.loads(dump_index([entry]))
    assert doc["format"] == "torchstore-index" and doc["version"] == 1
    assert doc["entries"][0]["files"][0] == {"path": "a", "size": 0, "sha256": "b" * 64}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"path": "../x"}, UnsafePathError, r"'\.\.' segments"),
        ({"size": True}, StoreFormatError, r"size \(True\) must be an int"),
        ({"size": 2**51}, StoreFormatError, "must be an int in"),
        ({"sha256": "A" * 64}, StoreFormatError, "must be 64 lowercase hex"),
        ({"sha256": None}, StoreFormatError, "has no sha256"),
        (
            {"sha256": None, "blob_sha1": "x"},
            StoreFormatError,
            "blob sha1 .* must be 40 lowercase hex",
        ),
    ],
)
def test_remote_file_is_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        RemoteFile(**{"path": "x", "size": 1, "sha256": SHA, **kwargs})


def test_duplicate_entries_and_bad_files_are_refused():
    entry = RemoteEntry("ds", "dataset", (RemoteFile("x", 1, SHA),)).to_dict()
    doc = {"format": "torchstore-index", "version": 1, "entries": [entry, entry]}
    with pytest.raises(StoreFormatError, match="lists entry 'ds' twice"):
        parse_index(json.dumps(doc))
    doc["entries"] = [{**entry, "files": "x"}]
    with pytest.raises(StoreFormatError, match="files must be a list"):
        parse_index(json.dumps(doc))
    doc["entries"] = [{**entry, "files": [3]}]
    with pytest.raises(StoreFormatError, match="file 0 must be an object, got int"):
        parse_index(json.dumps(doc))
    doc["entries"] = [{**entry, "files": [{"path": "x", "size": 1, "sha256": SHA, "source": 3}]}]
    with pytest.raises(StoreFormatError, match="source must be a string"):
        parse_index(json.dumps(doc))
    doc["entries"] = [3]
    with pytest.raises(StoreFormatError, match="entry 0 must be an object, got int"):
        parse_index(json.dumps(doc))
    with pytest.raises(StoreFormatError, match=r"version \('1'\) must be an int >= 1"):
        parse_index(json.dumps({"format": "torchstore-index", "version": "1", "entries": []}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hf://lab", ("hub", "hf://datasets/lab", "dataset")),
        ("hf://datasets/lab", ("hub", "hf://datasets/lab", "dataset")),
        ("hf://models/lab", ("hub", "hf://models/lab", "model")),
        ("http://127.0.0.1:8/x/", ("http", "http://127.0.0.1:8/x", "dataset")),
        ("memory://bucket/x", ("folder", "memory://bucket/x", "dataset")),
    ],
)
def test_locations_parse(text, expected):
    loc = parse_location(text)
    assert (loc.scheme, loc.raw, loc.repo_type) == expected
    assert loc.slug.startswith(loc.scheme + "-") and "/" not in loc.slug


def test_folder_locations_are_absolute(tmp_path):
    assert parse_location(f"file://{tmp_path}").raw == str(tmp_path)
    assert parse_location(tmp_path).raw == str(tmp_path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("hf://", "must be hf://NAMESPACE"),
        ("hf://datasets/a/b", "must be hf://NAMESPACE"),
        ("hf://../x", "must be hf://NAMESPACE"),
        ("hf://-x", "must be 1-128 characters"),
        ("http:///x", "must name a host"),
        ("", "must be a non-empty string"),
    ],
)
def test_bad_locations_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        parse_location(text)


def test_push_refuses_incomplete_files(file_server, tmp_path):
    local = tmp_path / "ds"
    local.mkdir()
    (local / "a.parquet").write_bytes(parquet_bytes()[:-2])
    (local / "b.tmp").write_bytes(b"scratch is skipped silently")
    with pytest.raises(
        IncompleteFileError,
        match=r"1 file\(s\) are not safe to upload \('a.parquet': an incomplete Parquet",
    ):
        push(local, file_server.url, "ds", progress=False)
    (local / "a.parquet").unlink()
    with pytest.raises(IncompleteFileError, match="no files to upload"):
        push(local, file_server.url, "ds", progress=False)
    with pytest.raises(FileNotFoundError, match="nothing to push at"):
        push(tmp_path / "none", file_server.url, "ds", progress=False)
    with pytest.raises(ValueError, match=r"kind \('weird'\) must be one of"):
        push(local, file_server.url, "ds", kind="weird", progress=False)
    with pytest.raises(UnsafePathError, match="entry name"):
        push(local, file_server.url, "../ds", progress=False)
    assert file_server.puts == []


def test_push_refuses_symlinks(file_server, tmp_path):
    local = tmp_path / "ds"
    local.mkdir()
    (tmp_path / "secret").write_text("key")
    (local / "key").symlink_to(tmp_path / "secret")
    with pytest.raises(IncompleteFileError, match="'key': a symlink"):
        push(local, file_server.url, "ds", progress=False)


def test_push_a_single_file(file_server, tmp_path):
    f = tmp_path / "weights.json"
    f.write_text("{}")
    entry = push(f, file_server.url, "one", kind="assets", progress=False)
    assert [x.path for x in entry.files] == ["weights.json"] and entry.kind == "assets"


def test_write_index_serves_a_folder(file_server, tmp_path):
    make_dataset(file_server.root / "ds")
    (file_server.root / "pol").mkdir()
    (file_server.root / "pol" / "w.safetensors").write_bytes(b"\x02\0\0\0\0\0\0\0{}")
    (file_server.root / "ds" / "half.parquet").write_bytes(b"PAR1")
    path = write_index(file_server.root)
    catalog = RemoteCatalog(file_server.url)
    assert [(e.name, e.kind) for e in catalog] == [("ds", "dataset"), ("pol", "policy")]
    assert catalog["ds"].file("half.parquet") is None  # incomplete files are left out
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == {
        k: v for k, v in tree_bytes(file_server.root / "ds").items() if k != "half.parquet"
    }
    write_index(file_server.root, kinds={"ds": "recording"})
    assert parse_index(path.read_bytes())["ds"].kind == "recording"
    write_index(file_server.root)  # kinds are kept from the existing index
    assert parse_index(path.read_bytes())["ds"].kind == "recording"
    with pytest.raises(FileNotFoundError, match="no folder"):
        write_index(tmp_path / "none")


def test_fsspec_location_round_trip(tmp_path):
    pytest.importorskip("fsspec")
    location = f"memory://ts-{uuid.uuid4().hex}/data"
    local = make_dataset(tmp_path / "local")
    push(local, location, "ds", progress=False)
    assert RemoteCatalog(location).names() == ["ds"]
    assert tree_bytes(pull(location, "ds", cache_dir=tmp_path / "c", progress=False)) == tree_bytes(
        local
    )
