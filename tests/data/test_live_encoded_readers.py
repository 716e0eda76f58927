"""A reader following a live writer of an encoded camera column raises no false alarm.

The packet table's last row (where the committed packets end) and the packet bytes sit in
blocks the writer rewrites at every commit, as the last block of a raw column does; their
reads are retried while the commit record moves, so 1,000 reads of a column a writer
commits hundreds of episodes a second to see no IntegrityError, and real damage to
committed packets or packet rows is still reported.
"""

from __future__ import annotations

import os
import select
import time

import h5py
import numpy as np
import pytest
import torch

from tests.damage import flip_chunk_byte
from tests.forked import exit_code_by
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError
from torchstore.io.frames.codec import FrameCodec

H, W = 16, 24
READS = 1000
DEADLINE_S = 600.0  # a loaded machine's worst case; a hang fails after it, never blocks


def _columns(kind: str) -> list[ColumnSpec]:
    return [
        ColumnSpec("cam", torch.uint8, (H, W, 3), codec=FrameCodec(kind)),
        ColumnSpec("step", torch.int64),
    ]


def _episode(i: int, n: int | None = None) -> dict[str, np.ndarray]:
    n = 1 + i % 3 if n is None else n
    frames = np.random.default_rng(i).integers(0, 256, (n, H, W, 3), dtype=np.uint8)
    return {"cam": frames, "step": np.full(n, i, np.int64)}


def _writer(path, first: int, ready_w: int, go_r: int, stop_r: int) -> None:
    """Resume the store, say so on ``ready_w`` and wait for a byte on ``go_r`` (readers
    open after the writer), then commit episodes from ``first`` until a byte arrives on
    ``stop_r`` (or 100,000 episodes)."""
    status = 1
    try:
        with TrajectoryStoreWriter.resume(path) as w:
            os.write(ready_w, b"r")
            assert os.read(go_r, 1) == b"g"
            for i in range(first, first + 100_000):
                w.add_episode(_episode(i))
                if select.select([stop_r], [], [], 0)[0]:
                    break
        status = 0
    finally:
        os._exit(status)


def _start_writer(path, first: int) -> tuple[int, int, int]:
    """A writer in a child process, resumed and waiting for a byte on ``go_w``."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _writer(path, first, ready_w, go_r, stop_r)
    for fd in (ready_w, go_r, stop_r):
        os.close(fd)
    with os.fdopen(ready_r, "rb") as ready:  # b"" if the writer died first
        if ready.read(1) != b"r":
            raise AssertionError(f"the writer did not resume (exit {_stop_writer(pid, stop_w)})")
    return pid, go_w, stop_w


def _stop_writer(pid: int, stop_w: int) -> int:
    try:
        os.write(stop_w, b"s")
    except OSError:
        pass
    return exit_code_by(pid, time.monotonic() + DEADLINE_S)


@pytest.mark.parametrize("kind", ["png", "jpeg", "av1"])
def test_reads_following_a_live_writer_of_an_encoded_column_raise_no_false_alarm(tmp_path, kind):
    path = tmp_path / "live.h5"
    with TrajectoryStoreWriter(path, _columns(kind)) as w:
        w.add_episode(_episode(0))
    pid, go_w, stop_w = _start_writer(path, 1)
    alarms, wrong, seen, first_alarm = 0, 0, set(), ""
    code = None
    try:
        with TrajectoryStore(path) as store:
            os.write(go_w, b"g")
            for _ in range(READS):
                try:
                    store.refresh()
                    n, e = store.num_rows, store.num_episodes
                    seen.add(e)
                    start, _ = store.episodes.range(max(0, e - 3))
                    last, _ = store.episodes.range(e - 1)
                    cam = store.read_column("cam", start, n)  # runs into the writer's blocks
                    step = store.read_column("step", n - 1, n)
                    wrong += cam.shape[0] != n - start or int(step[0]) != e - 1
                    if kind == "png":  # exact: the frames are the episode's own
                        wrong += not np.array_equal(cam[last - start :], _episode(e - 1)["cam"])
                except IntegrityError as exc:
                    alarms += 1
                    first_alarm = first_alarm or str(exc)
        code = _stop_writer(pid, stop_w)
    finally:
        if code is None:
            _stop_writer(pid, stop_w)
    assert code == 0, f"the writer exited with {code}"
    assert alarms == 0, f"{alarms} false alarms in {READS} reads, first: {first_alarm}"
    assert wrong == 0
    assert len(seen) > 20, f"the reader saw only {len(seen)} commits: it did not follow"
    with TrajectoryStore(path) as store:
        assert store.num_episodes > max(seen) - 1


@pytest.mark.parametrize("dataset", ["packets/cam", "columns/cam"])
def test_a_live_reader_still_reports_damage_to_committed_packets(tmp_path, dataset):
    path = tmp_path / "live.h5"
    with TrajectoryStoreWriter(path, _columns("png")) as w:  # full first chunks in both
        w.add_episode(_episode(0, 4200))
        w.add_episode(_episode(1))
    with h5py.File(path, "r") as f:
        held = f[dataset].shape[0]
    rows = flip_chunk_byte(path, dataset, 0, 40 * 32 + 8)  # row 40's length / frame 1
    assert rows < held  # chunk 0 is full: the writer never rewrites it
    pid, go_w, stop_w = _start_writer(path, 2)
    code = None
    try:
        with TrajectoryStore(path) as store:
            os.write(go_w, b"g")
            for _ in range(20):
                store.refresh()
                with pytest.raises(IntegrityError, match="fail their checksum"):
                    store.read_column("cam", 0, 60)
                assert np.array_equal(  # the next episode, in undamaged blocks, reads
                    store.read_column("cam", 4200, 4202), _episode(1)["cam"]
                )
        code = _stop_writer(pid, stop_w)
    finally:
        if code is None:
            _stop_writer(pid, stop_w)
    assert code == 0
