"""Sizes an importer refuses before it allocates or loops: what a hostile file can declare.

A source file declares its arrays' shapes in a few bytes of metadata; the data it holds
may be far smaller (an HDF5 dataset or a zarr array whose chunks were never written reads
as its fill value). Without bounds, a 1 KB file declaring ``(5, 50000, 50000)`` uint8 rows
makes an importer allocate 11.6 GiB, and one declaring 8e9 unwritten chunks makes it loop
over all of them. The robomimic and zarr importers check these before reading a row:

- :data:`MAX_ROW_BYTES`: the bytes of one step of one key, and of one step of all keys
  together (the importers read at least one whole step at a time);
- :data:`MAX_UNSTORED_CHUNKS` and :data:`MAX_UNSTORED_BYTES`: the chunks an array declares
  but does not store may not outnumber (or outweigh) those it stores by more than these
  (zarr 3 leaves out chunks that hold only the fill value, on purpose, so some are fine);
- :data:`MAX_CHUNK_BYTES`: one chunk of an array, decoded (a chunk is decoded whole to
  read any row of it, and a few compressed bytes can declare gigabytes);
- :data:`MAX_KEPT_BYTES`: an array kept whole in the store's metadata (a robomimic demo's
  ``src_demo_inds`` or ``initial_state/...``, a robomimic filter key, a zarr ``meta/``
  array other than ``episode_ends``).

The importers read these module attributes when they run, so setting one here changes
every importer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from torchstore.errors import DatasetFormatError

__all__ = [
    "MAX_ROW_BYTES",
    "MAX_UNSTORED_CHUNKS",
    "MAX_UNSTORED_BYTES",
    "MAX_KEPT_BYTES",
    "MAX_CHUNK_BYTES",
    "check_row",
    "check_chunk",
    "check_step",
    "check_unstored",
    "check_kept",
    "sized",
]

#: Bytes of one row (one step) of one key, and of one step of all keys together: 256 MiB
#: (a 4K RGB frame is 25 MB; real steps of several cameras stay well under it).
MAX_ROW_BYTES = 256 * 2**20
#: Chunks an array may declare without storing them, beyond the number it stores.
MAX_UNSTORED_CHUNKS = 2**16
#: Bytes of those chunks (their fill value, written into the store), beyond the bytes of
#: the chunks it stores.
MAX_UNSTORED_BYTES = 2**30
#: Bytes of an array kept whole in the store's metadata (as JSON, so it stays small).
MAX_KEPT_BYTES = 16 * 2**20
#: Bytes of one chunk, decoded: 1 GiB (diffusion-policy aims at 2 MB, HDF5 allows 4 GiB).
MAX_CHUNK_BYTES = 2**30


def sized(n: float) -> str:
    """``n`` bytes for a message: ``2.33 GiB``, ``512 KiB``, ``7 bytes``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def _row_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize


def _refuse_over(
    where: str,
    what: str,
    shape: Sequence[int],
    dtype: np.dtype,
    most: int,
    limit: str,
    decoded: str = "",
) -> None:
    """Refuse an array of ``shape`` and ``dtype`` (each ``what``) over ``most`` bytes, the
    limit named ``limit``."""
    size = _row_bytes(shape, dtype)
    if size > most:
        raise DatasetFormatError(
            f"{where}: each {what} is {np.dtype(dtype)} {tuple(int(s) for s in shape)}, "
            f"{sized(size)}{decoded}; a {what} may hold at most {sized(most)} "
            f"(torchstore.formats.limits.{limit})"
        )


def check_row(where: str, shape: Sequence[int], dtype: np.dtype) -> None:
    """Refuse a key whose rows of ``shape`` and ``dtype`` exceed :data:`MAX_ROW_BYTES`."""
    _refuse_over(where, "row", shape, dtype, MAX_ROW_BYTES, "MAX_ROW_BYTES")


def check_step(where: str, keys: dict[str, int]) -> None:
    """Refuse a step (one row of every key, ``{key: row bytes}``) over :data:`MAX_ROW_BYTES`."""
    total = sum(keys.values())
    if total > MAX_ROW_BYTES:
        biggest = sorted(keys, key=keys.__getitem__, reverse=True)[:3]
        raise DatasetFormatError(
            f"{where}: one step of all {len(keys)} keys is {sized(total)} (the largest: "
            f"{', '.join(biggest)}); a step may hold at most {sized(MAX_ROW_BYTES)} "
            "(torchstore.formats.limits.MAX_ROW_BYTES)"
        )


def check_chunk(where: str, chunk: Sequence[int], dtype: np.dtype) -> None:
    """Refuse chunks of shape ``chunk`` and ``dtype`` over :data:`MAX_CHUNK_BYTES`."""
    _refuse_over(where, "chunk", chunk, dtype, MAX_CHUNK_BYTES, "MAX_CHUNK_BYTES", " decoded")


def check_unstored(where: str, declared: int, stored: int, chunk_bytes: int) -> None:
    """Refuse an array that stores ``stored`` of the ``declared`` chunks (``chunk_bytes``
    each) when the rest outnumber or outweigh the stored ones by more than the limits."""
    missing = max(0, declared - stored)
    excess = missing - stored  # the unstored chunks beyond one per stored chunk
    if excess > MAX_UNSTORED_CHUNKS or excess * chunk_bytes > MAX_UNSTORED_BYTES:
        raise DatasetFormatError(
            f"{where}: declares {declared} chunks ({sized(declared * chunk_bytes)}) but "
            f"stores {stored}; the {missing} not stored would read as the fill value, more "
            f"than the stored ones by over {MAX_UNSTORED_CHUNKS} chunks or "
            f"{sized(MAX_UNSTORED_BYTES)} (torchstore.formats.limits): a damaged or "
            "unfinished file"
        )


def check_kept(where: str, nbytes: int) -> None:
    """Refuse an array kept in the metadata when it exceeds :data:`MAX_KEPT_BYTES`."""
    if nbytes > MAX_KEPT_BYTES:
        raise DatasetFormatError(
            f"{where}: holds {sized(nbytes)}; an array kept in the store's metadata may "
            f"hold at most {sized(MAX_KEPT_BYTES)} (torchstore.formats.limits.MAX_KEPT_BYTES)"
        )
