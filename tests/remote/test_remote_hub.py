"""Hub locations on the loopback Hub: push, catalog, pull; revisions; foreign repos; offline."""

from __future__ import annotations

import os

import pytest

from tests.remote.remote_fixtures import assert_store_matches, make_dataset, tree_bytes
from torchstore.errors import IntegrityError
from torchstore.remote import RemoteCatalog, RemoteNotFoundError, TransferError, pull, push
from torchstore.remote.cache import pull_entry

pytest.importorskip("huggingface_hub")


def test_push_catalog_pull_round_trip(hub, tmp_path):
    local = make_dataset(tmp_path / "local")
    entry = push(local, hub.location, "ds", progress=False)
    assert entry.commit and len(entry.commit) == 40
    catalog = RemoteCatalog(hub.location)
    assert catalog.names() == ["ds"]
    listed = catalog["ds"]
    assert listed.kind == "dataset" and listed.commit == entry.commit
    assert {f.path for f in listed.files} == {
        "store.h5",
        "meta/info.json",
        "data/chunk-000/blob.bin",
    }
    assert all(f.sha256 and f.blob_sha1 for f in listed.files)
    got = pull(hub.location, "ds", cache_dir=tmp_path / "c2", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    assert_store_matches(got / "store.h5", 3)
    # pulled again: no file downloaded again (only the small torchstore.json is read)
    data = {k: v for k, v in hub.body_bytes.items() if not k.endswith("torchstore.json")}
    pull(hub.location, "ds", cache_dir=tmp_path / "c2", progress=False)
    assert {k: v for k, v in hub.body_bytes.items() if not k.endswith("torchstore.json")} == data


def test_push_again_commits_only_changes_and_deletes_removed_files(hub, tmp_path):
    from huggingface_hub import HfApi

    local = make_dataset(tmp_path / "local")
    first = push(local, hub.location, "ds", progress=False)
    again = push(local, hub.location, "ds", progress=False)
    assert again.commit == first.commit  # nothing changed: no commit
    (local / "meta" / "info.json").unlink()
    (local / "new.txt").write_text("new\n")
    third = push(local, hub.location, "ds", replace=True, progress=False)
    files = HfApi(endpoint=hub.endpoint).list_repo_files(f"{hub.namespace}/ds", repo_type="dataset")
    assert "meta/info.json" not in files and "new.txt" in files and "torchstore.json" in files
    got = pull(hub.location, "ds", cache_dir=tmp_path / "c", revision=third.commit, progress=False)
    assert tree_bytes(got) == tree_bytes(local)


def test_pull_a_tag(hub, tmp_path):
    from huggingface_hub import HfApi

    local = make_dataset(tmp_path / "local")
    push(local, hub.location, "ds", progress=False)
    HfApi(endpoint=hub.endpoint).create_tag(f"{hub.namespace}/ds", tag="v1", repo_type="dataset")
    old = tree_bytes(local)
    (local / "meta" / "info.json").write_text('{"episodes": 4}')
    push(local, hub.location, "ds", replace=True, progress=False)
    got = pull(hub.location, "ds", cache_dir=tmp_path / "c", revision="v1", progress=False)
    assert tree_bytes(got) == old
    assert pull(hub.location, "ds@v1", cache_dir=tmp_path / "c", progress=False) == got
    got = pull(hub.location, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    with pytest.raises(RemoteNotFoundError, match="RevisionNotFoundError"):
        pull(hub.location, "ds", cache_dir=tmp_path / "c", revision="v9", progress=False)


def test_foreign_repo_is_verified_by_git_blob_id(hub, tmp_path):
    from huggingface_hub import HfApi

    folder = tmp_path / "foreign"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "a.bin").write_bytes(os.urandom(5000))
    (folder / "README.md").write_text("# foreign\n")
    api = HfApi(endpoint=hub.endpoint)
    api.create_repo(f"{hub.namespace}/foreign", repo_type="dataset")
    api.upload_folder(folder_path=folder, repo_id=f"{hub.namespace}/foreign", repo_type="dataset")
    entry = RemoteCatalog(hub.location)["foreign"]
    assert entry.kind == "dataset" and all(f.sha256 is None and f.blob_sha1 for f in entry.files)
    got = pull(hub.location, "foreign", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(folder)


def test_hub_file_that_does_not_match_its_manifest_never_appears(hub, tmp_path):
    from huggingface_hub import CommitOperationAdd, HfApi

    local = make_dataset(tmp_path / "local")
    push(local, hub.location, "ds", progress=False)
    size = (local / "meta" / "info.json").stat().st_size
    HfApi(endpoint=hub.endpoint).create_commit(  # same size, other bytes: only the sha256 can tell
        f"{hub.namespace}/ds",
        [CommitOperationAdd("meta/info.json", b"x" * size)],
        commit_message="tamper",
        repo_type="dataset",
    )
    with pytest.raises(
        IntegrityError, match="'meta/info.json' of 'ds' from hf://datasets/.*: sha256 mismatch"
    ):
        pull(hub.location, "ds", cache_dir=tmp_path / "c", progress=False)
    cache = next((tmp_path / "c").iterdir())
    assert not (cache / "ds" / "meta" / "info.json").exists()


def test_hub_offline_answers_from_the_cache(hub, tmp_path, monkeypatch):
    local = make_dataset(tmp_path / "local")
    push(local, hub.location, "ds", progress=False)
    got, entry = pull_entry(hub.location, "ds", cache_dir=tmp_path / "c", progress=False)
    n = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull(hub.location, "ds", cache_dir=tmp_path / "c") == got
    assert pull(hub.location, "ds", cache_dir=tmp_path / "c", revision=entry.commit[:8]) == got
    assert len(hub.requests) == n
    with pytest.raises(
        TransferError, match="offline mode: 'other' from hf://datasets/.* is not in the cache"
    ):
        pull(hub.location, "other", cache_dir=tmp_path / "c")


def test_missing_repo_is_not_found(hub, tmp_path):
    with pytest.raises(RemoteNotFoundError, match="RepositoryNotFoundError"):
        pull(hub.location, "nothing", cache_dir=tmp_path / "c", progress=False)
    assert RemoteCatalog(hub.location).names() == []


def test_hub_download_survives_a_cut(hub, tmp_path):
    # huggingface_hub retries a dropped stream itself; it resumes from its last full 10 MB read
    # chunk, so a small file restarts from zero: the file still arrives whole and verified.
    local = make_dataset(tmp_path / "local", blob_bytes=400_000)
    push(local, hub.location, "ds", progress=False)
    key = f"{hub.namespace}/ds/data/chunk-000/blob.bin"
    hub.cut_after[(f"{hub.namespace}/ds", "data/chunk-000/blob.bin")] = 150_000
    got = pull(hub.location, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    assert 400_000 < hub.body_bytes[key] <= 150_000 + 400_000


def test_hub_entries_are_not_replaced_or_merged_silently(hub, tmp_path):
    from torchstore.remote import EntryExistsError, EntryKindError, sync_recording

    local = make_dataset(tmp_path / "local")
    first = push(local, hub.location, "ds", progress=False)
    (local / "meta" / "info.json").write_text('{"episodes": 5}')
    commits = len(hub.repos[("dataset", f"{hub.namespace}/ds")].commits)
    with pytest.raises(EntryExistsError, match=f"pullable as ds@{first.commit}"):
        push(local, hub.location, "ds", progress=False)
    with pytest.raises(EntryKindError, match="as a dataset; syncing a recording onto it"):
        sync_recording(local, hub.location, "ds")
    assert len(hub.repos[("dataset", f"{hub.namespace}/ds")].commits) == commits
    push(local, hub.location, "ds", replace=True, progress=False)
    old = pull(hub.location, f"ds@{first.commit}", cache_dir=tmp_path / "c", progress=False)
    assert (old / "meta" / "info.json").read_text() == '{"episodes": 3}'
