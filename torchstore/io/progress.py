"""Progress bars: one rule for every bar torchstore draws.

On a terminal a bar redraws up to 10 times a second, as tqdm does by default. Written to
anything else (a log file, a pipe, CI output) the same bar redraws at most every
:data:`LOG_INTERVAL_S` seconds, so an hour-long transfer leaves a few hundred short
updates instead of hundreds of KB of ``\\r``-joined redraws. tqdm is optional: without
it there is no bar and the work is the same.
"""

from __future__ import annotations

import sys
from typing import Any

from torchstore.io.flags import env_flag

__all__ = ["progress_bar", "bar_options", "LOG_INTERVAL_S"]

#: Seconds between redraws when the bar's stream is not a terminal.
LOG_INTERVAL_S = 30.0


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

    None when ``enabled`` is false, ``TORCHSTORE_DISABLE_PROGRESS`` is set, or tqdm is
    not installed; callers skip their updates.
    """
    if not enabled or env_flag("TORCHSTORE_DISABLE_PROGRESS"):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(**bar_options(**kwargs))
