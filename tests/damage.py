"""Damage a store file in place, the way a bad disk or a stray write would."""

from __future__ import annotations

import os

import h5py


def flip_chunk_byte(
    path: str | os.PathLike, dataset: str, chunk: int, at: int, mask: int = 0x10
) -> int:
    """XOR byte ``at`` of chunk ``chunk`` of ``dataset`` (an HDF5 path such as
    ``"columns/obs"`` or ``"packets/cam"``) with ``mask``, behind HDF5's back; returns the
    dataset's rows per chunk."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        offset = ds.id.get_chunk_info(chunk).byte_offset
        rows = ds.chunks[0]
    assert offset is not None, f"{dataset} chunk {chunk} is not stored"
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        byte = fh.read(1)[0]
        fh.seek(offset + at)
        fh.write(bytes([byte ^ mask]))
    return rows
