"""check_destination: an output is never a source, a folder, or a file that is not ours."""

from __future__ import annotations

import os
import signal
import stat
import time

import numpy as np
import pytest
import torch

from torchstore.data import ColumnSpec, TrajectoryStoreWriter
from torchstore.errors import DestinationError, DestinationExistsError, StoreLockedError
from torchstore.io.destination import check_destination, is_store_file

COLS = [ColumnSpec("x", torch.float32, (2,))]


def _store(path):
    with TrajectoryStoreWriter(path, COLS) as w:
        w.add_episode({"x": np.zeros((3, 2), np.float32)})
    return path


def test_a_new_path_gets_its_missing_folders(tmp_path):
    dest = tmp_path / "a" / "b" / "out.h5"
    assert check_destination(dest) == dest
    assert dest.parent.is_dir() and not dest.exists()


def test_the_source_is_refused_by_inode_not_by_name(tmp_path):
    src = tmp_path / "motion.csv"
    src.write_text("x\n1\n")
    os.link(src, tmp_path / "alias.csv")
    for dest in (src, tmp_path / "alias.csv", tmp_path / "." / "motion.csv"):
        with pytest.raises(DestinationError, match="is the input"):
            check_destination(dest, sources=[src], overwrite=True, what="file")
    assert src.read_text() == "x\n1\n"


def test_an_output_inside_a_source_folder_is_refused(tmp_path):
    src = tmp_path / "dataset"
    src.mkdir()
    with pytest.raises(DestinationError, match="inside the input folder"):
        check_destination(src / "sub" / "out.h5", sources=[src])
    assert not (src / "sub").exists()
    (src / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(DestinationError, match="holds the input"):
        check_destination(tmp_path, sources=[src / "x.parquet"], what="folder", overwrite=True)


def test_a_directory_is_not_a_file_destination(tmp_path):
    with pytest.raises(DestinationError, match="is a directory"):
        check_destination(tmp_path, overwrite=True)


def test_an_existing_file_needs_overwrite(tmp_path):
    dest = _store(tmp_path / "s.h5")
    with pytest.raises(DestinationExistsError, match="already exists") as info:
        check_destination(dest)
    assert isinstance(info.value, FileExistsError)
    assert check_destination(dest, overwrite=True) == dest


def test_overwrite_still_refuses_a_file_that_is_not_a_store(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    with pytest.raises(DestinationError, match="not a torchstore store") as info:
        check_destination(notes, overwrite=True)
    assert isinstance(info.value, ValueError)
    assert notes.read_text() == "keep me"
    assert check_destination(notes, overwrite=True, what="file") == notes
    assert not is_store_file(notes) and not is_store_file(tmp_path / "missing.h5")


def test_overwrite_refuses_a_store_a_live_process_writes(tmp_path):
    dest = _store(tmp_path / "s.h5")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            writer = TrajectoryStoreWriter.resume(dest)  # noqa: F841 - held until killed
            os.write(write_end, b"1")
            time.sleep(600)
        finally:
            os._exit(1)
    try:
        assert os.read(read_end, 1) == b"1"
        with pytest.raises(StoreLockedError, match=f"process {pid}"):
            check_destination(dest, overwrite=True)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert check_destination(dest, overwrite=True) == dest  # its writer is dead now


def test_folder_destinations(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_destination(empty, what="folder") == empty
    (empty / "f").write_text("x")
    with pytest.raises(DestinationExistsError, match="not empty"):
        check_destination(empty, what="folder")
    assert check_destination(empty, what="folder", overwrite=True) == empty
    with pytest.raises(DestinationError, match="must be a folder"):
        check_destination(empty / "f", what="folder", overwrite=True)
    with pytest.raises(ValueError, match="what"):
        check_destination(empty, what="thing")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_parent_is_named(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(DestinationError, match=f"{ro}"):
            check_destination(ro / "out.h5")
        with pytest.raises(DestinationError, match="cannot create the folder"):
            check_destination(ro / "sub" / "out.h5")
    finally:
        os.chmod(ro, stat.S_IRWXU)


def test_a_parent_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match="cannot create the folder"):
        check_destination(tmp_path / "file" / "out.h5")


def test_written_beside_renames_when_whole_and_removes_when_interrupted(tmp_path):
    from torchstore.io.destination import written_beside

    dest = tmp_path / "out.h5"
    (tmp_path / ".out.h5.importing").write_text("a killed writer's leftover")
    with written_beside(dest, "importing") as partial:
        assert not partial.exists()
        partial.write_text("whole")
    assert dest.read_text() == "whole" and not partial.exists()
    with pytest.raises(KeyboardInterrupt), written_beside(dest, "importing") as partial:
        partial.write_text("half")
        raise KeyboardInterrupt
    assert dest.read_text() == "whole" and list(tmp_path.iterdir()) == [dest]


_HOLD_PARTIAL = """
import sys, time
from pathlib import Path
from torchstore.io.destination import written_beside
with written_beside(Path(sys.argv[1]), "importing") as partial:
    partial.write_text("the first import's rows")
    print("writing", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_of_one_destination_is_refused_and_touches_nothing(tmp_path):
    import subprocess
    import sys

    from torchstore.io.destination import written_beside

    dest = tmp_path / "out.h5"
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLD_PARTIAL, str(dest)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline() == "writing\n"
        partial = tmp_path / ".out.h5.importing"
        with pytest.raises(StoreLockedError) as refused, written_beside(dest, "importing"):
            pytest.fail("the second writer got the partial file")
        message = str(refused.value)
        assert message.startswith(f"another import is writing {dest}: process {first.pid} ")
        assert "\n" not in message
        assert partial.read_text() == "the first import's rows" and not dest.exists()
    finally:
        first.kill()
        first.wait()
    # a killed holder frees the partial at once: its leftover is replaced, not refused
    with written_beside(dest, "importing") as partial:
        assert not partial.exists()
        partial.write_text("whole")
    assert dest.read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5"]
