"""HTTP locations end to end: push, catalog, pull; resume; corruption; offline; progress."""

from __future__ import annotations

import json

import pytest

from tests.remote.remote_fixtures import assert_store_matches, make_dataset, tree_bytes
from torchstore.errors import IntegrityError
from torchstore.remote import (
    RemoteCatalog,
    RemoteNotFoundError,
    TransferError,
    format_catalog,
    pull,
    push,
)
from torchstore.remote.cache import pull_entry

BLOB = "ds/data/chunk-000/blob.bin"


@pytest.fixture
def pushed(file_server, tmp_path):
    local = make_dataset(tmp_path / "local")
    entry = push(local, file_server.url, "ds", progress=False)
    return local, entry


def test_push_catalog_pull_round_trip(file_server, pushed, tmp_path):
    local, entry = pushed
    catalog = RemoteCatalog(file_server.url)
    assert catalog.names() == ["ds"] and "ds" in catalog and len(catalog) == 1
    listed = catalog["ds"]
    assert listed.kind == "dataset" and listed.size == sum(
        len(b) for b in tree_bytes(local).values()
    )
    assert {f.path for f in listed.files} == {
        "store.h5",
        "meta/info.json",
        "data/chunk-000/blob.bin",
    }
    assert all(len(f.sha256) == 64 for f in listed.files) and listed.revision == entry.revision
    assert "ds" in format_catalog(catalog, files=True) and "sha256:" in format_catalog(
        catalog, files=True
    )

    got = pull(file_server.url, "ds", cache_dir=tmp_path / "cache2", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    assert_store_matches(got / "store.h5", 3)


def test_second_pull_fetches_nothing(file_server, pushed, tmp_path):
    pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    gets = len([r for r in file_server.requests if r["path"] != "index.json"])
    again = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert len([r for r in file_server.requests if r["path"] != "index.json"]) == gets
    assert tree_bytes(again)  # still all there


def test_second_push_uploads_only_changes_and_index_is_last(file_server, pushed):
    local, _ = pushed
    puts = len(file_server.puts)
    (local / "meta" / "info.json").write_text('{"episodes": 3, "changed": true}')
    entry = push(local, file_server.url, "ds", replace=True, progress=False)
    # the replaced revision still points at ds/meta/info.json: the new bytes go beside it,
    # to a storage path never used before
    at = entry.file("meta/info.json").at
    assert at.startswith(f".blobs/{entry.file('meta/info.json').sha256}-")
    assert file_server.puts[puts:] == [f"ds/{at}", "index.json"]
    assert file_server.puts[0] != "index.json" and file_server.puts[puts - 1] == "index.json"


def test_interrupted_pull_resumes_with_range(file_server, pushed, tmp_path):
    size = 200_000
    file_server.cut_after[BLOB] = 70_000
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False, retries=2)
    assert (got / "data/chunk-000/blob.bin").read_bytes() == (
        pushed[0] / "data/chunk-000/blob.bin"
    ).read_bytes()
    assert [r["range"] for r in file_server.gets(BLOB)] == [None, "bytes=70000-"]
    assert file_server.body_bytes[BLOB] == size  # 70000 + 130000: nothing sent twice


def test_pull_resumes_across_runs(file_server, pushed, tmp_path):
    file_server.cut_after[BLOB] = 50_000
    with pytest.raises(TransferError, match="connection closed with 150000 bytes to go"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False, retries=0)
    cache = next((tmp_path / "c").iterdir())
    assert not (
        cache / "ds" / "data" / "chunk-000" / "blob.bin"
    ).exists()  # nothing half-made visible
    pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False, retries=0)
    assert file_server.gets(BLOB)[-1]["range"] == "bytes=50000-"
    assert file_server.body_bytes[BLOB] == 200_000


