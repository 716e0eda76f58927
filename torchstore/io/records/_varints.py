"""Compiled decoding of packed protobuf varints (for :mod:`torchstore.io.records.tfrecord`)."""

from __future__ import annotations

import numpy as np

from torchstore.kernel_cache import cached_njit

__all__ = ["decode_varints"]


@cached_njit(nogil=True)
def decode_varints(raw: np.ndarray, out: np.ndarray) -> int:  # pragma: no cover - compiled
    """Decode the varints in ``raw`` (uint8) into ``out`` (int64, two's complement);
    returns how many, or -1 for a varint over 10 bytes. ``raw`` must end a varint."""
    count = 0
    value = np.uint64(0)
    shift = 0
    for i in range(raw.size):
        b = raw[i]
        if shift > 63:
            return -1
        value |= np.uint64(b & 0x7F) << np.uint64(shift)
        if b < 0x80:
            out[count] = np.int64(value)
            count += 1
            value = np.uint64(0)
            shift = 0
        else:
            shift += 7
    return count
