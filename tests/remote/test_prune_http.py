"""Prune over HTTP: deletes when the server speaks DELETE, else says exactly what it left."""

from __future__ import annotations

import threading

from tests.remote.remote_fixtures import make_dataset, tree_bytes
from torchstore.cli.main import main
from torchstore.remote import RemoteCatalog, prune, pull, push


def _three_revisions(file_server, tmp_path, trees: dict | None = None):
    """Entry ``ds`` pushed three times, two files changed each time; returns the local folder
    (and notes each revision's bytes in ``trees``)."""
    local = make_dataset(tmp_path / "local")
    for i in range(3):
        if i:
            (local / "meta" / "info.json").write_text(f'{{"episodes": {i}}}')
            (local / "data" / "chunk-000" / "blob.bin").write_bytes(bytes([i]) * 1000)
        entry = push(local, file_server.url, "ds", replace=True, progress=False)
        if trees is not None:
            trees[entry.revision] = tree_bytes(local)
    return local


def _stored(file_server) -> set[str]:
    root = file_server.root
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _pulls_exactly(file_server, local, tmp_path) -> None:
    (entry,) = RemoteCatalog(file_server.url)["ds"].revisions
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    stored = _stored(file_server)
    assert {f"ds/{f.stored_at}" for f in entry.files} <= stored  # the index names only bytes there


def test_prune_deletes_over_http_when_the_server_allows_delete(file_server, tmp_path, capsys):
    local = _three_revisions(file_server, tmp_path)
    file_server.allow_delete = True
    before = RemoteCatalog(file_server.url)["ds"]
    kept = {f.stored_at for f in before.files}
    unused = {f.stored_at for e in before.history for f in e.files} - kept
    assert len(unused) == 4
    assert main(["prune", file_server.url, "ds"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"pruned 2 revision(s) of ds at {file_server.url}: kept 1, deleted 4 file(s) no kept "
        "revision uses"
    ]
    assert sorted(file_server.deletes) == sorted(f"ds/{at}" for at in unused)
    assert not {f"ds/{at}" for at in unused} & _stored(file_server)
    _pulls_exactly(file_server, local, tmp_path)


def test_prune_over_http_lists_every_file_the_server_refused_to_delete(
    file_server, tmp_path, capsys
):
    local = _three_revisions(file_server, tmp_path)
    before = RemoteCatalog(file_server.url)["ds"]
    unused = {f.stored_at for e in before.history for f in e.files} - {
        f.stored_at for f in before.files
    }
    assert main(["prune", file_server.url, "ds"]) == 0  # DELETE answered 405
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("kept 1, deleted 0 file(s) no kept revision uses")
    assert out[1] == (
        f"  4 such file(s) left in place ({file_server.url} did not delete them; no listed "
        "revision uses them, so they are safe to delete by hand):"
    )
    assert out[2:] == [f"    ds/{at}" for at in sorted(unused)]
    assert {f"ds/{at}" for at in unused} <= _stored(file_server)  # nothing deleted
    assert sum(r["method"] == "DELETE" for r in file_server.requests) == 4
    _pulls_exactly(file_server, local, tmp_path)
    # a push afterwards is consistent too, and never reuses a path prune left behind
    (local / "meta" / "info.json").write_text('{"episodes": 0}')
    third = push(local, file_server.url, "ds", replace=True, progress=False)
    assert not {f.stored_at for f in third.files} & unused
    assert tree_bytes(pull(file_server.url, "ds", cache_dir=tmp_path / "c2", progress=False)) == (
        tree_bytes(local)
    )


def test_prune_over_http_keeps_what_one_refused_delete_left(file_server, tmp_path):
    local = _three_revisions(file_server, tmp_path)
    file_server.allow_delete = True
    before = RemoteCatalog(file_server.url)["ds"]
    unused = sorted(
        {f.stored_at for e in before.history for f in e.files} - {f.stored_at for f in before.files}
    )
    file_server.status_for[f"ds/{unused[0]}"] = [403]  # one file the server will not delete
    done = prune(file_server.url, "ds")
    assert done.left == (unused[0],) and done.deleted == tuple(unused[1:])
    assert f"ds/{unused[0]}" in _stored(file_server)
    _pulls_exactly(file_server, local, tmp_path)


def test_a_prune_racing_pushes_leaves_every_listed_revision_pullable(file_server, tmp_path):
    trees: dict[str, dict[str, bytes]] = {}
    _three_revisions(file_server, tmp_path, trees)
    file_server.allow_delete = True
    folders = [make_dataset(tmp_path / f"p{i}", blob_bytes=1000 + i) for i in range(4)]
    barrier = threading.Barrier(len(folders) + 1)
    errors: list[BaseException] = []

    def push_one(folder):
        barrier.wait()
        try:
            trees[push(folder, file_server.url, "ds", replace=True, progress=False).revision] = (
                tree_bytes(folder)
            )
        except BaseException as exc:  # noqa: BLE001 - any failure fails the test below
            errors.append(exc)

    def prune_once():
        barrier.wait()
        try:
            prune(file_server.url, "ds", keep=2)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=push_one, args=(f,)) for f in folders]
    threads.append(threading.Thread(target=prune_once))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    entry = RemoteCatalog(file_server.url)["ds"]
    assert entry.revision in trees and len(entry.revisions) >= 2
    for i, rev in enumerate(entry.revisions):
        got = pull(file_server.url, f"ds@{rev.revision}", cache_dir=tmp_path / f"c{i}")
        assert tree_bytes(got) == trees[rev.revision]
