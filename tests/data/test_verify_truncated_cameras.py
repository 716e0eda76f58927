"""``verify`` of a camera store cut short: the truncation is reported as damage, never raised.

A store's chunk index outgrows its first nodes; cut the file and HDF5 finds the later
nodes gone ("incorrect metadata checksum") when the index is walked for the chunks' file
offsets. Those chunks are then read through the tables' checked read, which reports them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.store.verify import verify_store
from torchstore.errors import IntegrityError
from torchstore.io.frames.codec import FrameCodec
from torchstore.io.hdf5.checksummed import chunk_file_offsets

CUTS = 21


@pytest.fixture(scope="module")
def camera_store(tmp_path_factory):
    """About 10 MB of PNG packets (noise frames: big packets fast), 80-odd chunks of them."""
    path = tmp_path_factory.mktemp("cameras") / "cams.h5"
    rng = np.random.default_rng(0)
    columns = [
        ColumnSpec("cam", torch.uint8, (96, 128, 3), codec=FrameCodec.png()),
        ColumnSpec("action", torch.float32, (2,)),
    ]
    with TrajectoryStoreWriter(path, columns) as w:
        for _ in range(10):
            w.add_episode(
                {
                    "cam": rng.integers(0, 256, (28, 96, 128, 3), dtype=np.uint8),
                    "action": np.zeros((28, 2), np.float32),
                }
            )
    return path


def _cut(src, dest, k: int):
    shutil.copy(src, dest)
    os.truncate(dest, os.path.getsize(src) * k // (CUTS + 1))
    return dest


def test_every_truncation_is_reported_as_damage(camera_store, tmp_path):
    walked_off = 0  # cuts whose packets' chunk index HDF5 could not walk to its end
    for k in range(1, CUTS + 1):
        path = _cut(camera_store, tmp_path / "cut.h5", k)
        report = verify_store(path, progress=False)
        assert not report.ok, f"cut {k}: {report.verdict()}"
        assert len(report.verdict().splitlines()) == 1
        assert any("column 'cam'" in p for p in report.problems), report.problems
        with TrajectoryStore(path) as store:
            table = store._ds.packets["cam"]
            chunks = -(-table.data.shape[0] // table.block_rows)
            try:
                table.data.id.chunk_iter(lambda info: None)
            except RuntimeError:
                walked_off += 1
                offsets = chunk_file_offsets(table.data, table.block_rows, chunks)
                assert (offsets == -1).any() and (offsets[:1] >= 0).all()
            with pytest.raises(IntegrityError):
                store.read_column("cam", 0, store.num_rows)
    assert walked_off > CUTS // 2  # the case this guards: most cuts break the chunk index


def test_the_cli_prints_one_line_and_exits_1(camera_store, tmp_path):
    path = _cut(camera_store, tmp_path / "cut.h5", CUTS // 2)
    run = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "DAMAGED" in line]
    assert len(lines) == 1 and "column 'cam' packets rows" in lines[0], run.stderr
