"""Undo realtime scheduling that a native library gives this process's threads.

SVT-AV1 (libsvtav1, LeRobot's default video encoder), run as root as it is in most
containers, switches the thread that opens an encoder to ``SCHED_FIFO`` at priority 99, and
the encoder's own threads (about 40 of them) start the same way; nothing puts them back.
A ``SCHED_FIFO`` thread is never preempted by a normal one: a busy loop on it (a training
step, a reader polling a live store) holds its core, and a process woken on that core, a
data-loader worker or the writer it waits for, does not run until the loop blocks. Seen
here: a child forked from such a thread waited minutes without being scheduled once.

:func:`restore_scheduling` puts every thread that left its normal policy since a
:func:`thread_scheduling` snapshot back to what it had (or to ``SCHED_OTHER`` when it did not
exist then). Linux only; elsewhere both are no-ops. Lowering a thread's own priority needs
no privilege.
"""

from __future__ import annotations

import os

__all__ = ["thread_scheduling", "restore_scheduling"]

_TASKS = "/proc/self/task"
_SUPPORTED = hasattr(os, "sched_getscheduler") and os.path.isdir(_TASKS)


def _policy(tid: int) -> tuple[int, int] | None:
    try:
        return os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority
    except OSError:  # the thread ended meanwhile
        return None


def thread_scheduling() -> dict[int, tuple[int, int]]:
    """Each thread of this process (by id): its scheduling policy and priority."""
    if not _SUPPORTED:
        return {}
    out = {}
    for name in os.listdir(_TASKS):
        policy = _policy(int(name))
        if policy is not None:
            out[int(name)] = policy
    return out


def restore_scheduling(before: dict[int, tuple[int, int]]) -> int:
    """Put threads that turned realtime since ``before`` back; returns how many were."""
    if not _SUPPORTED:
        return 0
    normal = (os.SCHED_OTHER, 0)
    restored = 0
    for tid, now in thread_scheduling().items():
        if now[0] not in (os.SCHED_FIFO, os.SCHED_RR):
            continue
        policy, priority = before.get(tid, normal)
        if (policy, priority) == now:
            continue  # realtime before the snapshot: the caller's choice, left alone
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
            restored += 1
        except OSError:  # ended meanwhile, or a policy we may not set back: leave it
            pass
    return restored
