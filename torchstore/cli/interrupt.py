"""Ctrl-C that is never lost while a command runs.

Python raises ``KeyboardInterrupt`` from its SIGINT handler in whatever Python code the
main thread runs next. When that code is a weakref callback or a ``__del__`` (h5py frees
objects constantly, and its registry's ``WeakValueDictionary`` callback runs on every
free), the exception cannot propagate: Python prints "Exception ignored in ..." and the
command carries on as if no Ctrl-C had come. Sent at random moments during ``torchstore
demo``, 16 of 40 interrupts were lost that way.

:class:`InterruptGuard` catches such a swallowed interrupt through ``sys.unraisablehook``
and delivers it again a moment later from a timer thread (``_thread.interrupt_main``),
when the main thread is back in ordinary code; if it lands in another callback, the same
happens again. Once the command has started handling an interrupt (:meth:`handled`),
nothing more is delivered, so the one-line report is never cut short.

SIGTERM (what ``timeout``, Slurm preemption and ``docker stop`` send) is delivered the same
way, as :class:`Terminated` (a ``KeyboardInterrupt``), so a command stopped by it cleans up
and reports as after Ctrl-C: an import leaves no hidden partial file beside its output.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["InterruptGuard", "Terminated"]

#: seconds before a swallowed interrupt is delivered again
REDELIVER_AFTER = 0.001


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is, so that every ``except KeyboardInterrupt`` cleanup runs."""


class InterruptGuard:
    """A context manager: inside it, a Ctrl-C swallowed by a callback is delivered again.

    Does nothing off the main thread (signal handlers can only be set there).
    """

    def __init__(self) -> None:
        self._done = False
        self._stopping = False
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self._previous_term: Any = None
        self._previous_hook: Any = None
        self._signum = signal.SIGINT  # the signal a swallowed interrupt came as

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is not threading.main_thread():
            return self
        # The re-delivering thread exists before any interrupt: starting one from the hook
        # waits for it to run, and an interrupt arriving in that wait would be lost.
        self._thread = threading.Thread(target=self._redeliver, name="interrupt", daemon=True)
        self._thread.start()
        self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        self._previous_term = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.handled()
        if self._thread is None:
            return
        self._stopping = True
        self._wanted.set()
        # an interrupt the thread already sent is run by ``signal.signal`` below (it runs
        # pending handlers first), while ours is still installed and ignores it
        self._thread.join()
        self._thread = None
        sys.unraisablehook = self._previous_hook
        signal.signal(signal.SIGINT, self._previous_handler)
        signal.signal(signal.SIGTERM, self._previous_term)

    def handled(self) -> None:
        """The command is handling an interrupt (or finished): deliver nothing more."""
        self._done = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._done:
            return
        self._signum = signal.SIGINT
        raise KeyboardInterrupt

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._done:
            return
        self._signum = signal.SIGTERM
        raise Terminated

    def _on_unraisable(self, unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):  # Terminated included
            self._previous_hook(unraisable)
            return
        if not self._done:
            # not from here: this hook runs inside the callback that swallowed the
            # interrupt, and one raised now would be swallowed the same way
            self._wanted.set()

    def _redeliver(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping:
                return
            time.sleep(REDELIVER_AFTER)
            if self._stopping:
                return
            _thread.interrupt_main(self._signum)
