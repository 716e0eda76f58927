"""Argument types for the ``torchstore`` command: every value is checked where it is parsed.

Each function here is an argparse ``type=``: it turns the text into a value or raises
``argparse.ArgumentTypeError``, which argparse prints as one usage line (exit 2) before
any command runs. No command sees a zero episode count, a NaN frame rate or an output
path that is a directory. :func:`cli_words` turns the library's keyword names in an error
message into the command's flags, in one place.

Examples:
    >>> positive_int("3")
    3
    >>> finite_float(0.0, 1000.0)("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a finite number, got 'nan'
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "bounded_int",
    "positive_int",
    "non_negative_int",
    "seed",
    "finite_float",
    "existing_path",
    "store_path",
    "existing_file",
    "existing_folder",
    "output_file",
    "output_folder",
    "folder_path",
    "cli_words",
    "ValueType",
]

#: Seeds feed numpy's ``default_rng``, which takes any non-negative integer; 2**63 - 1
#: keeps them in int64, the type the manifest stores.
MAX_SEED = 2**63 - 1

ValueType = Callable[[str], object]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _named(fn: ValueType, name: str) -> ValueType:
    # argparse names the type in "invalid <name> value" messages only when the callable
    # raises ValueError/TypeError; ours raise ArgumentTypeError, but a readable __name__
    # also makes ``--help`` and the parser-walking tests say what each option takes.
    fn.__name__ = name
    return fn


def bounded_int(low: int, high: int | None = None) -> ValueType:
    """An integer in ``[low, high]`` (``high=None``: no upper bound)."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < low or (high is not None and value > high):
            rule = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be an integer {rule}, got {text!r}")
        return value

    return _named(parse, "int")


#: At least one (episodes, steps, counts).
positive_int = bounded_int(1)
#: Zero or more.
non_negative_int = bounded_int(0)
#: A random seed: a non-negative integer that fits in int64.
seed = bounded_int(0, MAX_SEED)


def finite_float(low: float, high: float, *, low_inclusive: bool = False) -> ValueType:
    """A finite number in ``(low, high]`` (``[low, high]`` with ``low_inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        above = value >= low if low_inclusive else value > low
        if not above or value > high:
            bracket = "[" if low_inclusive else "("
            raise argparse.ArgumentTypeError(
                f"must be in {bracket}{low:g}, {high:g}], got {text!r}"
            )
        return value

    return _named(parse, "float")


def existing_path(text: str) -> Path:
    """An input that exists (a file or a folder)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or folder: {text}")
    return path


existing_path = _named(existing_path, "path")


def store_path(text: str) -> Path | str:
    """An input that exists, or a store's URL (``https://``, ``http://``, ``hf://``,
    ``s3://``, ``gs://``), kept as typed: it is opened read-only in place."""
    from torchstore.io.remote.ranged import is_url

    return text if is_url(text) else existing_path(text)


store_path = _named(store_path, "path")


def existing_file(text: str) -> Path:
    """An input file that exists."""
    path = existing_path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; a file is expected")
    return path


existing_file = _named(existing_file, "file")


def existing_folder(text: str) -> Path:
    """An input folder that exists."""
    path = existing_path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return path


existing_folder = _named(existing_folder, "folder")


def _check_parent(path: Path, text: str) -> None:
    # The nearest existing ancestor must be a folder: missing folders are created when
    # the command writes, but "x.txt/out.h5" can never be written.
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{ancestor} is a file, so {text} cannot be written")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"the folder {ancestor} is not writable, so {text} cannot be written"
        )


def output_file(text: str) -> Path:
    """An output file path: not a folder, with a parent that can be created and written."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path cannot be written")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file path")
    _check_parent(path, text)
    return path


output_file = _named(output_file, "output file")


def output_folder(text: str) -> Path:
    """An output folder: an existing folder or a path where one can be created."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path cannot be written")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    if not path.exists():
        _check_parent(path, text)
    elif not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"the folder {text} is not writable")
    return path


output_folder = _named(output_folder, "output folder")


def folder_path(text: str) -> Path:
    """A folder that may be read-only or not exist yet (a cache): only never a file."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path is not a folder")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    return path


folder_path = _named(folder_path, "cache folder")


def cli_words(message: str, flags: Iterable[tuple[str, str]]) -> str:
    """``message`` with the library's keywords replaced by the command's flags, on one line.

    Args:
        message: an error message written for library callers (``pass overwrite=True``).
        flags: ``(dest, flag)`` pairs of the command that failed (``("fps", "--fps")``).

    Examples:
        >>> cli_words("x exists; pass overwrite=True to replace it", [("overwrite", "--overwrite")])
        'x exists; pass --overwrite to replace it'
        >>> cli_words("a resample needs fps=", [("fps", "--fps")])
        'a resample needs --fps'
    """
    text = " ".join(message.split())
    for dest, flag in flags:
        text = re.sub(rf"(?<![\w-]){re.escape(dest)}=True\b", flag, text)
        text = re.sub(rf"(?<![\w-]){re.escape(dest)}=(?=[^\s=])", f"{flag} ", text)
        text = re.sub(rf"(?<![\w-]){re.escape(dest)}=", flag, text)
        if dest == "overwrite":
            text = text.replace("overwrite it explicitly", f"pass {flag}")
    return text
