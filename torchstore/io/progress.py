"""Progress bars: one rule for every bar torchstore draws.

On a terminal a bar redraws up to 10 times a second, as tqdm does by default. Written to
anything else (a log file, a pipe, CI output) a bar prints whole lines instead: one when
it starts, one at most every :data:`LOG_INTERVAL_S` seconds while it runs, and one when it
closes, each ended by a newline and none with a ``\\r`` or a drawn bar. tqdm's own
redraws there left ``import:   0%|  | 0/2000\\r`` glued to the next line a command printed,
since a closing bar with ``leave=False`` rubs itself out with ``\\r`` and spaces, which a
log keeps. tqdm is optional: without it there is no bar and the work is the same.

Examples:
    >>> import io
    >>> stream = io.StringIO()
    >>> bar = progress_bar(total=4, desc="import", unit="row", file=stream, leave=False)
    >>> bar.update(4)
    >>> bar.close()
    >>> [line.split(" [")[0] for line in stream.getvalue().splitlines()]
    ['import:   0% 0/4', 'import: 100% 4/4']
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from torchstore.io.console import bar_width
from torchstore.io.flags import env_flag

__all__ = ["progress_bar", "bar_options", "LOG_INTERVAL_S"]

#: Seconds between lines when the bar's stream is not a terminal.
LOG_INTERVAL_S = 30.0

#: a line's layout off a terminal when the total is known: no drawn bar, since a log keeps
#: no redraws to animate it
LINE_FORMAT = "{percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar_options(**kwargs: Any) -> dict[str, Any]:
    """tqdm keyword arguments with the redraw rule applied (explicit values win)."""
    stream = kwargs.get("file") or sys.stderr
    if not _is_terminal(stream):
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", max(LOG_INTERVAL_S, kwargs["mininterval"]))
    return kwargs


def progress_bar(*, enabled: bool = True, **kwargs: Any) -> Any | None:
    """A ``tqdm.auto.tqdm(**kwargs)`` following the redraw rule, or None.

    Off a terminal (and outside a notebook, whose bar is a widget) the bar prints whole
    lines (see the module's docstring); on a terminal that reports no size (a pseudo-terminal
    of 0x0) it is drawn 80 columns wide (:func:`~torchstore.io.console.bar_width`), where
    tqdm would draw nothing. None when ``enabled`` is false,
    ``TORCHSTORE_DISABLE_PROGRESS`` is set, or tqdm is not installed; callers skip their
    updates.
    """
    if not enabled or env_flag("TORCHSTORE_DISABLE_PROGRESS"):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    options = bar_options(**kwargs)
    stream = options.get("file") or sys.stderr
    if _is_notebook(tqdm):
        return tqdm(**options)
    if _is_terminal(stream):  # sized for a terminal that reports none (bar_width)
        return tqdm(**{**bar_width(stream), **options})
    return _line_bar_class()(**options)


def _is_notebook(bar_class: type) -> bool:
    return any("notebook" in cls.__module__ for cls in bar_class.__mro__)


@functools.cache
def _line_bar_class() -> type:
    """The tqdm subclass that prints whole lines (built on first use: tqdm is optional)."""
    from tqdm.std import tqdm

    class LineBar(tqdm):
        """A tqdm bar for a log or a pipe: each display is one ``\\n``-ended line, a line
        is printed only when the count moved, and closing prints the last count (with the
        run's overall rate) whatever ``leave`` says, rubbing nothing out."""

        _printed: float | None = None

        def __str__(self) -> str:
            meter = self.format_dict
            if meter["bar_format"] is None and meter["total"]:
                head = "{desc}: " if meter["prefix"] else ""
                meter = {**meter, "bar_format": head + LINE_FORMAT}
            return self.format_meter(**meter)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg == "" or self.n == self._printed:  # a clear, or nothing new to say
                return False
            self.fp.write((str(self) if msg is None else msg) + "\n")
            getattr(self.fp, "flush", lambda: None)()
            self._printed = self.n
            return True

        def clear(self, nolock: bool = False) -> None:
            """Nothing to rub out: every line printed is whole."""

        def moveto(self, n: int) -> None:
            """No cursor to move in a log: nested bars print their lines in turn."""

        def close(self) -> None:
            if not self.disable and hasattr(self, "last_print_t"):
                with self._lock:
                    self._ema_dt = lambda: None  # the last line shows the overall rate
                    self.display()
            self.leave = False
            super().close()

    return LineBar
