"""verify's two ways of reading: the chunk pass (each chunk read at its file offset and
hashed where it landed) and h5py slabs. Both give the same report; the chunk pass is the
one a plain store file takes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.damage import flip_chunk_byte
from torchstore.data import TrajectoryStore
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.store import verify

EPISODES, STEPS = 30, 101  # 3,030 rows: several blocks of images, the last partly filled


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "images.h5"
    rng = np.random.default_rng(1)
    columns = [ColumnSpec("image", "uint8", (32, 32, 3)), ColumnSpec("obs", "float32", (5,))]
    with TrajectoryStoreWriter(path, columns) as w:
        for _ in range(EPISODES):
            w.add_episode(
                {
                    "image": rng.integers(0, 256, (STEPS, 32, 32, 3), dtype=np.uint8),
                    "obs": rng.standard_normal((STEPS, 5), dtype=np.float32),
                }
            )
    return path


def _flip(path, column: str, chunk: int, at: int = 3) -> None:
    flip_chunk_byte(path, f"columns/{column}", chunk, at, mask=0x40)


def _both(path, monkeypatch) -> tuple[verify.Verification, verify.Verification]:
    reads = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda *a: reads.append(a[2]) or real(*a))
    by_chunks = verify.verify_store(path, progress=False)
    assert reads, "the chunk pass did not run"
    monkeypatch.setattr(verify, "_chunk_file", lambda store: -1)
    by_slabs = verify.verify_store(path, progress=False)
    return by_chunks, by_slabs


def test_a_healthy_store_checks_the_same_bytes_both_ways(store, monkeypatch):
    by_chunks, by_slabs = _both(store, monkeypatch)
    assert by_chunks.ok and by_slabs.ok
    assert by_chunks.bytes_checked == by_slabs.bytes_checked > 0


def test_damage_is_reported_the_same_both_ways(store, monkeypatch):
    with TrajectoryStore(store) as s:
        last = s._ds.columns["image"].data.id.get_num_chunks() - 1
    assert last >= 2
    _flip(store, "image", 1)
    _flip(store, "image", last)  # the partly filled last block
    _flip(store, "obs", 0, at=1)
    by_chunks, by_slabs = _both(store, monkeypatch)
    assert not by_chunks.ok and len(by_chunks.problems) == 3, by_chunks.problems
    assert by_chunks.problems == by_slabs.problems
    assert f"..{EPISODES * STEPS - 1} fail their checksum" in by_chunks.problems[1]
