"""Checks for int and number arguments, with one message style: ``name (value) must be ...``.

Each check returns the value it accepted (an ``int`` for the int checks, so a NumPy
integer comes back as a Python int) or raises one error naming the argument, the value
it got and the rule. By default a value of the wrong type raises
:class:`~torchstore.errors.ArgumentTypeError` (a ``TypeError`` and a ``ValueError``) and
a value out of range raises :class:`~torchstore.errors.ArgumentError` (a ``ValueError``);
``error=`` raises a caller's class instead (a file's ``StoreFormatError``, say). ``bool``
is never accepted as a number, though Python counts it as an int.

Examples:
    >>> positive_int("episodes", 3)
    3
    >>> positive_int("episodes", 0)
    Traceback (most recent call last):
    ...
    torchstore.errors.ArgumentError: episodes (0) must be an int >= 1
    >>> fraction("eta", 0.5, low_open=True)
    0.5
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import re
from typing import Any

from torchstore.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "size_string_bytes",
    "int_at_least",
    "positive_int",
    "non_negative_int",
    "int_in_range",
    "number_at_least",
    "positive_number",
    "non_negative_number",
    "fraction",
]

_REPR_LIMIT = 80


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _fail(
    name: str, value: Any, rule: str, hint: str, error: type[Exception] | None, *, wrong_type: bool
) -> Exception:
    message = f"{name} ({_shown(value)}) must be {rule}{hint}"
    if error is None:
        error = ArgumentTypeError if wrong_type else ArgumentError
    return error(message)


def _is_int(value: Any) -> bool:
    if type(value) is int:  # the common case, without the slower ABC check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if type(value) is float or type(value) is int:
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _scalar_of(value: Any, *, integral: bool) -> Any:
    """The one value of a 0-d NumPy array or tensor (``np.array(0.1)``, ``torch.tensor(30.)``),
    as a Python int or float; None for anything else, booleans included."""
    if getattr(value, "shape", None) != () or not hasattr(value, "dtype"):
        return None
    kind = str(value.dtype)
    if "bool" in kind or "complex" in kind:
        return None
    if integral:
        if "int" not in kind:
            return None
        return operator.index(value)
    return float(value)


def int_in_range(
    name: str,
    value: Any,
    low: int,
    high: int | None = None,
    *,
    high_text: str | None = None,
    allow_none: bool = False,
    error: type[Exception] | None = None,
    hint: str = "",
) -> int | None:
    """``value`` as an int in ``[low, high)`` (``[low, inf)`` without ``high``).

    Args:
        name: the argument's name, as the caller's signature spells it.
        value: what the caller was given.
        low: the smallest int allowed.
        high: the first int not allowed, or None for no upper bound.
        high_text: how the message writes ``high`` (``"2**63"`` reads better than the digits).
        allow_none: accept None (and return it): the message then says "or None".
        error: the class to raise instead of ArgumentError / ArgumentTypeError.
        hint: text appended to the message (the way out, or what was left undone).

    Returns:
        The value as a Python int (or None where allowed).
    """
    if value is None and allow_none:
        return None
    if high is None:
        rule = f"an int >= {low}"
    else:
        rule = f"an int in [{low}, {high_text or high})"
    if allow_none:
        rule += " or None"
    if not _is_int(value):
        scalar = _scalar_of(value, integral=True)
        if scalar is None:
            raise _fail(name, value, rule, hint, error, wrong_type=True)
        value = scalar
    if value < low or (high is not None and value >= high):
        raise _fail(name, value, rule, hint, error, wrong_type=False)
    return int(value)


#: ``int_at_least(name, value, low)``: ``value`` as an int >= ``low`` (``int_in_range``
#: without its upper bound).
int_at_least = int_in_range

#: ``positive_int(name, value)``: ``value`` as an int >= 1 (a count, a capacity, a format
#: version); the keywords of :func:`int_in_range`.
positive_int = functools.partial(int_in_range, low=1)

#: ``non_negative_int(name, value)``: ``value`` as an int >= 0 (an index, a seed, a retry
#: count); the keywords of :func:`int_in_range`.
non_negative_int = functools.partial(int_in_range, low=0)


def number_at_least(
    name: str,
    value: Any,
    low: float,
    *,
    strict: bool = False,
    finite: bool = True,
    error: type[Exception] | None = None,
    hint: str = "",
) -> Any:
    """``value``, a real number >= ``low`` (> ``low`` when ``strict``), finite unless told.

    Returns:
        The value as given (an int stays an int); a 0-d array or tensor as its float.
    """
    rule = f"a {'finite ' if finite else ''}number {'>' if strict else '>='} {low:g}"
    if not _is_number(value):
        scalar = _scalar_of(value, integral=False)
        if scalar is None:
            raise _fail(name, value, rule, hint, error, wrong_type=True)
        value = scalar
    # an int is finite however large (math.isnan would overflow converting 10**400)
    bad = not _is_int(value) and (math.isnan(value) or (finite and math.isinf(value)))
    if bad or value < low or (strict and value == low):
        raise _fail(name, value, rule, hint, error, wrong_type=False)
    return value


#: ``positive_number(name, value)``: ``value``, a real number > 0 (a rate, a timeout, a
#: length in seconds); the keywords of :func:`number_at_least`.
positive_number = functools.partial(number_at_least, low=0, strict=True)

#: ``non_negative_number(name, value)``: ``value``, a real number >= 0 (a noise scale, a
#: damping, an exponent); the keywords of :func:`number_at_least`.
non_negative_number = functools.partial(number_at_least, low=0)


def fraction(
    name: str,
    value: Any,
    *,
    low_open: bool = False,
    high_open: bool = False,
    error: type[Exception] | None = None,
    hint: str = "",
) -> Any:
    """``value``, a real number in ``[0, 1]``; ``low_open`` / ``high_open`` exclude 0 / 1.

    Returns:
        The value as given; a 0-d array or tensor as its float.
    """
    rule = f"a number in {'(' if low_open else '['}0, 1{')' if high_open else ']'}"
    if not _is_number(value):
        scalar = _scalar_of(value, integral=False)
        if scalar is None:
            raise _fail(name, value, rule, hint, error, wrong_type=True)
        value = scalar
    above_low = value > 0 if low_open else value >= 0
    below_high = value < 1 if high_open else value <= 1
    if not (above_low and below_high):  # NaN fails both comparisons
        raise _fail(name, value, rule, hint, error, wrong_type=False)
    return value


#: the units a size string may end in (case-insensitive): none or ``B``, decimal and binary
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def size_string_bytes(text: str) -> int | None:
    """The bytes a size string says (``"8GiB"``, ``"512MB"``, ``"1_000_000B"``, ``"2.5GB"``),
    or None when it is not one (or says less than a byte): each caller words its own error.

    Examples:
        >>> size_string_bytes("2KiB"), size_string_bytes("lots")
        (2048, None)
    """
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        return None
    size = int(float(m.group(1).replace("_", "")) * _SIZE_UNITS[m.group(2).upper()])
    return size if size >= 1 else None