def test_corrupt_byte_never_becomes_visible(file_server, pushed, tmp_path):
    file_server.flip_byte[BLOB] = 123_456
    with pytest.raises(
        IntegrityError, match=r"'data/chunk-000/blob.bin' of 'ds' from .*: sha256 mismatch"
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    cache = next((tmp_path / "c").iterdir())
    assert not (cache / "ds" / "data" / "chunk-000" / "blob.bin").exists()
    assert list((cache / ".partial" / "ds").iterdir()) == []  # the bad bytes are gone too
    del file_server.flip_byte[BLOB]
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(pushed[0])
    assert list((cache / ".partial" / "ds").iterdir()) == []


def test_stale_cached_file_is_replaced(file_server, pushed, tmp_path):
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    (got / "meta" / "info.json").write_text("tampered")
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert json.loads((got / "meta" / "info.json").read_text()) == {"episodes": 3}


def test_offline_answers_from_the_cache(file_server, pushed, tmp_path, monkeypatch):
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    n = len(file_server.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull(file_server.url, "ds", cache_dir=tmp_path / "c") == got
    assert len(file_server.requests) == n  # no network at all
    with pytest.raises(TransferError, match="offline mode: the cache holds 'ds' at revision"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", revision="deadbeef")
    with pytest.raises(TransferError, match="offline mode: listing .* needs the network"):
        RemoteCatalog(file_server.url).names()
    (got / "meta" / "info.json").unlink()
    with pytest.raises(
        TransferError, match="offline mode: 'meta/info.json' of 'ds' was never pulled"
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c")
    (got / "meta" / "info.json").write_text("tampered")
    with pytest.raises(
        IntegrityError, match="offline mode: cached 'meta/info.json' of 'ds' does not match"
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c")


def test_offline_without_cache_fails_clearly(file_server, tmp_path):
    with pytest.raises(
        TransferError, match=r"offline mode: 'ds' from http://.* is not in the cache"
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", offline=True)
    assert file_server.requests == []


def test_missing_entry_and_revision(file_server, pushed, tmp_path):
    with pytest.raises(RemoteNotFoundError, match=r"has no entry 'nope' \(its entries: ds\)"):
        pull(file_server.url, "nope", cache_dir=tmp_path / "c", progress=False)
    with pytest.raises(RemoteNotFoundError, match="has no revision '0000000' of 'ds'"):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", revision="0000000", progress=False)
    with pytest.raises(RemoteNotFoundError, match="has no entry 'nope'"):
        RemoteCatalog(file_server.url)["nope"]
    path, entry = pull_entry(
        file_server.url,
        "ds",
        cache_dir=tmp_path / "c",
        revision=pushed[1].revision[:10],
        progress=False,
    )
    assert entry.revision == pushed[1].revision


def test_progress_bar_shows_bytes_and_rate(file_server, pushed, tmp_path, monkeypatch, capsys):
    pytest.importorskip("tqdm")
    monkeypatch.delenv("TORCHSTORE_DISABLE_PROGRESS")
    pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=True)
    err = capsys.readouterr().err
    assert "pull ds" in err and "B/s" in err and "k" in err


def test_push_to_a_folder_and_pull_from_it(tmp_path):
    local = make_dataset(tmp_path / "local")
    push(local, tmp_path / "remote", "ds", progress=False)
    push(local, f"file://{tmp_path / 'remote'}", "ds", progress=False)  # same place, nothing new
    got = pull(tmp_path / "remote", "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    assert (tmp_path / "remote" / "index.json").exists()


def test_slow_server_fails_clearly(file_server, pushed, tmp_path):
    file_server.delay_s = 0.5
    with pytest.raises(
        TransferError,
        match=r"GET http://127.0.0.1:\d+/data/index.json: timed out after 0.1 s with no answer",
    ):
        pull(
            file_server.url, "ds", cache_dir=tmp_path / "c", progress=False, timeout=0.1, retries=0
        )


def test_concurrent_pusher_is_merged_not_overwritten(file_server, tmp_path, monkeypatch):
    from torchstore.io.remote.http import HttpClient

    local = make_dataset(tmp_path / "local")
    real = HttpClient.write_bytes
    raced = []

    def racing_write(self, rel, data, **kw):
        if rel == "index.json" and not raced:  # another pusher publishes between our read and write
            raced.append(True)
            push(local, file_server.url, "other", progress=False)
        return real(self, rel, data, **kw)

    monkeypatch.setattr(HttpClient, "write_bytes", racing_write)
    push(local, file_server.url, "ds", progress=False)
    assert RemoteCatalog(file_server.url).names() == ["ds", "other"]
    assert [r["path"] for r in file_server.requests if r["method"] == "PUT"].count(
        "index.json"
    ) == 3  # one was refused


def test_files_dropped_from_an_entry_leave_the_cache(file_server, pushed, tmp_path):
    local, _ = pushed
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    (local / "meta" / "info.json").unlink()
    push(local, file_server.url, "ds", replace=True, progress=False)
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert not (got / "meta" / "info.json").exists()
    assert not (got / "meta").exists()  # the folder it leaves empty goes too
    assert tree_bytes(got) == tree_bytes(local)


def test_offline_with_a_damaged_record_fails_clearly(file_server, pushed, tmp_path):
    pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    record = next((tmp_path / "c").iterdir()) / ".records" / "ds.json"
    data = json.loads(record.read_text())
    data["entry"]["files"][0]["path"] = "../escape"
    record.write_text(json.dumps(data))
    with pytest.raises(
        TransferError, match=r"offline mode: the cache record .*ds.json is unreadable"
    ):
        pull(file_server.url, "ds", cache_dir=tmp_path / "c", offline=True)
