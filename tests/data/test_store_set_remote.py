"""A shard folder pushed, synced and pulled: a new shard uploads alone, the pull opens as a set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.data.test_store_set import WRITER, _check_episodes, _write
from torchstore.data import StoreSet
from torchstore.remote import pull, sync_recording
from torchstore.remote.upload import push_folder


@pytest.fixture(autouse=True)
def _quiet_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    monkeypatch.setenv("TORCHSTORE_OFFLINE", "0")


def test_push_of_a_shard_folder_sends_only_the_new_shard(tmp_path):
    folder, remote = tmp_path / "shards", tmp_path / "remote"
    folder.mkdir()
    remote.mkdir()
    for k in range(2):
        _write(folder / f"collector-{k}.h5", k, [2, 3])
    first = push_folder(folder, remote, "runs", progress=False)
    assert sorted(first.uploaded) == ["collector-0.h5", "collector-1.h5"]
    assert push_folder(folder, remote, "runs", progress=False).up_to_date
    _write(folder / "collector-2.h5", 2, [2])
    second = push_folder(folder, remote, "runs", replace=True, progress=False)
    assert second.uploaded == ("collector-2.h5",)
    with StoreSet(pull(remote, "runs", progress=False)) as shards:
        assert _check_episodes(shards) == {0: 2, 1: 2, 2: 1}


def test_sync_of_a_shard_folder_while_collectors_write(tmp_path):
    """Finished shards go once; a live shard goes as a snapshot of its committed episodes,
    again only when it grew; the pulled folder opens as a set."""
    folder, remote = tmp_path / "shards", tmp_path / "remote"
    folder.mkdir()
    remote.mkdir()
    _write(folder / "collector-0.h5", 0, [2, 3])
    live = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder / "collector-1.h5"), "1", "100000", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in live.stdout:
            if int(line) >= 3:
                break
        first = sync_recording(folder, remote, "runs")
        assert sorted(first.uploaded) == ["collector-0.h5", "collector-1.h5"]
        _write(folder / "collector-2.h5", 2, [2])
        second = sync_recording(folder, remote, "runs")
        assert "collector-0.h5" not in second.uploaded and "collector-2.h5" in second.uploaded
        with StoreSet(pull(remote, "runs", progress=False)) as shards:
            seen = _check_episodes(shards)
        assert seen[0] == 2 and seen[1] >= 4 and seen[2] == 1
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.wait()
