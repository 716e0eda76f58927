"""Batch-sized CPU buffers that are used again once every tensor viewing them is gone.

A CPU gather of large rows (a 256-frame batch of 84x84x3 pixels is 5.4 MB) asks the
allocator for a new block every batch and gives the last one back. glibc serves blocks
that size from the heap once the first one is freed (its mmap threshold follows the
largest freed block), and the small allocations made between batches split the freed
holes, so the heap keeps growing: measured here, a pixel window with a 606 MiB budget
peaked 500 MiB above it after 2000 batches. Asking glibc to map every large block instead
(``MALLOC_MMAP_THRESHOLD_``) keeps the process at its budget but halves batches/s: every
batch then faults in and zeroes fresh pages. :class:`RecycledBuffers` keeps a few buffers
of each size and hands one out again only when nothing refers to it any more (a
``weakref.finalize`` on the array the tensor was made from fires when the last view of
its storage dies), so the batch memory is allocated once and never faulted in again.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

__all__ = ["RECYCLE_BYTES", "RecycledBuffers"]

#: gathers at least this large take a recycled buffer; smaller ones are cheap to allocate
RECYCLE_BYTES = 1 << 20


class RecycledBuffers:
    """Free CPU buffers by size, at most ``keep`` of each.

    Args:
        keep: free buffers kept per size; one released beyond that goes back to the
            allocator (a caller holding many batches at once costs memory, as it would
            without the pool).
    """

    def __init__(self, keep: int = 4):
        self.keep = int(keep)
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        #: buffers allocated and handed out again (for tests and benchmarks)
        self.allocated = 0
        self.reused = 0

    def empty(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised ``[rows, width]`` CPU tensor of ``dtype`` on a recycled buffer.

        The buffer comes back to the pool when the returned tensor and every view of its
        storage are gone.
        """
        nbytes = rows * width * dtype.itemsize
        with self._lock:
            free = self._free.get(nbytes)
            raw = free.pop() if free else None
        if raw is None:
            raw = np.empty(nbytes, dtype=np.uint8)
            self.allocated += 1
        else:
            self.reused += 1
        lease = raw[:]  # a view of its own: the tensor keeps it (and only it) alive
        weakref.finalize(lease, self._release, raw)
        return torch.from_numpy(lease).view(dtype).view(rows, width)

    def _release(self, raw: np.ndarray) -> None:
        with self._lock:
            free = self._free.setdefault(raw.nbytes, [])
            if len(free) < self.keep:
                free.append(raw)

    def __reduce__(self):
        # a copy or a pickle starts empty: the free buffers are this process's memory
        return (RecycledBuffers, (self.keep,))

    def clear(self) -> None:
        """Drop every free buffer."""
        with self._lock:
            self._free.clear()
