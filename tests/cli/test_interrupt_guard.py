"""A Ctrl-C that lands in a weakref callback is delivered again, not lost."""

from __future__ import annotations

import signal
import sys
import time
import weakref

import pytest

from torchstore.cli.interrupt import InterruptGuard


class _Thing:
    pass


def _interrupt_inside_a_weakref_callback() -> None:
    """SIGINT raised while the main thread runs a weakref callback: Python's handler
    raises KeyboardInterrupt there, where it cannot propagate ("Exception ignored in")."""
    thing = _Thing()
    ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
    del thing
    assert ref() is None


def _sleep_uninterrupted(seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.01)
    return time.monotonic() - start


def test_without_the_guard_the_interrupt_is_lost():
    # the failure the guard exists for: the callback swallows it and the program carries on
    seen = []
    previous, sys.unraisablehook = sys.unraisablehook, seen.append
    # Python's own Ctrl-C handler, and SIGINT unblocked, whatever an earlier test in this
    # worker left: once this check saw no KeyboardInterrupt at all
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        _interrupt_inside_a_weakref_callback()
        assert _sleep_uninterrupted(0.2) >= 0.2
    finally:
        sys.unraisablehook = previous
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)
    assert [u.exc_type for u in seen] == [KeyboardInterrupt]


def test_the_guard_delivers_a_swallowed_interrupt_again():
    with pytest.raises(KeyboardInterrupt), InterruptGuard():
        _interrupt_inside_a_weakref_callback()
        _sleep_uninterrupted(30)  # the interrupt ends this within milliseconds


def test_after_handled_nothing_more_is_delivered_and_handlers_are_restored():
    handler, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    with InterruptGuard() as guard:
        guard.handled()
        _interrupt_inside_a_weakref_callback()
        assert _sleep_uninterrupted(0.2) >= 0.2
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C while the report is written
        assert _sleep_uninterrupted(0.05) >= 0.05
    assert signal.getsignal(signal.SIGINT) is handler and sys.unraisablehook is hook


def test_other_unraisable_errors_still_reach_the_previous_hook():
    seen = []
    previous, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with InterruptGuard():
            thing = _Thing()
            ref = weakref.ref(thing, lambda _: 1 / 0)
            del thing
            assert ref() is None
        assert seen and seen[0].exc_type is ZeroDivisionError
    finally:
        sys.unraisablehook = previous
