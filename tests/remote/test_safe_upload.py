"""The one rule for what may be uploaded: complete files only (torchstore.remote.safe_upload)."""

from __future__ import annotations

import json
import os
import struct

import h5py
import pytest
import torch

from tests.remote.remote_fixtures import COLUMNS, episode, mp4_box, mp4_bytes, parquet_bytes
from torchstore.data import TrajectoryStoreWriter
from torchstore.remote import is_safe_to_upload
from torchstore.remote.safe_upload import DEAD_WRITER_STORE, LIVE_STORE, upload_refusal


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "data", "safe"),
    [
        ("ep.parquet", parquet_bytes(), True),
        ("ep.parquet", parquet_bytes()[:-3], False),
        ("ep.parquet", b"PAR1" + b"\0" * 20, False),
        ("ep.parquet", b"nope" * 10, False),
        ("ep.mp4", mp4_bytes(), True),
        (
            "ep.mp4",
            mp4_box(b"ftyp", b"isom\0\0\0\0") + mp4_box(b"mdat", b"\0" * 64, size=0),
            False,
        ),  # size 0: unfinalised
        (
            "ep.mp4",
            mp4_box(b"ftyp", b"isom\0\0\0\0") + mp4_box(b"mdat", b"\0" * 64),
            False,
        ),  # no moov yet
        ("ep.mp4", mp4_bytes()[:-5], False),  # truncated
        (
            "ep.mp4",
            mp4_box(b"ftyp", b"isom\0\0\0\0")
            + b"\0\0\0\1mdat"
            + struct.pack(">Q", 24)
            + b"\0" * 8
            + mp4_box(b"moov"),
            True,
        ),
        ("info.json", b'{"a": 1}', True),
        ("info.json", b'{"a": ', False),
        ("episodes.jsonl", b'{"a": 1}\n{"a": 2}\n', True),
        ("episodes.jsonl", b'{"a": 1}\n{"a": ', False),
        ("episodes.jsonl", b"", True),
        ("notes.txt", b"anything", True),
        ("store.h5", b"not hdf5 at all" * 4, False),
        ("w.safetensors", b"\x10\0\0\0\0\0\0\0{}", False),
    ],
)
def test_format_completeness(tmp_path, name, data, safe):
    assert is_safe_to_upload(_write(tmp_path / name, data)) is safe


@pytest.mark.parametrize(
    "name",
    [
        "a.parquet.tmp",
        "a.tmp-123",
        ".info.json.tmp-42",
        "store.h5.lock",
        "v.mp4.partial",
        "f.incomplete",
        "f.part",
        "f.swp",
        "f~",
        ".hidden",
    ],
)
def test_scratch_and_lock_files_are_never_uploaded(tmp_path, name):
    assert not is_safe_to_upload(_write(tmp_path / name, b"x"))


def test_a_file_claimed_by_a_lock_is_not_uploaded(tmp_path):
    video = _write(tmp_path / "ep.mp4", mp4_bytes())
    lock = _write(tmp_path / "ep.mp4.lock", b"")
    assert upload_refusal(video) == "claimed by ep.mp4.lock"
    lock.unlink()
    assert is_safe_to_upload(video)


def test_hidden_folders_below_the_root_are_scratch(tmp_path):
    f = _write(tmp_path / "rec" / ".cache" / "x.json", b"{}")
    assert not is_safe_to_upload(f, root=tmp_path / "rec")
    assert is_safe_to_upload(
        _write(tmp_path / "rec" / "meta" / "x.json", b"{}"), root=tmp_path / "rec"
    )


def test_symlinks_folders_and_missing_files(tmp_path):
    target = _write(tmp_path / "secret.json", b"{}")
    (tmp_path / "link.json").symlink_to(target)
    assert upload_refusal(tmp_path / "link.json") == "a symlink (never followed)"
    assert upload_refusal(tmp_path) == "not a regular file"
    assert upload_refusal(tmp_path / "gone") == "it does not exist (any more)"


def test_recently_modified_files_wait_when_asked(tmp_path):
    f = _write(tmp_path / "x.txt", b"x")
    mtime = f.stat().st_mtime
    assert is_safe_to_upload(f)
    assert not is_safe_to_upload(f, min_age_s=5, now=mtime + 1)
    assert is_safe_to_upload(f, min_age_s=5, now=mtime + 6)


def test_safetensors_complete_and_truncated(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    path = tmp_path / "w.safetensors"
    st.save_file({"w": torch.arange(100.0)}, str(path))
    assert is_safe_to_upload(path)
    data = path.read_bytes()
    assert not is_safe_to_upload(_write(tmp_path / "cut.safetensors", data[:-10]))


def test_torchstore_store_is_safe_only_without_a_live_writer(tmp_path):
    path = tmp_path / "store.h5"
    writer = TrajectoryStoreWriter(path, COLUMNS)
    writer.add_episode(episode(0))
    assert upload_refusal(path) == LIVE_STORE  # SWMR writer: superblock flags set, no lock kept
    writer.close()
    assert is_safe_to_upload(path)
    with TrajectoryStoreWriter.resume(path) as w:
        assert not is_safe_to_upload(path)
        w.add_episode(episode(1))
    assert is_safe_to_upload(path)


def test_plain_hdf5_writer_is_detected_by_its_lock(tmp_path):
    path = tmp_path / "plain.h5"
    f = h5py.File(path, "w")  # superblock v0: no flags, but an exclusive lock while open
    f["x"] = [1, 2, 3]
    f.flush()
    assert upload_refusal(path) == LIVE_STORE
    f.close()
    assert is_safe_to_upload(path)


def test_killed_writer_leaves_the_store_unsafe(tmp_path):
    from tests.forked import run_forked

    path = tmp_path / "store.h5"

    def write_then_die():
        w = TrajectoryStoreWriter(path, COLUMNS)
        w.add_episode(episode(0))
        os._exit(0)  # no close: flags stay set, as after SIGKILL

    assert run_forked(write_then_die)[0] == "ok"
    assert upload_refusal(path) == DEAD_WRITER_STORE  # its writer lock is no longer held
    json.dumps(upload_refusal(path))  # a plain string reason
