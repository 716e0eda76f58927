"""The writer lock: one live holder per file, told apart from a dead one by the kernel."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from torchstore.errors import DestinationError, StoreLockedError, TorchstoreError
from torchstore.io.hdf5.writer_lock import WriterLock, live_writer, lock_path


def _hold_in_child(path, *, release_after: float | None = None) -> tuple[int, int]:
    """Fork a child that takes the lock, reports through a pipe, then sleeps (or releases)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            lock = WriterLock.acquire(path)
            os.write(write_end, b"1")
            if release_after is not None:
                time.sleep(release_after)
                lock.release()
                os._exit(0)
            time.sleep(600)
        finally:
            os._exit(1)
    os.close(write_end)
    assert os.read(read_end, 1) == b"1"
    return pid, read_end


def _stop(pid: int, read_end: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_end)


def test_lock_path_is_a_hidden_sidecar_in_the_same_folder(tmp_path):
    assert lock_path(tmp_path / "run.h5") == tmp_path.resolve() / ".run.h5.lock"
    (tmp_path / "real.h5").write_bytes(b"")
    (tmp_path / "link.h5").symlink_to(tmp_path / "real.h5")
    assert lock_path(tmp_path / "link.h5") == lock_path(tmp_path / "real.h5")


def test_no_writer_means_no_holder_and_no_file_made(tmp_path):
    path = tmp_path / "s.h5"
    assert live_writer(path) is None
    assert not lock_path(path).exists()


def test_a_second_acquire_is_refused_naming_the_holder_even_in_one_process(tmp_path):
    path = tmp_path / "s.h5"
    with WriterLock.acquire(path):
        holder = live_writer(path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert holder["since"] > 0
        with pytest.raises(
            StoreLockedError, match=rf"s\.h5 is being written by process {os.getpid()}"
        ):
            WriterLock.acquire(path)
    assert live_writer(path) is None
    assert not lock_path(path).exists()  # the sidecar goes with its writer
    WriterLock.acquire(path).release()


def test_other_processes_see_the_holder_and_are_refused(tmp_path):
    path = tmp_path / "s.h5"
    pid, fd = _hold_in_child(path)
    try:
        assert live_writer(path)["pid"] == pid
        code = (
            "import sys\n"
            "from torchstore.io.hdf5.writer_lock import WriterLock, live_writer\n"
            "from torchstore.errors import StoreLockedError\n"
            f"print(live_writer({str(path)!r})['pid'])\n"
            "try:\n"
            f"    WriterLock.acquire({str(path)!r})\n"
            "except StoreLockedError as exc:\n"
            "    print('refused', exc)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == str(pid)
        assert lines[1].startswith("refused") and f"process {pid}" in lines[1]
        with pytest.raises(StoreLockedError) as info:
            WriterLock.acquire(path)
        assert isinstance(info.value, TorchstoreError) and isinstance(info.value, RuntimeError)
        assert str(path) in str(info.value) and socket.gethostname() in str(info.value)
    finally:
        _stop(pid, fd)


def test_a_killed_holder_frees_the_lock_at_once(tmp_path):
    path = tmp_path / "s.h5"
    pid, fd = _hold_in_child(path)
    _stop(pid, fd)
    assert lock_path(path).exists()  # a killed writer leaves its sidecar ...
    assert live_writer(path) is None  # ... which says nothing: no live process holds it
    with WriterLock.acquire(path) as lock:
        assert lock.held and live_writer(path)["pid"] == os.getpid()


def test_live_writer_works_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "s.h5"
    pid, fd = _hold_in_child(path)
    try:
        os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
        assert live_writer(path)["pid"] == pid
        assert live_writer(folder / "other.h5") is None
        assert sorted(os.listdir(folder)) == [".s.h5.lock"]
    finally:
        os.chmod(folder, stat.S_IRWXU)
        _stop(pid, fd)


def test_a_forked_child_releasing_an_inherited_lock_leaves_the_parents(tmp_path):
    path = tmp_path / "s.h5"
    with WriterLock.acquire(path) as lock:
        pid = os.fork()
        if pid == 0:
            lock.release()
            os._exit(0)
        os.waitpid(pid, 0)
        assert lock_path(path).exists()
        assert live_writer(path)["pid"] == os.getpid()


def test_a_forked_child_does_not_keep_a_killed_writers_lock(tmp_path):
    """A worker forked by a writer outlives it: the writer's store must still be free."""
    path = tmp_path / "s.h5"
    read_end, write_end = os.pipe()
    writer = os.fork()
    if writer == 0:
        try:
            os.close(read_end)
            lock = WriterLock.acquire(path)  # noqa: F841 - held until this process is killed
            worker = os.fork()
            if worker == 0:
                time.sleep(600)
                os._exit(0)
            os.write(write_end, str(worker).encode().ljust(16))
            time.sleep(600)
        finally:
            os._exit(1)
    os.close(write_end)
    worker = int(os.read(read_end, 16).decode())
    try:
        assert live_writer(path)["pid"] == writer
        os.kill(writer, signal.SIGKILL)
        os.waitpid(writer, 0)
        os.kill(worker, 0)  # the worker lives on ...
        assert live_writer(path) is None  # ... without the lock
        WriterLock.acquire(path).release()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        os.close(read_end)


def _contend(path: str, log: str, rounds: int) -> None:
    """Acquire and release in a loop, logging enter/exit; refusals are expected."""
    held = 0
    for _ in range(rounds):
        try:
            lock = WriterLock.acquire(path)
        except StoreLockedError:
            continue
        with open(log, "a") as f:
            f.write(f"in {os.getpid()}\n")
        with open(log, "a") as f:
            f.write(f"out {os.getpid()}\n")
        lock.release()
        held += 1
    os._exit(0 if held else 3)


def test_release_racing_acquires_never_gives_two_holders(tmp_path):
    """Releases unlink the sidecar; acquirers that locked an unlinked one must start over."""
    path, log = str(tmp_path / "s.h5"), str(tmp_path / "log")
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                _contend(path, log, 300)
            finally:
                os._exit(1)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    lines = open(log).read().split("\n")[:-1]
    assert len(lines) >= 8
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("in ") and leave == "out " + enter[3:], "two holders overlapped"


def test_a_folder_that_cannot_hold_the_sidecar_is_named(tmp_path):
    with pytest.raises(DestinationError, match="cannot take the writer lock .*missing"):
        WriterLock.acquire(tmp_path / "missing" / "s.h5")


def test_a_filesystem_without_locks_is_a_clear_error(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(DestinationError, match="does not support file locks"):
        WriterLock.acquire(tmp_path / "s.h5")
