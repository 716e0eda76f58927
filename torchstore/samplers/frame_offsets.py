"""Which frames of an episode a sample takes, per column: frame offsets from step ``t``.

LeRobot selects frames with ``delta_timestamps``: per feature, a list of offsets in seconds
from the sampled frame (``{"observation.images.top": [-0.1, 0.0], "action": [i / 30 for i
in range(50)]}``). Each offset must lie on the dataset's ``1 / fps`` grid within
``tolerance_s`` (LeRobot's default 1e-4 s) and becomes the whole frame offset
``round(seconds * fps)``; :func:`offsets_of_timestamps` does that conversion with LeRobot's
rule and refuses an offset off the grid, naming the key and the value. The same table can be
given in frames directly (:func:`check_frame_offsets`): any integers, negative for history,
strided, a frame from a second ago. :func:`~torchstore.samplers.windows.offset_rows` then
takes the rows, clamped to ``t``'s episode with a pad mask where an offset left it.

Examples:
    >>> offsets_of_timestamps({"action": [0.0, 0.1, 0.2], "top": [-1.0, 0.0]}, fps=10)
    {'action': (0, 1, 2), 'top': (-10, 0)}
    >>> check_frame_offsets({"action": range(3), "top": [-10, 0]})
    {'action': (0, 1, 2), 'top': (-10, 0)}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torchstore.errors import ArgumentError, ArgumentTypeError
from torchstore.validation import non_negative_number, positive_number

__all__ = ["DEFAULT_TOLERANCE_S", "check_frame_offsets", "offsets_of_timestamps"]

#: LeRobot's default tolerance (``LeRobotDataset(tolerance_s=1e-4)``), in seconds
DEFAULT_TOLERANCE_S = 1e-4


def _key(key: Any, what: str) -> str:
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return "/".join(key)
    if not isinstance(key, str) or not key:
        raise ArgumentTypeError(f"{what} key ({key!r}) must be a column name")
    return key


def _values(key: str, values: Any, what: str) -> list[Any]:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise ArgumentTypeError(
            f"{what}[{key!r}] ({values!r}) must be a list of offsets, e.g. [-1, 0] or range(50)"
        )
    items = list(values.tolist() if hasattr(values, "tolist") else values)
    if not items:
        raise ArgumentError(f"{what}[{key!r}] must hold at least one offset, got none")
    return items


def _columns(table: Any, what: str) -> Iterator[tuple[str, list[Any]]]:
    """``(column, its offsets)`` of a ``frame_offsets`` / ``delta_timestamps`` table,
    checked: a non-empty mapping, names of columns, each column once, non-empty lists."""
    if not isinstance(table, Mapping) or not table:
        raise ArgumentTypeError(
            f"{what} ({table!r}) must be a non-empty mapping of column name to offsets"
        )
    seen: set[str] = set()
    for raw_key, values in table.items():
        key = _key(raw_key, what)
        if key in seen:
            raise ArgumentError(f"{what} names column {key!r} twice")
        seen.add(key)
        yield key, _values(key, values, what)


def check_frame_offsets(
    frame_offsets: Mapping[Any, Iterable[int]], *, what: str = "frame_offsets"
) -> dict[str, tuple[int, ...]]:
    """``frame_offsets`` as ``{column name: (offset, ...)}`` of Python ints.

    Args:
        frame_offsets: per column (a name, or a tuple of its path's parts), the whole frame
            offsets from step ``t``, in any order (a list, a ``range``, a 1-D array).
        what: the argument's name in error messages.

    Raises:
        ArgumentTypeError: for an offset that is not an integer (a bool, a float: seconds
            go in ``delta_timestamps``), or a table that is not a mapping of lists.
        ArgumentError: for a column with no offsets, or two keys naming one column.
    """
    out: dict[str, tuple[int, ...]] = {}
    for key, values in _columns(frame_offsets, what):
        offsets = []
        for value in values:
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ArgumentTypeError(
                    f"{what}[{key!r}] holds {value!r}, not a whole number of frames; offsets "
                    "in seconds go in delta_timestamps"
                )
            offsets.append(int(value))
        out[key] = tuple(offsets)
    return out


def offsets_of_timestamps(
    delta_timestamps: Mapping[Any, Iterable[float]],
    fps: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> dict[str, tuple[int, ...]]:
    """LeRobot's ``delta_timestamps`` (seconds) as whole frame offsets at ``fps``.

    An offset ``s`` is taken when ``|s * fps - round(s * fps)| / fps <= tolerance_s`` (LeRobot's
    ``check_delta_timestamps``) and becomes ``round(s * fps)`` (its ``get_delta_indices``).

    Args:
        delta_timestamps: per column, offsets in seconds from step ``t``.
        fps: the store's frame rate (> 0).
        tolerance_s: how far from a frame an offset may lie, in seconds (>= 0).

    Raises:
        ArgumentError: for an offset further than ``tolerance_s`` from a frame (the message
            names the key, the value and the nearest frame), or a non-finite one.
        ArgumentTypeError: for an offset that is not a number.
    """
    fps = float(positive_number("fps", fps, hint=" (frames per second)"))
    tolerance_s = float(non_negative_number("tolerance_s", tolerance_s, hint=" (seconds)"))
    out: dict[str, tuple[int, ...]] = {}
    what = "delta_timestamps"
    for key, values in _columns(delta_timestamps, what):
        offsets = []
        for value in values:
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise ArgumentTypeError(f"{what}[{key!r}] holds {value!r}, not seconds")
            seconds = float(value)
            if not math.isfinite(seconds):
                raise ArgumentError(f"{what}[{key!r}] holds {value!r}, not a finite time")
            frame = round(seconds * fps)
            if abs(seconds * fps - frame) / fps > tolerance_s:
                raise ArgumentError(
                    f"{what}[{key!r}] holds {value!r} s, which is not within tolerance_s "
                    f"({tolerance_s:g} s) of a frame at {fps:g} fps (nearest: frame {frame}, "
                    f"{frame / fps:g} s); use multiples of 1/{fps:g} s or raise tolerance_s"
                )
            offsets.append(frame)
        out[key] = tuple(offsets)
    return out
