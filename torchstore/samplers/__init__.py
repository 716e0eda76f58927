"""Index policies over a store: uniform, prioritized (sum-tree), sequence windows, ERE, Philox.

The index math lives in modules with no torchrl import (:mod:`~torchstore.samplers.draws`,
:mod:`~torchstore.samplers.sumtree`, :mod:`~torchstore.samplers.ere`,
:mod:`~torchstore.samplers.windows`, :mod:`~torchstore.samplers.philox`, and the refill
schedule of a window over a store larger than memory, :mod:`~torchstore.samplers.refill`):
pure tensor functions, testable and compilable alone, with compiled CPU twins in
:mod:`~torchstore.samplers.kernels`. The torchrl ``Sampler`` subclasses
(:class:`UniformSampler`, :class:`PrioritizedSampler`, :class:`SequenceWindowSampler`),
:func:`sample_into` and the Lightning DataModules are faces over them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.samplers.device import (
        PhiloxSampler,
        empty_batch,
        sample_into,
        update_priority_,
    )
    from torchstore.samplers.draws import importance_weight, prioritized_rows, uniform_rows
    from torchstore.samplers.ere import (
        ERE,
        recent_range,
    )
    from torchstore.samplers.philox import (
        PhiloxStream,
        counters_from_offset,
        philox4x32,
        randint_below,
        uniform_from_words,
    )
    from torchstore.samplers.prioritized import PrioritizedSampler
    from torchstore.samplers.refill import RefillSchedule
    from torchstore.samplers.sequence import SequenceWindowSampler
    from torchstore.samplers.sumtree import SumTree
    from torchstore.samplers.uniform import UniformSampler
    from torchstore.samplers.windows import (
        RowSet,
        Windows,
        choose_windows,
        clip_segments,
        context_windows,
        sample_windows,
    )

_EXPORTS = {
    "PhiloxSampler": "torchstore.samplers.device",
    "empty_batch": "torchstore.samplers.device",
    "sample_into": "torchstore.samplers.device",
    "update_priority_": "torchstore.samplers.device",
    "ERE": "torchstore.samplers.ere",
    "recent_range": "torchstore.samplers.ere",
    "PhiloxStream": "torchstore.samplers.philox",
    "counters_from_offset": "torchstore.samplers.philox",
    "philox4x32": "torchstore.samplers.philox",
    "randint_below": "torchstore.samplers.philox",
    "uniform_from_words": "torchstore.samplers.philox",
    "PrioritizedSampler": "torchstore.samplers.prioritized",
    "SequenceWindowSampler": "torchstore.samplers.sequence",
    "SumTree": "torchstore.samplers.sumtree",
    "UniformSampler": "torchstore.samplers.uniform",
    "Windows": "torchstore.samplers.windows",
    "choose_windows": "torchstore.samplers.windows",
    "clip_segments": "torchstore.samplers.windows",
    "sample_windows": "torchstore.samplers.windows",
    "importance_weight": "torchstore.samplers.draws",
    "prioritized_rows": "torchstore.samplers.draws",
    "uniform_rows": "torchstore.samplers.draws",
    "RowSet": "torchstore.samplers.windows",
    "context_windows": "torchstore.samplers.windows",
    "RefillSchedule": "torchstore.samplers.refill",
}

# the refilled window reads the store file, so it left the samplers for torchstore.window
_MOVED = {
    "BlockWindow": "torchstore.window.block_window",
    "WindowStorage": "torchstore.window.window_storage",
    "WindowSampler": "torchstore.window.window_storage",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _MOVED)  # a new public name goes here too

__all__ = [
    "ERE",
    "PhiloxSampler",
    "PhiloxStream",
    "empty_batch",
    "sample_into",
    "update_priority_",
    "PrioritizedSampler",
    "SequenceWindowSampler",
    "SumTree",
    "UniformSampler",
    "Windows",
    "choose_windows",
    "clip_segments",
    "counters_from_offset",
    "philox4x32",
    "randint_below",
    "recent_range",
    "sample_windows",
    "uniform_from_words",
    "importance_weight",
    "prioritized_rows",
    "uniform_rows",
    "RowSet",
    "context_windows",
    "RefillSchedule",
]
