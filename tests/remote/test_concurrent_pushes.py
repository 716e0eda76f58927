"""Pushes racing each other on one index location (a folder, HTTP): each pusher gets its own
revision or a clear torchstore error, and the index never names bytes that are not there
nor loses a revision a pusher was told it published."""

from __future__ import annotations

import hashlib
import threading
import traceback
from pathlib import Path

import numpy as np
import pytest

from tests.remote.remote_fixtures import tree_bytes
from torchstore.cli.main import main
from torchstore.errors import (
    EntryExistsError,
    IndexConflictError,
    RemoteChangedError,
    TorchstoreError,
)
from torchstore.io.remote.folder import LocalFolderClient
from torchstore.io.remote.http import HttpClient
from torchstore.remote import RemoteCatalog, backend, pull
from torchstore.remote.index import (
    RemoteEntry,
    RemoteFile,
    dump_index,
    entry_revision,
    parse_index,
)
from torchstore.remote.upload import push_folder

_PUSHERS = 6
_ROUNDS = 3


@pytest.fixture(params=["folder", "http"])
def location(request, file_server, tmp_path):
    if request.param == "http":
        return file_server.url
    return str(tmp_path / "loc")


def _local(root: Path, seed: int, *, shared: bool = True) -> Path:
    """A small folder: one file every pusher shares, one whose content is the pusher's own."""
    rng = np.random.default_rng(seed)
    (root / "meta").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "meta" / "info.json").write_text('{"shared": true}' if shared else f'{{"s": {seed}}}')
    (root / "data" / "blob.bin").write_bytes(rng.bytes(int(rng.integers(1_000, 40_000))))
    return root


def _revision_of(root: Path) -> str:
    files = [
        RemoteFile(rel, len(data), hashlib.sha256(data).hexdigest())
        for rel, data in tree_bytes(root).items()
    ]
    return entry_revision(files)


