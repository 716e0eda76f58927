"""Residency: a store's rows moved from the file into memory, by contiguous reads only.

:class:`~torchstore.data.residency.resident.ResidentStore` loads columns whole (what
``TrajectoryStore.resident()`` returns, as the read-only torchrl storage
:class:`~torchstore.data.residency.resident_storage.ResidentStorage`);
:class:`~torchstore.data.residency.windowed.WindowedStore` holds a slab of rows moved by hand;
:class:`~torchstore.data.residency.block_read.ChunkReader` (with the compiled
:mod:`~torchstore.data.residency.direct_read`) reads a block of rows straight from the file's
chunks with the GIL released and verified, which is how the refilled window of
:mod:`torchstore.window` fills its slots. Imports :mod:`torchstore.data.file`,
:mod:`torchstore.data.rows`, :mod:`torchstore.data.replay` and :mod:`torchstore.io`; never the
samplers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.data.residency.block_read import ChunkReader
    from torchstore.data.residency.resident import ResidentStore
    from torchstore.data.residency.resident_storage import ResidentStorage
    from torchstore.data.residency.windowed import WindowedStore

_EXPORTS = {
    "ChunkReader": "torchstore.data.residency.block_read",
    "ResidentStore": "torchstore.data.residency.resident",
    "ResidentStorage": "torchstore.data.residency.resident_storage",
    "WindowedStore": "torchstore.data.residency.windowed",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["ChunkReader", "ResidentStorage", "ResidentStore", "WindowedStore"]
