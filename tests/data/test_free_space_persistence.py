"""Stores do not persist their free-space state; stores written when they did still work.

A store that persists its free-space state rewrites the superblock extension and its
free-space managers at every open for writing and every close, so a kill inside a close and
another inside the next resume could leave the extension unreadable ("invalid file space
strategy"). New stores keep paged file space without persisting it: the extension stays
where it is with the same content. Stores created before (persisted free-space state) still
open, resume and recover.
"""

from __future__ import annotations

import os
import re
import struct

import h5py
import pytest

import torchstore.io.hdf5.files as hdf5
from tests.data.test_crash_safety import (
    COLUMNS,
    _check,
    _resume_and_die,
    _resume_and_extend,
    _set_superblock,
    _superblock_extension_continuation,
    episode_rows,
)
from tests.forked import run_forked
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter


def _strategy(path) -> tuple:
    with h5py.File(path, "r", swmr=True) as f:
        return f.id.get_create_plist().get_file_space_strategy()


def _extension(path) -> tuple[int, bytes]:
    """Where the superblock extension is and what its header holds, timestamps and
    checksum left out (a close rewrites it in place with new times)."""
    data = open(path, "rb").read()
    (ext,) = struct.unpack_from("<Q", data, 20)
    assert data[ext : ext + 4] == b"OHDR" and data[ext + 4] == 2
    flags = data[ext + 5]
    pos = ext + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    end = pos + width + int.from_bytes(data[pos : pos + width], "little")
    return ext, data[ext : ext + 6] + data[pos:end]


def _store(path, episodes: int) -> None:
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i in range(episodes):
            w.add_episode(episode_rows(i), metadata={"i": i})


@pytest.fixture
def old_format(monkeypatch):
    """New stores are created as torchstore created them before: free-space state persisted."""

    def create_in_place(path, build):
        with h5py.File(
            path, "w", libver="latest", fs_strategy="page", fs_page_size=4096, fs_persist=True
        ) as f:
            build(f)

    monkeypatch.setattr(hdf5, "create_in_place", create_in_place)


def test_a_store_keeps_paged_space_and_never_moves_or_changes_its_extension(tmp_path):
    path = str(tmp_path / "s.h5")
    _store(path, 2)
    strategy, persist, _ = _strategy(path)
    assert strategy == h5py.h5f.FSPACE_STRATEGY_PAGE and not persist
    first, size = _extension(path), os.path.getsize(path)
    for i in (2, 3, 4):  # resumed and closed: no free-space state is written
        with TrajectoryStoreWriter.resume(path) as w:
            w.add_episode(episode_rows(i), metadata={"i": i})
        assert _extension(path) == first
    with TrajectoryStoreWriter.resume(path):
        pass
    assert os.path.getsize(path) > size  # (the episodes took room)
    grown = os.path.getsize(path)
    for _ in range(3):  # an open and close without writes does not grow the file
        TrajectoryStoreWriter.resume(path).close()
    assert os.path.getsize(path) == grown
    assert b"FSHD" not in open(path, "rb").read()  # no free-space manager on disk
    _check(path, 5)


def test_a_store_with_persisted_free_space_still_opens_resumes_and_recovers(tmp_path, old_format):
    path = str(tmp_path / "old.h5")
    _store(path, 3)
    assert _strategy(path)[1], "the fixture did not make an old-format store"
    _check(path, 3)
    for i in (3, 4):  # closed cleanly twice: free-space state persisted
        with TrajectoryStoreWriter.resume(path) as w:
            w.add_episode(episode_rows(i), metadata={"i": i})
    assert b"FSHD" in open(path, "rb").read()
    assert run_forked(_resume_and_die, path, timeout=120)[0] == "crashed"
    status, text = run_forked(_check, path, 5)
    assert status == "ok", f"{status}: {text}"
    status, text = run_forked(_resume_and_extend, path, 5, timeout=120)
    assert status == "ok", f"{status}: {text}"
    _check(path, 7)
    assert _strategy(path)[1]  # the store keeps the layout it was made with


def test_an_old_stores_stale_free_space_info_is_not_trusted(tmp_path, old_format):
    """The free-space managers an old store persisted at its last close may be reused or
    half-rewritten by a writer that is then killed; recovery must not load them."""
    path = str(tmp_path / "s.h5")
    _store(path, 3)
    for i in (3, 4):
        with TrajectoryStoreWriter.resume(path) as w:
            w.add_episode(episode_rows(i), metadata={"i": i})
    assert run_forked(_resume_and_die, path, timeout=120)[0] == "crashed"
    data = bytearray(open(path, "rb").read())
    headers = [m.start() for m in re.finditer(b"FSHD", bytes(data))]
    assert headers, "no persisted free-space manager to damage"
    for start in headers:
        data[start + 6] ^= 0xFF  # inside each free-space header, past its signature
    with open(path, "wb") as f:
        f.write(bytes(data))
    status, text = run_forked(_resume_and_extend, path, 5, timeout=120)
    assert status == "ok", f"{status}: {text}"
    status, text = run_forked(_check, path, 7)
    assert status == "ok", f"{status}: {text}"


def test_an_old_store_killed_in_close_before_its_superblock_write_is_resumed(tmp_path, old_format):
    """An old store's close moves the superblock extension's continuation chunk past the
    end-of-allocation its superblock records; a kill before that superblock write must not
    make the next resume fail with "addr overflow"."""
    path = str(tmp_path / "s.h5")
    _store(path, 3)
    assert run_forked(_resume_and_die, path, timeout=120)[0] == "crashed"
    eoa_at_open = os.path.getsize(path)
    TrajectoryStoreWriter.resume(path).close()
    moved_to = _superblock_extension_continuation(open(path, "rb").read())
    assert moved_to >= eoa_at_open, "close did not move the chunk past the old end"
    _set_superblock(path, flags=0x05, eoa=moved_to)
    status, text = run_forked(_check, path, 3)
    assert status == "ok", f"{status}: {text}"
    status, text = run_forked(_resume_and_extend, path, 3, timeout=120)
    assert status == "ok", f"{status}: {text}"
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 5