def _race(location: str, folders: list[Path], *, replace: bool) -> list[tuple[str, object]]:
    """Push every folder as entry ``ds`` at once (threads released by one barrier)."""
    barrier = threading.Barrier(len(folders))
    results: list[tuple[str, object]] = [("hang", None)] * len(folders)

    def one(i: int) -> None:
        barrier.wait()
        try:
            done = push_folder(folders[i], location, "ds", replace=replace, progress=False)
            results[i] = ("ok", done)
        except TorchstoreError as exc:
            results[i] = ("error", exc)
        except BaseException:  # a raw exception is the failure this test looks for
            results[i] = ("raw", traceback.format_exc())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(folders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def _shown(results: list[tuple[str, object]]) -> list[str]:
    """The outcomes, short enough to read in a failure."""
    return [f"{k}: {type(v).__name__} {str(v)[:300]}" for k, v in results if k != "ok"]


def _check_index(location: str, expected: dict[str, dict[str, bytes]], cache: Path) -> list[str]:
    """Every revision the index lists pulls byte-exact (``expected``: revision -> bytes)."""
    entry = RemoteCatalog(location)["ds"]
    listed = []
    for rev in entry.revisions:
        listed.append(rev.revision)
        got = pull(location, f"ds@{rev.revision}", cache_dir=cache, progress=False)
        assert tree_bytes(got) == expected[rev.revision], rev.revision[:12]
    return listed


def _folders(tmp_path: Path, tag: str, seeds: range) -> tuple[list[Path], dict]:
    folders = [_local(tmp_path / f"{tag}-{s}", s) for s in seeds]
    return folders, {_revision_of(f): tree_bytes(f) for f in folders}


def test_racing_pushes_of_one_new_entry_give_one_winner_and_clear_refusals(location, tmp_path):
    for r in range(_ROUNDS):
        name_loc = f"{location}/r{r}" if "://" in location else str(Path(location) / f"r{r}")
        folders, expected = _folders(tmp_path, f"new{r}", range(r * 10, r * 10 + _PUSHERS))
        results = _race(name_loc, folders, replace=False)
        assert [k for k, _ in results if k in ("raw", "hang")] == [], _shown(results)
        winners = [v for k, v in results if k == "ok"]
        assert len(winners) == 1, _shown(results)
        for kind, value in results:
            if kind == "error":
                assert isinstance(value, EntryExistsError), value
                assert "'ds'" in str(value) and "--replace" in str(value)
        listed = _check_index(name_loc, expected, tmp_path / f"cache{r}")
        assert listed == [winners[0].entry.revision]


def test_racing_replacing_pushes_each_become_a_listed_revision(location, tmp_path):
    base, expected = _folders(tmp_path, "base", range(100, 101))
    push_folder(base[0], location, "ds", progress=False)
    for r in range(_ROUNDS):
        folders, more = _folders(tmp_path, f"rev{r}", range(r * 10, r * 10 + _PUSHERS))
        expected.update(more)
        results = _race(location, folders, replace=True)
        assert _shown(results) == []
        listed = _check_index(location, expected, tmp_path / f"cache{r}")
        for _, done in results:
            assert done.entry.revision in listed  # no pusher's revision was lost
    assert len(listed) == 1 + _ROUNDS * _PUSHERS


def test_racing_replacing_pushes_of_a_new_entry_keep_every_revision(location, tmp_path):
    folders, expected = _folders(tmp_path, "fresh", range(_PUSHERS))
    results = _race(location, folders, replace=True)
    assert _shown(results) == []
    listed = _check_index(location, expected, tmp_path / "cache")
    assert sorted(listed) == sorted(done.entry.revision for _, done in results)


def test_racing_pushes_of_the_same_content_all_succeed(location, tmp_path):
    folders = [_local(tmp_path / f"same{i}", 5) for i in range(_PUSHERS)]
    results = _race(location, folders, replace=False)
    assert _shown(results) == []
    revision = _revision_of(folders[0])
    assert {done.entry.revision for _, done in results} == {revision}
    assert _check_index(location, {revision: tree_bytes(folders[0])}, tmp_path / "c") == [revision]


def test_a_new_entry_never_overwrites_a_file_already_at_its_path(location, file_server, tmp_path):
    """Bytes an unlisted push left (or a racing pusher holds) stay; the entry goes elsewhere."""
    leftover = b"another pusher's bytes"
    if "://" in location:
        HttpClient(location).write_bytes("ds/data/blob.bin", leftover)
    else:
        (Path(location) / "ds" / "data").mkdir(parents=True)
        (Path(location) / "ds" / "data" / "blob.bin").write_bytes(leftover)
    local = _local(tmp_path / "local", 1)
    entry = push_folder(local, location, "ds", progress=False).entry
    at = entry.file("data/blob.bin").stored_at
    assert at.startswith(".blobs/") and entry.file("meta/info.json").stored_at == "meta/info.json"
    got = pull(location, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    served = file_server.root if "://" in location else Path(location)
    assert (served / "ds" / "data" / "blob.bin").read_bytes() == leftover


def test_exclusive_uploads_refuse_a_taken_path(file_server, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"new")
    for client, served in (
        (LocalFolderClient(tmp_path / "loc"), tmp_path / "loc"),
        (HttpClient(file_server.url), file_server.root),
    ):
        client.upload(src, "a/x.bin", exclusive=True)  # free: created
        (served / "a" / "x.bin").write_bytes(b"old")
        with pytest.raises(RemoteChangedError, match="x.bin"):
            client.upload(src, "a/x.bin", exclusive=True)
        assert (served / "a" / "x.bin").read_bytes() == b"old"
        assert sorted(p.name for p in (served / "a").iterdir()) == ["x.bin"]  # no temporary left


def _always_beaten(monkeypatch, location: str) -> None:
    """Every index write loses to another writer that adds an entry just before it."""
    cls = HttpClient if "://" in location else LocalFolderClient
    real = cls.write_bytes
    count = iter(range(1000))
    empty = RemoteFile("x.bin", 0, hashlib.sha256(b"").hexdigest())

    def beaten(self, rel, data, **kw):
        if rel == "index.json":
            data_now, etag = self.read_bytes(rel, limit=1 << 30)
            entries = parse_index(data_now)
            name = f"other{next(count)}"
            entries[name] = RemoteEntry(name, "assets", (empty,))
            real(self, rel, dump_index(entries.values()), if_match=etag)
        return real(self, rel, data, **kw)

    monkeypatch.setattr(cls, "write_bytes", beaten)
    monkeypatch.setattr(backend, "_BACKOFF_S", (0.0, 0.0))


def test_a_pusher_that_keeps_losing_the_race_gets_a_conflict_error(
    location, tmp_path, monkeypatch, capsys
):
    first = _local(tmp_path / "first", 1)
    push_folder(first, location, "ds", progress=False)
    _always_beaten(monkeypatch, location)
    second = _local(tmp_path / "second", 2)
    with pytest.raises(IndexConflictError, match=r"16 times in a row while pushing 'ds'"):
        push_folder(second, location, "ds", replace=True, progress=False)
    assert main(["push", str(second), location, "ds", "--replace", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing of this push is listed: run it again" in err[0]
    monkeypatch.undo()
    entry = RemoteCatalog(location)["ds"]  # the earlier revision, untouched, and nothing else
    assert [r.revision for r in entry.revisions] == [_revision_of(first)]
    got = pull(location, "ds", cache_dir=tmp_path / "c", progress=False)
    assert tree_bytes(got) == tree_bytes(first)
