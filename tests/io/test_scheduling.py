"""No thread is left at realtime priority by a video encoder (SVT-AV1 as root does that).

Each check runs in a forked child: a failure must not leave a test worker realtime, where
its busy loops would starve the processes it waits for.
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest

from tests.forked import run_forked
from torchstore.io.frames.scheduling import restore_scheduling, thread_scheduling

linux_only = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="thread scheduling is read from /proc"
)
REALTIME = (getattr(os, "SCHED_FIFO", -1), getattr(os, "SCHED_RR", -1))


def _realtime_threads() -> list[int]:
    return [tid for tid, (policy, _) in thread_scheduling().items() if policy in REALTIME]


def _may_go_realtime() -> bool:
    """Whether this process may raise a thread to ``SCHED_FIFO`` (root, or CAP_SYS_NICE)."""

    def probe() -> None:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))

    return run_forked(probe)[0] == "ok"


def _raw_svtav1_open() -> None:
    """Open libsvtav1 through PyAV directly, as any PyAV user would, and report."""
    import av

    container = av.open(os.devnull, "w", format="mp4")
    stream = container.add_stream("libsvtav1", rate=10)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    stream.codec_context.time_base = Fraction(1, 10)
    stream.codec_context.open()
    assert _realtime_threads(), "libsvtav1 left every thread's scheduling alone"


def _encode_an_episode(folder: str) -> None:
    from torchstore.io.frames.video import EpisodeVideoEncoder

    assert not _realtime_threads()
    with EpisodeVideoEncoder(os.path.join(folder, "a.mp4"), fps=10, width=64, height=48) as enc:
        assert not _realtime_threads(), "opening the encoder left threads realtime"
        for _ in range(12):
            enc.add(np.zeros((48, 64, 3), np.uint8))
        assert not _realtime_threads(), "encoding left threads realtime"
    assert not _realtime_threads(), "closing the encoder left threads realtime"


@linux_only
def test_an_episode_encoder_leaves_no_thread_realtime(tmp_path):
    pytest.importorskip("av")
    status, text = run_forked(_encode_an_episode, str(tmp_path), timeout=120)
    assert status == "ok", text


@linux_only
def test_raw_libsvtav1_does_turn_threads_realtime_where_it_may():
    """Why the encoder restores scheduling: without it, SVT-AV1 run with the privilege to
    (root in most containers) makes the opening thread and its own threads SCHED_FIFO."""
    pytest.importorskip("av")
    if not _may_go_realtime():
        pytest.skip("this process may not use realtime scheduling, so SVT-AV1 cannot either")
    status, text = run_forked(_raw_svtav1_open, timeout=120)
    assert status == "ok", text


def _restore_checks() -> None:
    import threading

    before = thread_scheduling()
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # "a library" did this
    started = threading.Event()
    hold = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), hold.wait()))
    worker.start()  # created realtime: inherits the policy of the thread that started it
    started.wait()
    assert len(_realtime_threads()) == 2
    assert restore_scheduling(before) == 2
    assert not _realtime_threads()
    assert os.sched_getscheduler(0) == before[threading.get_native_id()][0]
    # a thread that was realtime when the snapshot was taken is the caller's choice
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    chosen = thread_scheduling()
    assert restore_scheduling(chosen) == 0
    assert os.sched_getscheduler(0) == os.SCHED_FIFO
    hold.set()
    worker.join()


@linux_only
def test_restore_puts_back_only_threads_that_turned_realtime_since_the_snapshot():
    if not _may_go_realtime():
        pytest.skip("this process may not use realtime scheduling")
    status, text = run_forked(_restore_checks, timeout=60)
    assert status == "ok", text
