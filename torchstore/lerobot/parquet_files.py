"""The Parquet files of a LeRobot dataset: :mod:`torchstore.io.records.parquet` reads whose errors
say the dataset is broken.

:mod:`torchstore.io.records.parquet` knows Parquet only and raises
:class:`~torchstore.errors.ParquetFormatError`; a data file, an episodes table or
``meta/tasks.parquet`` that is missing, not Parquet or unfinished breaks the dataset, so
here the same message comes as a :class:`~torchstore.errors.LeRobotFormatError` (both are
ValueErrors).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

from torchstore.errors import LeRobotFormatError, ParquetFormatError
from torchstore.io.records import parquet

__all__ = ["check_footer", "read_table", "as_lerobot_errors"]


@contextlib.contextmanager
def as_lerobot_errors() -> Iterator[None]:
    """Re-raise a ParquetFormatError inside the block as a LeRobotFormatError."""
    try:
        yield
    except ParquetFormatError as exc:
        raise LeRobotFormatError(str(exc)) from exc


def check_footer(path: str | os.PathLike, *, what: str | None = None) -> None:
    """:func:`torchstore.io.records.parquet.check_footer`, raising LeRobotFormatError."""
    with as_lerobot_errors():
        parquet.check_footer(path, what=what)


def read_table(
    path: str | os.PathLike, *, columns: Sequence[str] | None = None, what: str | None = None
):
    """:func:`torchstore.io.records.parquet.read_table`, raising LeRobotFormatError."""
    with as_lerobot_errors():
        return parquet.read_table(path, columns=columns, what=what)
