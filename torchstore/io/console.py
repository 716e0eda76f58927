"""The terminal a run's output goes to: its width, and a tqdm bar that draws on it.

A terminal that reports no size counts as none: ``script -qc CMD /dev/null`` opens a
pseudo-terminal of 0x0 when it has no terminal of its own, and a tqdm bar sized to the
terminal draws nothing there (it takes the height as -1 rows, and a bar below the last row
is not drawn), so a run there printed nothing at all while it trained. Lightning-free, so
a recipe without Lightning can use it.

Examples:
    >>> import io
    >>> terminal_columns(io.StringIO())
    0
    >>> bar_width(io.StringIO())
    {'ncols': 80, 'nrows': 24}
"""

from __future__ import annotations

import os
from typing import IO, Any

__all__ = ["FALLBACK_COLUMNS", "FALLBACK_ROWS", "bar_width", "terminal_columns"]

#: the size a bar is drawn for on a stream that reports none
FALLBACK_COLUMNS, FALLBACK_ROWS = 80, 24


def terminal_columns(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` writes to: 0 when it is not a terminal, or is
    one that reports no size."""
    try:
        if not stream.isatty():
            return 0
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no fileno (a StringIO), or closed
        return 0


def bar_width(stream: IO[str]) -> dict[str, Any]:
    """tqdm keyword arguments for a bar on ``stream``: follow the terminal's width when it
    has one, else a fixed size (:data:`FALLBACK_COLUMNS` x :data:`FALLBACK_ROWS`), at which
    tqdm draws where it would draw nothing."""
    if terminal_columns(stream) > 0:
        return {"dynamic_ncols": True}
    return {"ncols": FALLBACK_COLUMNS, "nrows": FALLBACK_ROWS}
