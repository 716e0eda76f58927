"""``resume()`` on a damaged store fails promptly with a StoreFormatError, never hangs.

HDF5's default metadata retries held a writer on one flipped bit of an object header for
minutes; the writer's opens cap them as readers' do. Each resume runs in a forked child
with a deadline, so a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import random

import h5py
import numpy as np
import pytest
import torch

from tests.forked import run_forked
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import StoreFormatError, TorchstoreError

COLS = [ColumnSpec("x", torch.float32, (4,))]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("damaged") / "good.h5"
    with TrajectoryStoreWriter(path, COLS) as w:
        for i in range(5):
            w.add_episode({"x": np.full((500, 4), i, np.float32)}, metadata={"i": i})
    return path


def _header_start(path, name: str) -> int:
    data = open(path, "rb").read()
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[name].id).addr
    assert data[addr : addr + 4] == b"OHDR"
    return addr


def _damaged_copy(pristine, tmp_path, offset: int, bit: int):
    data = bytearray(pristine.read_bytes())
    data[offset] ^= 1 << bit
    bad = tmp_path / f"bad-{offset}-{bit}.h5"
    bad.write_bytes(bytes(data))
    return bad


def _resume_expecting_format_error(path) -> None:
    with pytest.raises(StoreFormatError, match="cannot be opened for appending"):
        TrajectoryStoreWriter.resume(path)


def test_a_flipped_bit_in_a_checksum_table_header_fails_resume_fast(pristine, tmp_path):
    start = _header_start(pristine, "checksums/columns/x")
    bad = _damaged_copy(pristine, tmp_path, start + 30, 2)
    status, text = run_forked(_resume_expecting_format_error, bad, timeout=60)
    assert status == "ok", f"{status}: {text}"
    with pytest.raises(TorchstoreError):  # readers fail on it too
        with TrajectoryStore(bad) as store:
            store.read_slab(0, store.num_rows)


def _resume_any_outcome(path) -> None:
    try:
        TrajectoryStoreWriter.resume(path).close()
    except TorchstoreError:
        pass


def test_flipped_bits_in_object_headers_never_hold_resume(pristine, tmp_path):
    rng = random.Random(3)
    for name in ("checksums/columns/x", "columns/x", "episodes/index", "commit"):
        start = _header_start(pristine, name)
        for _ in range(3):
            bad = _damaged_copy(pristine, tmp_path, start + rng.randrange(4, 200), rng.randrange(8))
            status, text = run_forked(_resume_any_outcome, bad, timeout=60)
            assert status == "ok", f"{name}: {status}: {text}"
