"""Text in robomimic-layout files: per-step string datasets to int64 codes and back.

robomimic keeps strings as HDF5 strings: ``env_args`` and ``model_file`` attributes, the
demo names of ``mask/<name>`` as fixed-length bytes. A per-step string dataset (one
string per step, such as a ``language_instruction`` written out of an RLDS dataset) is
held in a store as an RLDS import holds text: an int64 column of codes into a string
table, ``metadata["robomimic"]["string_tables"][column]``, the strings in order of first
appearance. The key records the dataset's string type (:attr:`DemoKey.encoding`, and its
dtype: ``|O`` for variable-length strings, ``|S<n>`` for fixed-length bytes), so the
export writes the same strings back in the same type.

Only UTF-8 (or ASCII) strings, one per step, are text: a string dataset of another shape,
or bytes that are not UTF-8, is refused in one line naming the file, demo and key.

Examples:
    >>> import numpy as np
    >>> text_array(["pick", "place"], np.array([1, 0, 1]), "|O", "utf-8").tolist()
    ['place', 'pick', 'place']
    >>> text_array(["pick", "place"], np.array([0, 1]), "|S5", "ascii").tolist()
    [b'pick', b'place']
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np

from torchstore.errors import DatasetFormatError

__all__ = ["string_encoding", "text_array", "text_dtype", "TextCoder"]

#: Steps read at once from a text dataset (strings are read as Python objects).
_TEXT_ROWS = 65536


def string_encoding(dtype: np.dtype) -> str | None:
    """The encoding of an HDF5 string dtype (``"utf-8"`` or ``"ascii"``), None for any other."""
    info = h5py.check_string_dtype(dtype)
    return None if info is None else info.encoding


def text_dtype(dtype: str, encoding: str) -> np.dtype:
    """The HDF5 type a text key is written back as: variable-length strings of
    ``encoding`` for ``|O``, else the fixed-length bytes ``dtype`` names."""
    if np.dtype(dtype).kind == "O":
        return h5py.string_dtype(encoding)
    return np.dtype(dtype)


def text_array(table: list[str], codes: np.ndarray, dtype: str, encoding: str) -> np.ndarray:
    """``codes`` as the strings of ``table``, in the array type of ``dtype`` (``|O``: str
    objects; ``|S<n>``: bytes of ``encoding``).

    Raises:
        DatasetFormatError: a code outside the table.
    """
    codes = np.asarray(codes)
    bad = (codes < 0) | (codes >= len(table))
    if bad.any():
        raise DatasetFormatError(
            f"text code {int(codes[bad][0])} is outside its string table of {len(table)}; "
            "the store's metadata does not match its rows"
        )
    strings = np.asarray(table, dtype=object)[codes]
    if np.dtype(dtype).kind == "O":
        return strings
    return np.array([s.encode(encoding) for s in strings.flat], dtype=dtype).reshape(codes.shape)


def _strings(where: str, ds: h5py.Dataset, start: int, stop: int) -> Iterator[str]:
    for a in range(start, stop, _TEXT_ROWS):
        try:
            values = ds[a : min(a + _TEXT_ROWS, stop)]
        except (OSError, RuntimeError, ValueError) as exc:
            raise DatasetFormatError(
                f"{where}: cannot be read (truncated or damaged file?): {exc}"
            ) from None
        for value in values:
            raw = value if isinstance(value, bytes) else bytes(value)
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DatasetFormatError(
                    f"{where}: holds the bytes {raw[:40]!r}, not UTF-8 text; a store holds "
                    "text as UTF-8 strings"
                ) from None


class TextCoder:
    """The string tables of a file's text keys, filled by :meth:`scan` (every demo, before
    any row is written, so every code is known) and used by :meth:`codes`."""

    def __init__(self) -> None:
        self.tables: dict[str, list[str]] = {}
        self._index: dict[str, dict[str, int]] = {}

    def scan(self, column: str, where: str, ds: h5py.Dataset, length: int) -> None:
        """Add the strings of one demo's text dataset to ``column``'s table."""
        table = self.tables.setdefault(column, [])
        index = self._index.setdefault(column, {})
        for text in _strings(where, ds, 0, length):
            if text not in index:
                index[text] = len(table)
                table.append(text)

    def codes(self, column: str, where: str, ds: h5py.Dataset, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of a text dataset as int64 codes into ``column``'s table."""
        index = self._index[column]
        return np.fromiter(
            (index[t] for t in _strings(where, ds, start, stop)), np.int64, stop - start
        )
