"""Sync a recording while another process is still writing it: everything uploaded is complete."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.remote.remote_fixtures import (
    COLUMNS,
    assert_store_matches,
    episode,
    mp4_bytes,
    parquet_bytes,
)
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter
from torchstore.remote import pull, sync_recording
from torchstore.remote.safe_upload import is_safe_to_upload

EPISODES = 6


def _payload(i: int) -> bytes:
    return f"episode {i} rows ".encode() * 200


def _record(root):
    """The writer: a torchstore store plus LeRobot-like files, some written in place."""
    (root / "data").mkdir(parents=True)
    (root / "videos").mkdir()
    (root / "meta").mkdir()
    with TrajectoryStoreWriter(root / "store.h5", COLUMNS, env_id="live") as w:
        for i in range(EPISODES):
            w.add_episode(episode(i), metadata={"i": i})
            data = parquet_bytes(_payload(i))
            with open(
                root / "data" / f"episode_{i:06d}.parquet", "wb"
            ) as f:  # in place, no temp name
                f.write(data[: len(data) // 2])
                f.flush()
                time.sleep(0.04)
                f.write(data[len(data) // 2 :])
            lock = root / "videos" / f"episode_{i:06d}.mp4.lock"
            lock.write_bytes(b"")
            (root / "videos" / f"episode_{i:06d}.mp4").write_bytes(
                mp4_bytes()[:20]
            )  # being encoded
            time.sleep(0.04)
            (root / "videos" / f"episode_{i:06d}.mp4").write_bytes(mp4_bytes())
            lock.unlink()
            with open(root / "meta" / "episodes.jsonl", "a") as f:  # appended in two writes
                line = json.dumps({"episode": i, "length": 50})
                f.write(line[:5])
                f.flush()
                time.sleep(0.02)
                f.write(line[5:] + "\n")
            tmp = root / "meta" / f".info.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps({"episodes": i + 1}))
            os.replace(tmp, root / "meta" / "info.json")  # metadata written atomically
            (root / "scratch.tmp").write_bytes(b"half")
            time.sleep(0.05)


def _check_pulled(path):
    """Everything pulled is complete and loads."""
    files = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    for rel in files:
        assert is_safe_to_upload(path / rel), rel
        assert not rel.endswith((".tmp", ".lock")), rel
    if "store.h5" in files:
        with TrajectoryStore(path / "store.h5") as store:
            n = store.num_episodes
        assert n >= 1
        assert_store_matches(path / "store.h5", n)
    for rel in files:
        if rel.endswith(".parquet"):
            i = int(rel[-14:-8])
            assert (path / rel).read_bytes() == parquet_bytes(_payload(i))
        elif rel.endswith(".mp4"):
            assert (path / rel).read_bytes() == mp4_bytes()
    if "meta/info.json" in files:
        assert 1 <= json.loads((path / "meta/info.json").read_text())["episodes"] <= EPISODES
    if "meta/episodes.jsonl" in files:
        lines = (path / "meta/episodes.jsonl").read_text().splitlines()
        assert [json.loads(line)["episode"] for line in lines] == list(range(len(lines)))
    return files


def test_sync_while_a_writer_appends(file_server, tmp_path):
    root = tmp_path / "rec"
    pid = os.fork()
    if pid == 0:  # the writer process
        status = 1
        try:
            _record(root)
            status = 0
        finally:
            os._exit(status)
    try:
        syncs, seen_live_snapshot, deadline = 0, False, time.monotonic() + 40
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if root.exists():
                result = sync_recording(root, file_server.url, "rec")
                syncs += 1
                if result.entry is not None:
                    store = result.entry.file("store.h5")
                    seen_live_snapshot |= store is not None and (store.source or "").startswith(
                        "torchstore-snapshot"
                    )
                    got = pull(
                        file_server.url, "rec", cache_dir=tmp_path / f"pull{syncs}", progress=False
                    )
                    _check_pulled(got)
            if done:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the writer failed"
                break
            time.sleep(0.05)
        else:
            pytest.fail("the writer did not finish in time")
    finally:
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert syncs >= 3 and seen_live_snapshot  # really synced mid-recording, snapshots included

    final = sync_recording(root, file_server.url, "rec")
    assert final.entry.file("store.h5").source is None  # the closed store replaced the snapshot
    got = pull(file_server.url, "rec", cache_dir=tmp_path / "final", progress=False)
    files = _check_pulled(got)
    assert files == {
        "store.h5",
        "meta/info.json",
        "meta/episodes.jsonl",
        *(f"data/episode_{i:06d}.parquet" for i in range(EPISODES)),
        *(f"videos/episode_{i:06d}.mp4" for i in range(EPISODES)),
    }
    assert_store_matches(got / "store.h5", EPISODES)
    puts = len(file_server.puts)
    again = sync_recording(root, file_server.url, "rec")
    assert again.uploaded == () and len(file_server.puts) == puts  # up to date: nothing is written
    assert set(again.unchanged) == files


def test_rerun_uploads_only_what_is_new(file_server, tmp_path):
    root = tmp_path / "rec"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.parquet").write_bytes(parquet_bytes(b"a"))
    (root / "data" / "b.parquet").write_bytes(parquet_bytes(b"b")[:-4])  # still being written
    first = sync_recording(root, file_server.url, "rec")
    assert first.uploaded == ("data/a.parquet",)
    assert first.skipped == (
        ("data/b.parquet", "an incomplete Parquet file (no trailing PAR1 footer)"),
    )
    (root / "data" / "b.parquet").write_bytes(parquet_bytes(b"b"))
    second = sync_recording(root, file_server.url, "rec")
    assert second.uploaded == ("data/b.parquet",) and second.unchanged == ("data/a.parquet",)
    assert file_server.puts.count("rec/data/a.parquet") == 1


def test_live_store_snapshot_is_reused_until_new_episodes(file_server, tmp_path):
    root = tmp_path / "rec"
    root.mkdir()
    writer = TrajectoryStoreWriter(root / "store.h5", COLUMNS)
    try:
        assert sync_recording(root, file_server.url, "rec").skipped == (
            ("store.h5", "an HDF5 store a writer has open, with no committed episode yet"),
        )
        writer.add_episode(episode(0), metadata={"i": 0})
        assert sync_recording(root, file_server.url, "rec").uploaded == ("store.h5",)
        assert (
            sync_recording(root, file_server.url, "rec").uploaded == ()
        )  # same committed episodes
        writer.add_episode(episode(1), metadata={"i": 1})
        result = sync_recording(root, file_server.url, "rec")
        assert result.uploaded == ("store.h5",)
        assert result.entry.file("store.h5").source == "torchstore-snapshot episodes=2 rows=100"
        assert_store_matches(
            pull(file_server.url, "rec", cache_dir=tmp_path / "c", progress=False) / "store.h5", 2
        )
        skipped = sync_recording(root, file_server.url, "rec", snapshot_live_stores=False).skipped
        assert skipped == (("store.h5", "an HDF5 store a writer has open"),)
    finally:
        writer.close()


def test_sync_to_the_hub(hub, tmp_path):
    pytest.importorskip("huggingface_hub")
    root = tmp_path / "rec"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.parquet").write_bytes(parquet_bytes(b"a"))
    assert sync_recording(root, hub.location, "rec").uploaded == ("data/a.parquet",)
    (root / "data" / "b.parquet").write_bytes(parquet_bytes(b"b"))
    result = sync_recording(root, hub.location, "rec")
    assert result.uploaded == ("data/b.parquet",) and result.entry.kind == "recording"
    assert sync_recording(root, hub.location, "rec").uploaded == ()
    got = pull(hub.location, "rec", cache_dir=tmp_path / "c", progress=False)
    assert sorted(p.name for p in (got / "data").iterdir()) == ["a.parquet", "b.parquet"]


def test_sync_needs_a_folder(file_server, tmp_path):
    with pytest.raises(FileNotFoundError, match="no recording folder at"):
        sync_recording(tmp_path / "none", file_server.url, "rec")
