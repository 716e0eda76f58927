"""Entries are never replaced, merged or resurrected silently; earlier revisions stay pullable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.remote.remote_fixtures import make_dataset, parquet_bytes, tree_bytes
from torchstore.cli.main import main
from torchstore.errors import StoreFormatError
from torchstore.remote import (
    EntryExistsError,
    EntryKindError,
    IncompleteFileError,
    NoSuchEntryError,
    RemoteCatalog,
    prune,
    pull,
    push,
    sync_recording,
    write_index,
)
from torchstore.remote.index import parse_index


@pytest.fixture(params=["http", "folder"])
def location(request, file_server, tmp_path):
    """An HTTP location and a plain folder location (both index locations)."""
    if request.param == "http":
        return file_server.url
    return str(tmp_path / "loc")


def _puts(file_server):
    return list(file_server.puts)


def test_same_content_is_up_to_date_and_sends_nothing(file_server, tmp_path, capsys):
    local = make_dataset(tmp_path / "local")
    assert main(["push", str(local), file_server.url, "ds", "--no-progress"]) == 0
    before = _puts(file_server)
    assert main(["push", str(local), file_server.url, "ds", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ds is up to date at" in out and "nothing sent" in out
    assert _puts(file_server) == before  # not even the index


def test_other_content_needs_replace_and_the_old_revision_stays(location, tmp_path, capsys):
    local = make_dataset(tmp_path / "local")
    first = push(local, location, "ds", progress=False)
    old_bytes = tree_bytes(local)
    (local / "meta" / "info.json").write_text('{"episodes": 99}')
    with pytest.raises(EntryExistsError, match=r"already has entry 'ds' .* pass --replace"):
        push(local, location, "ds", progress=False)
    assert main(["push", str(local), location, "ds", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replace" in err[0] and f"ds@{first.revision[:12]}" in err[0]
    assert RemoteCatalog(location)["ds"].revision == first.revision  # nothing changed

    second = push(local, location, "ds", replace=True, progress=False)
    assert second.revision != first.revision
    assert [e.revision for e in second.revisions] == [second.revision, first.revision]
    latest = pull(location, "ds", cache_dir=tmp_path / "c1", progress=False)
    assert tree_bytes(latest) == tree_bytes(local)
    old = pull(location, f"ds@{first.revision[:12]}", cache_dir=tmp_path / "c2", progress=False)
    assert tree_bytes(old) == old_bytes
    # the same cache moves between revisions, leaving nothing of the other behind
    back = pull(location, f"ds@{first.revision[:7]}", cache_dir=tmp_path / "c1", progress=False)
    assert tree_bytes(back) == old_bytes
    with pytest.raises(NoSuchEntryError, match="has no revision 'fffffff' of 'ds'"):
        pull(location, "ds@fffffff", cache_dir=tmp_path / "c3", progress=False)


def test_a_replace_never_overwrites_bytes_a_listed_revision_uses(file_server, tmp_path):
    """Readers of the old revision never see a half-replaced entry: no PUT touches its files."""
    local = make_dataset(tmp_path / "local")
    first = push(local, file_server.url, "ds", progress=False)
    old_paths = {f"ds/{f.stored_at}" for f in first.files}
    n = len(file_server.puts)
    (local / "meta" / "info.json").write_text('{"changed": true}')
    (local / "data" / "chunk-000" / "blob.bin").write_bytes(b"changed blob")
    push(local, file_server.url, "ds", replace=True, progress=False)
    sent = file_server.puts[n:]
    assert sent[-1] == "index.json" and not old_paths & set(sent)


def test_an_entry_never_changes_kind(file_server, tmp_path, capsys):
    local = make_dataset(tmp_path / "local")
    push(local, file_server.url, "ds", progress=False)
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "a.parquet").write_bytes(parquet_bytes())
    n = len(file_server.puts)
    with pytest.raises(EntryKindError, match="has entry 'ds' as a dataset; syncing a recording"):
        sync_recording(rec, file_server.url, "ds")
    assert main(["sync", str(rec), file_server.url, "ds", "--no-progress"]) == 1
    assert "never changes kind" in capsys.readouterr().err
    sync_recording(rec, file_server.url, "rec")
    with pytest.raises(EntryKindError, match="has entry 'rec' as a recording; pushing a dataset"):
        push(local, file_server.url, "rec", replace=True, progress=False)
    assert file_server.puts[n:] == ["rec/a.parquet", "index.json"]  # only the legal sync
    assert RemoteCatalog(file_server.url)["ds"].kind == "dataset"


def test_prune_drops_old_revisions_and_their_bytes(tmp_path, capsys):
    loc = tmp_path / "loc"
    local = make_dataset(tmp_path / "local")
    first = push(local, loc, "ds", progress=False)
    (local / "meta" / "info.json").write_text('{"episodes": 7}')
    (local / "extra.txt").write_text("new")
    second = push(local, loc, "ds", replace=True, progress=False)
    (local / "extra.txt").unlink()
    third = push(local, loc, "ds", replace=True, progress=False)
    assert len(third.revisions) == 3
    assert main(["prune", str(loc), "ds", "--keep", "2"]) == 0
    assert "pruned 1 revision(s) of ds" in capsys.readouterr().out
    entry = RemoteCatalog(loc)["ds"]
    assert [e.revision for e in entry.revisions] == [third.revision, second.revision]
    with pytest.raises(NoSuchEntryError, match="has no revision"):
        pull(loc, f"ds@{first.revision[:12]}", cache_dir=tmp_path / "c", progress=False)
    # first's info.json is used by no kept revision: deleted; the shared files stay
    assert not (loc / "ds" / "meta" / "info.json").exists()
    assert (loc / "ds" / "store.h5").exists()
    assert tree_bytes(pull(loc, "ds", cache_dir=tmp_path / "c", progress=False)) == tree_bytes(
        local
    )
    done = prune(loc, "ds")  # keep=1: the latest only
    assert done.dropped == (second.revision,) and done.left == ()
    assert not (loc / "ds" / f".blobs/{second.file('extra.txt').sha256}").exists()
    assert prune(loc, "ds").dropped == ()
    with pytest.raises(ValueError, match="keep"):
        prune(loc, "ds", keep=0)


def test_prune_on_http_keeps_unused_bytes_it_cannot_delete(file_server, tmp_path):
    local = make_dataset(tmp_path / "local")
    push(local, file_server.url, "ds", progress=False)
    (local / "meta" / "info.json").write_text('{"episodes": 7}')
    push(local, file_server.url, "ds", replace=True, progress=False)
    done = prune(file_server.url, "ds")
    assert done.deleted == () and done.left == ("meta/info.json",)
    assert len(RemoteCatalog(file_server.url)["ds"].revisions) == 1


def test_remote_index_keeps_listed_entries_and_resurrects_nothing(tmp_path):
    loc = tmp_path / "loc"
    local = make_dataset(tmp_path / "local")
    push(local, loc, "ds", progress=False)
    (local / "meta" / "info.json").unlink()
    second = push(local, loc, "ds", replace=True, progress=False)
    assert (loc / "ds" / "meta" / "info.json").exists()  # the first revision still uses it
    write_index(loc)
    entry = parse_index((loc / "index.json").read_bytes())["ds"]
    assert entry.revision == second.revision and entry.file("meta/info.json") is None
    assert len(entry.revisions) == 2
    prune(loc, "ds")
    assert not (loc / "ds" / "meta" / "info.json").exists()
    (loc / "ds" / "meta").mkdir(exist_ok=True)
    (loc / "ds" / "meta" / "info.json").write_text("{}")  # a file in no listed revision
    write_index(loc)
    entry = parse_index((loc / "index.json").read_bytes())["ds"]
    assert entry.revision == second.revision and entry.file("meta/info.json") is None
    # a listed file gone missing is an error, not a silently different entry
    (loc / "ds" / "store.h5").unlink()
    with pytest.raises(StoreFormatError, match=r"lists 'store.h5', but .* is missing"):
        write_index(loc)


def test_remote_index_and_push_agree_on_what_an_entry_is(tmp_path, capsys):
    loc = tmp_path / "loc"
    make_dataset(loc / "ds")
    (loc / "empty").mkdir()
    (loc / "scratch-only").mkdir()
    (loc / "scratch-only" / "x.tmp").write_text("scratch")
    write_index(loc)
    assert RemoteCatalog(loc).names() == ["ds"]
    with pytest.raises(IncompleteFileError, match="no files to upload"):
        push(loc / "empty", tmp_path / "other", "empty", progress=False)
    assert main(["remote", "index", str(loc), "--kind", "nothere=policy"]) == 1
    err = capsys.readouterr().err
    assert "'nothere'" in err and "not an entry" in err and len(err.strip().splitlines()) == 1
    assert main(["remote", "index", str(loc), "--kind", "empty=policy"]) == 1
    capsys.readouterr()
    assert main(["remote", "index", str(loc), "--kind", "ds=bogus"]) == 1
    assert "must be one of" in capsys.readouterr().err


def test_old_version_1_indexes_are_read_and_plain_ones_stay_version_1(tmp_path):
    loc = tmp_path / "loc"
    local = make_dataset(tmp_path / "local")
    entry = push(local, loc, "ds", progress=False)
    doc = json.loads((loc / "index.json").read_text())
    assert doc["version"] == 1 and "history" not in doc["entries"][0]  # readable by older readers
    (local / "meta" / "info.json").write_text('{"v": 2}')
    push(local, loc, "ds", replace=True, progress=False)
    doc = json.loads((loc / "index.json").read_text())
    assert doc["version"] == 2 and doc["entries"][0]["history"][0]["revision"] == entry.revision


@pytest.mark.parametrize("nesting", ["[" * 100_000, '{"a":' * 100_000])
def test_deeply_nested_index_is_a_format_error(file_server, tmp_path, nesting):
    (file_server.root / "index.json").write_text(nesting)
    with pytest.raises(StoreFormatError, match="nested too deeply|not valid JSON"):
        RemoteCatalog(file_server.url).names()


def test_sync_keep_prunes_old_snapshots_of_a_growing_recording(tmp_path, capsys):
    loc = tmp_path / "loc"
    rec = tmp_path / "rec"
    (rec / "data").mkdir(parents=True)
    for i in range(3):
        (rec / "data" / "log.json").write_text(json.dumps({"rows": i}))
        assert main(["sync", str(rec), str(loc), "rec", "--keep", "2", "--no-progress"]) == 0
    entry = RemoteCatalog(loc)["rec"]
    assert len(entry.revisions) == 2
    stored = {
        p.relative_to(loc / "rec").as_posix() for p in (loc / "rec").rglob("*") if p.is_file()
    }
    assert stored == {f.stored_at for e in entry.revisions for f in e.files}  # nothing else kept
    assert main(["sync", str(rec), str(loc), "rec", "--keep", "0"]) == 2


@pytest.mark.parametrize("content", ["new", "dropped"])
def test_a_push_racing_a_prune_never_loses_the_bytes_its_index_lists(
    tmp_path, monkeypatch, content
):
    """A push that reads the pruned index before prune deletes must not upload where it deletes."""
    from torchstore.io.remote.folder import LocalFolderClient

    loc = tmp_path / "loc"
    local = make_dataset(tmp_path / "local")
    info = local / "meta" / "info.json"
    dropped_bytes = info.read_bytes()
    push(local, loc, "ds", progress=False)  # stored at its own paths
    info.write_text('{"episodes": 7}')
    push(local, loc, "ds", replace=True, progress=False)  # info.json beside it, in .blobs
    info.write_text('{"episodes": 8}')
    kept = push(local, loc, "ds", replace=True, progress=False)
    expected = {kept.revision: tree_bytes(local)}
    # the same path again, with content no kept revision stores (new, or a dropped revision's)
    info.write_bytes(b'{"episodes": 9}' if content == "new" else dropped_bytes)
    delete = LocalFolderClient.delete
    raced = []

    def delete_after_a_push(self, rel):
        if not raced:
            raced.append(rel)
            pushed = push(local, loc, "ds", replace=True, progress=False)
            expected[pushed.revision] = tree_bytes(local)
        delete(self, rel)

    monkeypatch.setattr(LocalFolderClient, "delete", delete_after_a_push)
    done = prune(loc, "ds")
    assert raced and done.deleted
    entry = RemoteCatalog(loc)["ds"]
    assert [e.revision for e in entry.revisions] == list(reversed(expected))
    for i, rev in enumerate(entry.revisions):  # every listed revision pulls and verifies
        got = pull(loc, f"ds@{rev.revision}", cache_dir=tmp_path / f"c{i}", progress=False)
        assert tree_bytes(got) == expected[rev.revision]


def test_sync_retried_after_an_identical_sync_reports_file_paths(tmp_path, monkeypatch):
    """Bytes sent before losing the index race to the same content count as that file's upload."""
    from torchstore.io.remote.folder import LocalFolderClient

    loc = tmp_path / "loc"
    rec = tmp_path / "rec"
    (rec / "data").mkdir(parents=True)
    (rec / "data" / "log.json").write_text(json.dumps({"rows": 0}))
    (rec / "data" / "fixed.json").write_text("{}")
    sync_recording(rec, loc, "rec")
    (rec / "data" / "log.json").write_text(json.dumps({"rows": 1}))  # its new bytes go to .blobs
    write_bytes = LocalFolderClient.write_bytes
    raced = []

    def an_identical_sync_first(self, rel, data, **kw):
        if not raced:
            raced.append(rel)
            sync_recording(rec, loc, "rec")
        write_bytes(self, rel, data, **kw)

    monkeypatch.setattr(LocalFolderClient, "write_bytes", an_identical_sync_first)
    result = sync_recording(rec, loc, "rec")
    assert raced
    assert result.uploaded == ("data/log.json",)
    assert result.unchanged == ("data/fixed.json",)


def test_a_refused_remote_index_prints_one_line_as_a_user_sees_it(tmp_path):
    """Folders left out are logged only once the index is written; a refusal names them in
    its one line (a subprocess: the logging handler writes to the real stderr)."""
    loc = tmp_path / "loc"
    make_dataset(loc / "ds")
    (loc / "empty").mkdir()
    cmd = [sys.executable, "-m", "torchstore", "remote", "index", str(loc)]
    bad = subprocess.run([*cmd, "--kind", "empty=policy"], capture_output=True, text=True)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "'empty'" in bad.stderr and "empty/" in bad.stderr
    assert not (loc / "index.json").exists()
    good = subprocess.run(cmd, capture_output=True, text=True)
    assert good.returncode == 0 and "empty/ has no file to publish" in good.stderr
