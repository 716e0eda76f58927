"""A writer killed with SIGKILL at random moments leaves every committed episode exact.

Each trial forks a real writer process that appends episodes as fast as it can and
reports each commit through a pipe; the test SIGKILLs it after a random delay, then
checks the file in another forked process (so a hang or a crash would fail the test,
not block it): the visible episodes are the reported ones (or one more, if the kill
landed between the commit and its report), bit-exact, and nothing of the uncommitted
one. Every few trials the crashed file is resumed, appended to, and checked again.
"""

from __future__ import annotations

import os
import random
import re
import select
import signal
import struct
import time

import numpy as np
import pytest
import torch

from tests.forked import run_forked
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import StoreFormatError

COLUMNS = (
    ColumnSpec("obs", torch.float32, (26,)),
    ColumnSpec("action", torch.float32, (7,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
)
TRIALS = int(os.environ.get("TORCHSTORE_CRASH_TRIALS", "40"))
#: Commits one writer makes before it waits to be killed. A kill meant to land 0.25 s in can
#: come many seconds late on a starved machine (seen: 18 s, 1.4 GB a file, when the writer
#: inherited realtime priority from a worker an AV1 encoder had left realtime); the cap
#: bounds each file to about 40 MB, and a late kill still lands where a writer can be
#: killed: after a commit.
COMMITS_PER_WRITER = 150


def episode_rows(i: int) -> dict[str, np.ndarray]:
    n = 300 + (i * 7919) % 3700
    rng = np.random.default_rng(i)
    done = np.zeros(n, dtype=bool)
    done[-1] = True
    return {
        "obs": rng.standard_normal((n, 26), dtype=np.float32),
        "action": rng.standard_normal((n, 7), dtype=np.float32),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "done": done,
    }


def _writer(path: str, report_fd: int, first: int) -> None:
    if first == 0:
        writer = TrajectoryStoreWriter(path, COLUMNS, env_id="crash-test")
    else:
        writer = TrajectoryStoreWriter.resume(path)
    i = first
    while i < first + COMMITS_PER_WRITER:
        rows = episode_rows(i)
        half = len(rows["reward"]) // 2  # two appends per episode: a kill can land between them
        writer.append({k: v[:half] for k, v in rows.items()})
        writer.append({k: v[half:] for k, v in rows.items()})
        writer.end_episode(metadata={"i": i})
        os.write(report_fd, struct.pack("<i", i + 1))
        i += 1
    while True:  # the store stays open, as a writer's would, until the kill
        time.sleep(1.0)


def _kill_writer(path: str, first: int, delay: float, *, after_commit: bool = False) -> int:
    """Fork a writer, SIGKILL it ``delay`` s after the fork (or, with ``after_commit``, after
    its first reported commit); returns the commits it reported."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _writer(path, write_end, first)
        finally:
            os._exit(1)
    os.close(write_end)
    head = b""
    try:
        if after_commit:
            # The fork and the store's creation take longer on a loaded machine than any fixed
            # delay allows for; counted from the first commit, the kill lands mid-stream.
            head = _first_report(read_end)
        time.sleep(delay)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as r:
        data = head + r.read()
    reports = [v for (v,) in struct.iter_unpack("<i", data[: len(data) // 4 * 4])]
    return reports[-1] if reports else first


def _first_report(fd: int, timeout: float = 120.0) -> bytes:
    """The writer's first 4-byte commit report, read from the pipe as soon as it comes."""
    deadline = time.monotonic() + timeout
    head = b""
    while len(head) < 4:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the writer reported no commit in {timeout:.0f} s"
        chunk = os.read(fd, 4 - len(head))
        assert chunk, "the writer ended before its first commit"
        head += chunk
    return head


def _check(path: str, reported: int) -> None:
    if not os.path.exists(path):
        assert reported == 0, "the file vanished after commits were reported"
        return
    with TrajectoryStore(path) as store:
        n = store.num_episodes
        assert n in (reported, reported + 1), f"{n} episodes visible, {reported} reported"
        for i in range(n):
            expected = episode_rows(i)
            got = store.episode(i)
            assert store.episode_metadata(i) == {"i": i}
            for name, value in expected.items():
                assert np.array_equal(got[name].numpy(), value), (
                    f"episode {i} column {name} differs"
                )
        assert store.num_rows == sum(len(episode_rows(i)["reward"]) for i in range(n))


def _resume_and_extend(path: str, have: int) -> None:
    with TrajectoryStoreWriter.resume(path) as w:
        assert w.num_episodes == have
        w.add_episode(episode_rows(have), metadata={"i": have})
        w.add_episode(episode_rows(have + 1), metadata={"i": have + 1})


def _episodes_in(path: str) -> int:
    with TrajectoryStore(path) as store:
        return store.num_episodes


@pytest.mark.slow
def test_sigkilled_writer_keeps_every_committed_episode(tmp_path):
    rng = random.Random(1234)
    outcomes = []
    for trial in range(TRIALS):
        path = str(tmp_path / f"crash{trial}.h5")
        # a few kills land during creation, most while episodes stream in
        mid_stream = trial % 8 != 0
        # 0.25 s spans about ten append/append/commit cycles (about 45 episodes a second on
        # a loaded 2-core machine): the kill's moment within a cycle stays near uniform
        delay = rng.uniform(0.0, 0.25) if mid_stream else rng.uniform(0.0, 0.02)
        reported = _kill_writer(path, 0, delay, after_commit=mid_stream)
        status, text = run_forked(_check, path, reported)
        assert status == "ok", (
            f"trial {trial} (delay {delay:.3f}s, {reported} reported): {status}\n{text}"
        )
        outcomes.append(reported)
        if os.path.exists(path) and trial % 3 == 0:
            # resume after the crash, get killed again, resume again, and verify everything
            visible = _episodes_in(path)
            reported = _kill_writer(path, visible, rng.uniform(0.05, 0.3))
            status, text = run_forked(_check, path, reported)
            assert status == "ok", (
                f"trial {trial} after a resumed writer was killed: {status}\n{text}"
            )
            have = _episodes_in(path)
            status, text = run_forked(_resume_and_extend, path, have)
            assert status == "ok", f"trial {trial} resume: {status}\n{text}"
            status, text = run_forked(_check, path, have + 2)
            assert status == "ok", f"trial {trial} after resume: {status}\n{text}"
        if os.path.exists(path):
            os.unlink(path)  # checked: forty trials' files need not add up on disk
    assert sum(1 for r in outcomes if r > 0) > TRIALS // 2  # most kills landed mid-stream


# ----------------------------------------------------------------- kills inside resume()
def _crashed_store(tmp_path) -> tuple[str, int]:
    """A store whose writer was SIGKILLed mid-stream, and how many episodes it holds."""
    path = str(tmp_path / "crashed.h5")
    for delay in (0.1, 0.3, 0.6):
        if os.path.exists(path):
            os.unlink(path)
        _kill_writer(path, 0, delay, after_commit=True)
        if os.path.exists(path) and _episodes_in(path) > 0:
            return path, _episodes_in(path)
    raise AssertionError("the writer committed nothing before it was killed")


def _resume_dying_at(path: str, step: str) -> None:
    """Resume ``path`` in this (forked) process and SIGKILL it at ``step`` of the resume."""
    import torchstore.data.file.writer as writer_module
    import torchstore.io.hdf5.files as hdf5

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    real_lib = hdf5._lib()

    class _Lib:  # libhdf5 with a kill around H5Fincrement_filesize
        def __getattr__(self, name):
            return getattr(real_lib, name)

        def H5Fincrement_filesize(self, fid, extra):  # noqa: N802 - the C name
            if step == "recovery-opened":
                die()
            result = real_lib.H5Fincrement_filesize(fid, extra)
            if step == "eoa-raised":
                die()
            return result

    hdf5._lib = lambda: _Lib()
    recover = hdf5._recover_after_kill

    def recover_then_maybe_die(p):
        recover(p)
        if step == "recovered":
            die()

    hdf5._recover_after_kill = recover_then_maybe_die
    read_manifest = writer_module.read_manifest

    def reopened(f, source):
        if step == "reopened":
            die()
        return read_manifest(f, source)

    writer_module.read_manifest = reopened
    writer = TrajectoryStoreWriter.resume(path)
    if step == "attached":
        die()
    writer.close()
    raise AssertionError(f"the resume never reached step {step!r}")


RESUME_STEPS = ("recovery-opened", "eoa-raised", "recovered", "reopened", "attached")


@pytest.mark.parametrize("step", RESUME_STEPS)
def test_a_kill_at_any_step_of_resume_leaves_a_store_readers_open(tmp_path, step):
    path, have = _crashed_store(tmp_path)
    status, text = run_forked(_resume_dying_at, path, step, timeout=120)
    assert status == "crashed", f"{status}: {text}"
    status, text = run_forked(_check, path, have)  # readers open it as it was left
    assert status == "ok", f"after a kill at {step}: {status}\n{text}"
    status, text = run_forked(_resume_and_extend, path, have, timeout=120)
    assert status == "ok", f"resume after a kill at {step}: {status}\n{text}"
    status, text = run_forked(_check, path, have + 2)
    assert status == "ok", f"after resuming a kill at {step}: {status}\n{text}"


def _resume_once(path: str) -> None:
    TrajectoryStoreWriter.resume(path).close()


@pytest.mark.slow
def test_kills_at_random_moments_of_resume_leave_a_store_readers_open(tmp_path):
    template, have = _crashed_store(tmp_path)
    data = open(template, "rb").read()
    rng = random.Random(77)
    start = time.monotonic()  # how long a whole resume takes here, fork included
    assert run_forked(_resume_once, template, timeout=120)[0] == "ok"
    span = max(time.monotonic() - start, 0.005)
    for trial in range(max(TRIALS // 2, 10)):
        path = str(tmp_path / f"kill{trial}.h5")
        with open(path, "wb") as f:
            f.write(data)
        pid = os.fork()
        if pid == 0:
            try:
                _resume_once(path)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, span))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status, text = run_forked(_check, path, have)
        assert status == "ok", f"trial {trial}: {status}\n{text}"
        status, text = run_forked(_resume_and_extend, path, have, timeout=120)
        assert status == "ok", f"trial {trial} resume: {status}\n{text}"
        os.unlink(path)


def _resume_and_die(path: str) -> None:
    writer = TrajectoryStoreWriter.resume(path)
    writer.append({k: v[:5] for k, v in episode_rows(99).items()})
    os.kill(os.getpid(), signal.SIGKILL)


def _superblock_extension_continuation(data: bytes) -> int:
    """Address of the continuation chunk of the superblock extension's object header."""
    (ext,) = struct.unpack_from("<Q", data, 20)
    assert data[ext : ext + 4] == b"OHDR" and data[ext + 4] == 2, "not a version-2 header"
    flags = data[ext + 5]
    pos = ext + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    end = pos + width + int.from_bytes(data[pos : pos + width], "little")
    pos += width
    while pos < end:
        kind, size = data[pos], struct.unpack_from("<H", data, pos + 1)[0]
        pos += 4 + (2 if flags & 0x04 else 0)
        if kind == 0x10:  # continuation message: address, length
            return struct.unpack_from("<Q", data, pos)[0]
        pos += size
    raise AssertionError("the superblock extension has no continuation chunk")


def _set_superblock(path: str, *, flags: int, eoa: int) -> None:
    from torchstore.io.hdf5.reproducible import lookup3

    with open(path, "r+b") as f:
        head = bytearray(f.read(48))
        head[11] = flags
        struct.pack_into("<Q", head, 28, eoa)
        struct.pack_into("<I", head, 44, lookup3(bytes(head[:44])))
        f.seek(0)
        f.write(head)


def test_resuming_a_store_with_a_damaged_superblock_names_the_file(tmp_path):
    path = str(tmp_path / "s.h5")
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        w.add_episode(episode_rows(0), metadata={"i": 0})
    assert run_forked(_resume_and_die, path, timeout=120)[0] == "crashed"
    before = open(path, "rb").read()
    with open(path, "r+b") as f:  # one flipped bit in the recorded end-of-allocation
        f.seek(30)
        f.write(bytes([before[30] ^ 0x01]))
    with pytest.raises(StoreFormatError, match=re.escape(path)):
        TrajectoryStoreWriter.resume(path)
    assert open(path, "rb").read()[48:] == before[48:]  # nothing else was touched
