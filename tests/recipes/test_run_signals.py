"""A recipe run's SIGINT/SIGTERM handling, in-process: a signal is never lost."""

from __future__ import annotations

import logging
import signal
import sys
import weakref
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from _common import Run, RunInterrupted  # noqa: E402

from torchstore.training import MetricsLog, RunFolder  # noqa: E402


class _Thing:
    pass


def _run(tmp_path) -> Run:
    return Run("bc", RunFolder(tmp_path), MetricsLog(tmp_path), logging.getLogger("test"))


def test_a_signal_raised_inside_a_weakref_callback_is_raised_again_at_the_next_check(tmp_path):
    run = _run(tmp_path)
    seen = []
    previous, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        thing = _Thing()
        ref = weakref.ref(thing, lambda _: run._on_signal(signal.SIGTERM, None))
        del thing  # the handler raises inside the callback, where Python swallows it
        assert ref() is None
    finally:
        sys.unraisablehook = previous
    assert [u.exc_type for u in seen] == [RunInterrupted]
    with pytest.raises(RunInterrupted) as raised:
        run.check()
    assert raised.value.signum == signal.SIGTERM
    run.metrics.close()


def test_inside_checks_the_first_signal_waits_and_a_second_raises_at_once(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(RunInterrupted) as raised, run.interrupts_at_checks():
        run._on_signal(signal.SIGINT, None)  # noted, not raised
        with pytest.raises(RunInterrupted):
            run._on_signal(signal.SIGTERM, None)  # a second signal: at once
    assert raised.value.signum == signal.SIGINT  # the leaving check raises the first
    run.metrics.close()


def test_lightnings_own_sigterm_exit_is_taken_as_the_interrupt(tmp_path):
    """Lightning raises SIGTERMException (a SystemExit) at a step end after our check."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    run = _run(tmp_path)
    with pytest.raises(RunInterrupted) as raised, run.interrupts_at_checks():
        run._on_signal(signal.SIGTERM, None)  # noted
        raise SIGTERMException
    assert raised.value.signum == signal.SIGTERM
    run.metrics.close()
    calm = _run(tmp_path)
    with pytest.raises(SystemExit, match="3"), calm.interrupts_at_checks():  # no signal: as is
        raise SystemExit(3)
    calm.metrics.close()
