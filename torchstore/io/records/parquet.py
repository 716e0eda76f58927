"""Parquet files with pyarrow: complete-file checks, atomic writes and guarded reads.

A Parquet file is only readable once its footer is written (``PAR1`` at both ends); a
recorder killed mid-file leaves row groups without one. Every read here checks that
first, so the error says which file was not finalised instead of pyarrow's "magic bytes
not found". Writes go to a temporary name in the same folder and are renamed into
place, so a reader (or a kill) sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchstore.errors import ParquetFormatError
from torchstore.extras import install_hint
from torchstore.io.durable import fsync_folder

__all__ = [
    "MAGIC",
    "require_pyarrow",
    "check_footer",
    "read_table",
    "write_tables",
    "write_table_atomically",
    "replace_atomically",
]

MAGIC = b"PAR1"


def require_pyarrow():
    """The ``pyarrow`` module, or an ImportError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"Parquet files need pyarrow: {install_hint('lerobot', 'interop')}"
        ) from exc
    return pyarrow


def check_footer(path: str | os.PathLike, *, what: str | None = None) -> None:
    """Raise :class:`~torchstore.errors.ParquetFormatError` unless ``path`` starts and ends
    with ``PAR1``; ``what`` names the file in the message (its path by default)."""
    path = Path(path)
    name = what or str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except FileNotFoundError:
        raise ParquetFormatError(f"{name} is missing") from None
    if head != MAGIC:
        raise ParquetFormatError(f"{name} is not a Parquet file (no PAR1 header, {size} bytes)")
    if size < 12 or tail != MAGIC:
        raise ParquetFormatError(
            f"{name} has no Parquet footer: the recording that wrote it was not finalized "
            "(killed or crashed before closing the file)"
        )


def read_table(
    path: str | os.PathLike, *, columns: Sequence[str] | None = None, what: str | None = None
):
    """A ``pyarrow.Table`` from a complete Parquet file; a ParquetFormatError names the file."""
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    check_footer(path, what=what)
    try:
        return pq.read_table(path, columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as exc:
        raise ParquetFormatError(f"{what or path} cannot be read as Parquet: {exc}") from exc


def replace_atomically(path: str | os.PathLike, write, *, durable: bool = False) -> None:
    """Call ``write(tmp_path)`` then rename the result over ``path`` (same folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_folder(path.parent)


def write_tables(
    path: str | os.PathLike,
    tables: Any,
    *,
    compression: str = "snappy",
    use_dictionary: bool | Sequence[str] = True,
) -> None:
    """Write one ``pyarrow.Table`` (or a sequence of them, one row group each) to ``path``.

    ``use_dictionary`` as in pyarrow: dictionary-encoding float columns costs about 4x the
    write time for no gain (measured), so callers name the columns that repeat.
    """
    require_pyarrow()
    import pyarrow.parquet as pq

    parts = [tables] if not isinstance(tables, list | tuple) else list(tables)
    if not parts:
        raise ValueError("write_tables needs at least one table")
    if not isinstance(use_dictionary, bool):
        use_dictionary = [c for c in use_dictionary if c in parts[0].schema.names]
    with pq.ParquetWriter(
        path, parts[0].schema, compression=compression, use_dictionary=use_dictionary
    ) as writer:
        for table in parts:
            writer.write_table(table, row_group_size=max(table.num_rows, 1))


def write_table_atomically(
    path: str | os.PathLike,
    tables: Any,
    *,
    durable: bool = False,
    compression: str = "snappy",
    use_dictionary: bool | Sequence[str] = True,
) -> None:
    """:func:`write_tables` under a temporary name, renamed over ``path`` when complete."""
    if isinstance(tables, list | tuple) and not tables:
        raise ValueError("write_table_atomically needs at least one table")
    replace_atomically(
        path,
        lambda tmp: write_tables(
            tmp, tables, compression=compression, use_dictionary=use_dictionary
        ),
        durable=durable,
    )
