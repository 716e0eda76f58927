"""What the writer refuses, and how: a resume while a reader has the file open, a column
HDF5 cannot hold. Each is a torchstore error in one line naming what is wrong, and the
store keeps what it had."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from torchstore.data import TrajectoryStore
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.store.verify import verify_store
from torchstore.errors import ColumnError, StoreLockedError


def _store(path, episodes: int = 2):
    with TrajectoryStoreWriter(path, [ColumnSpec("obs", "float32", (2,))]) as w:
        for i in range(episodes):
            w.add_episode({"obs": np.full((3, 2), i, dtype=np.float32)})
    return path


def _refused_plainly(exc: BaseException, path) -> str:
    message = str(exc)
    assert str(path) in message and "\n" not in message
    assert "damaged" not in message, message  # nothing is damaged
    return message


def test_resume_while_this_process_reads_the_store_is_refused_plainly(tmp_path):
    path = _store(tmp_path / "s.h5")
    with TrajectoryStore(path) as reader:
        with pytest.raises(StoreLockedError) as refused:
            TrajectoryStoreWriter.resume(path)
        assert "open for reading in this process" in _refused_plainly(refused.value, path)
        assert reader.num_episodes == 2
    with TrajectoryStoreWriter.resume(path) as w:  # once the reader is closed
        w.add_episode({"obs": np.zeros((3, 2), dtype=np.float32)})
    assert verify_store(path, progress=False).episodes == 3


_READER = """
import sys, time
from torchstore.data import TrajectoryStore
store = TrajectoryStore(sys.argv[1])
print("open", flush=True)
time.sleep(600)
"""


def test_resume_while_another_process_reads_the_store_is_a_torchstore_error(tmp_path):
    path = _store(tmp_path / "s.h5")
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline() == "open\n"
        with pytest.raises(StoreLockedError) as refused:  # was a bare OSError
            TrajectoryStoreWriter.resume(path)
        assert "open in another process" in _refused_plainly(refused.value, path)
    finally:
        reader.kill()
        reader.wait()
    assert verify_store(path, progress=False).ok


@pytest.mark.parametrize(
    ("shape", "words"),
    [((1,) * 1000, "1000 dimensions per row; a store keeps at most 31"), ((1 << 31, 3), "4 GiB")],
)
def test_a_column_hdf5_cannot_hold_is_a_column_error_before_any_file(tmp_path, shape, words):
    path = tmp_path / "s.h5"
    with pytest.raises(ColumnError, match="column 'wide'") as refused:
        TrajectoryStoreWriter(path, [ColumnSpec("wide", "uint8", shape)])
    assert words in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_new_store_whose_first_episode_is_refused_is_not_left_behind(tmp_path):
    """A first write refused (a wrong frame size, say) leaves no empty store where the store
    was to be, ``overwrite=True`` or not; one committed episode keeps the store."""
    columns = [ColumnSpec("cam", torch.uint8, (8, 8, 3)), ColumnSpec("a", torch.float32, (2,))]
    good = {"cam": np.zeros((3, 8, 8, 3), np.uint8), "a": np.zeros((3, 2), np.float32)}
    bad = {"cam": np.zeros((3, 4, 4, 3), np.uint8), "a": np.zeros((3, 2), np.float32)}
    path = tmp_path / "new.h5"
    for overwrite in (False, True):
        with pytest.raises(ColumnError, match="expects rows of shape"):
            with TrajectoryStoreWriter(path, columns, overwrite=overwrite) as writer:
                writer.add_episode(bad)
        assert not path.exists()
    with pytest.raises(ColumnError):
        with TrajectoryStoreWriter(path, columns) as writer:
            writer.add_episode(good)
            writer.add_episode(bad)
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 1
