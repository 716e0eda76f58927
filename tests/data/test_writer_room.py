"""A commit under a small file-size limit: the room the writer asks for beyond the rows is
what a commit of this store can take (a chunk of each table, and metadata), not a fixed
4 MiB, so the commits go in until the file is full, and the refusal writes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchstore.data.store.verify import verify_store

_UNDER_A_LIMIT = """
import resource, signal, sys
import numpy as np
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.errors import StorageFullError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails, not the process
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
columns = [ColumnSpec("obs", "float32", (8,)), ColumnSpec("image", "uint8", (32, 32, 3))]
committed = 0
try:
    with TrajectoryStoreWriter(sys.argv[1], columns) as w:
        for _ in range(1000):
            w.add_episode(
                {
                    "obs": np.zeros((50, 8), dtype=np.float32),
                    "image": np.ones((50, 32, 32, 3), dtype=np.uint8),
                }
            )
            committed += 1
except StorageFullError as exc:
    print(committed, str(exc))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_a_small_file_size_limit_takes_commits_until_it_is_full(tmp_path):
    # a fixed 4 MiB margin refused the first commit under any limit up to 4 MiB
    path = tmp_path / "s.h5"
    limit = 2_000_000
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_LIMIT, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    committed, message = done.stdout.split(" ", 1)
    assert int(committed) >= 5, done.stdout  # 155 KB an episode
    assert "File too large" in message and "nothing was written" in message
    assert path.stat().st_size <= limit
    report = verify_store(path, progress=False)
    assert report.ok and report.episodes == int(committed)
