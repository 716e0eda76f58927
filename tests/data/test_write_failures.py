"""A full disk (or a file-size limit) while writing: a StorageFullError naming the store, and
every committed episode intact. Real subprocesses with RLIMIT_FSIZE play the full disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter

COLUMNS = [ColumnSpec("x", torch.float32, (256,))]
ROWS = 500  # 512 KB an episode

SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import numpy as np
    from torchstore.data import TrajectoryStoreWriter
    from torchstore.errors import StorageFullError

    path, bypass_check = sys.argv[1], sys.argv[2] == "1"
    if bypass_check:  # another process fills the disk between the check and the write
        TrajectoryStoreWriter._check_room = lambda self, nbytes: None
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    limit = os.path.getsize(path) + 8_000_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    w = TrajectoryStoreWriter.resume(path)
    try:
        for i in range(3, 1000):
            w.add_episode({"x": np.full((500, 256), i, np.float32)})
    except StorageFullError as exc:
        assert isinstance(exc, OSError) and exc.errno == 27 and exc.filename == path, exc
        print("COMMITTED", w.num_episodes, flush=True)
        print("ERROR", exc, flush=True)
    else:
        raise AssertionError("the file-size limit was never met")
    try:
        w.end_episode()  # the disk is still full
    except StorageFullError as exc:
        print("AGAIN", type(exc).__name__, flush=True)
    if bypass_check:
        # HDF5 cannot close a file after a refused write; leave without trying
        os._exit(0)
    w.close()
    """
)


def _store(path) -> None:
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i in range(3):
            w.add_episode({"x": np.full((ROWS, 256), i, np.float32)})


def _run(path, bypass: bool) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), "1" if bypass else "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    return int(lines["COMMITTED"]), lines["ERROR"], lines.get("AGAIN", "")


def _check_intact(path, committed: int) -> None:
    with TrajectoryStore(path) as store:
        assert store.num_episodes == committed
        for i in range(committed):
            assert np.array_equal(
                store.episode(i)["x"].numpy(), np.full((ROWS, 256), i, np.float32)
            )
    with TrajectoryStoreWriter.resume(path) as w:  # and the store goes on once there is room
        w.add_episode({"x": np.full((ROWS, 256), committed, np.float32)})
    with TrajectoryStore(path) as store:
        assert store.num_episodes == committed + 1


def test_a_full_disk_is_refused_before_hdf5_writes(tmp_path):
    path = tmp_path / "full.h5"
    _store(path)
    committed, error, again = _run(path, bypass=False)
    assert committed > 3  # some episodes fit before the limit
    assert str(path) in error and "File too large" in error
    assert f"the {committed} committed episodes" in error and "are intact" in error
    assert again == "StorageFullError"
    _check_intact(path, committed)


@pytest.mark.parametrize("bypass", [True])
def test_a_write_the_disk_refuses_midway_is_a_storage_full_error(tmp_path, bypass):
    path = tmp_path / "race.h5"
    _store(path)
    committed, error, again = _run(path, bypass=bypass)
    assert committed > 3
    assert str(path) in error and "File too large" in error and "are intact" in error
    assert again == "StorageFullError"
    _check_intact(path, committed)


CREATE = textwrap.dedent(
    """
    import resource, signal, sys
    import torch
    from torchstore.data import ColumnSpec, TrajectoryStoreWriter
    from torchstore.errors import StorageFullError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (5000, resource.RLIM_INFINITY))
    try:
        TrajectoryStoreWriter(sys.argv[1], [ColumnSpec("x", torch.float32, (256,))])
    except StorageFullError as exc:
        print("ERROR", exc)
    """
)


def test_no_room_to_create_a_store_is_a_storage_full_error(tmp_path):
    path = tmp_path / "new.h5"
    proc = subprocess.run(
        [sys.executable, "-c", CREATE, str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ERROR") and f"{path}: no room to create the store" in proc.stdout
    assert not path.exists() and not any(tmp_path.glob(".new.h5*"))
