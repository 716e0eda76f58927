"""The refilled window: a store larger than memory sampled from ``K`` resident blocks.

:class:`~torchstore.window.block_window.BlockWindow` keeps ``K`` blocks of the store resident
and reads the next one on a background thread (through
:class:`~torchstore.data.residency.block_read.ChunkReader`) while batches are drawn from the
active ones by the samplers' core (the refill schedule of :mod:`torchstore.samplers.refill`,
Philox draws, the window's sum-trees); :class:`~torchstore.window.window_storage.WindowStorage`
and :class:`~torchstore.window.window_storage.WindowSampler` are its read-only torchrl face, and
the DataModules' ``resident=`` budgets sample it. It sits above both layers it joins: imports
:mod:`torchstore.data` and :mod:`torchstore.samplers`, and neither imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.window.block_window import BlockWindow
    from torchstore.window.window_storage import WindowSampler, WindowStorage

_EXPORTS = {
    "BlockWindow": "torchstore.window.block_window",
    "WindowStorage": "torchstore.window.window_storage",
    "WindowSampler": "torchstore.window.window_storage",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["BlockWindow", "WindowSampler", "WindowStorage"]
