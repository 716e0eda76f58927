"""Index policies over a store: uniform, prioritized (sum-tree), sequence windows, ERE, Philox.

The index math lives in modules with no torchrl import (:mod:`~torchstore.samplers.sumtree`,
:mod:`~torchstore.samplers.ere`, :mod:`~torchstore.samplers.windows`,
:mod:`~torchstore.samplers.philox`): pure tensor functions, testable and compilable alone.
The torchrl ``Sampler`` subclasses (:class:`UniformSampler`, :class:`PrioritizedSampler`,
:class:`SequenceWindowSampler`) wrap them.
"""

from __future__ import annotations

from torchstore.samplers.device import PhiloxSampler, empty_batch, sample_into, update_priority_
from torchstore.samplers.ere import ERE, recent_range
from torchstore.samplers.philox import (
    PhiloxStream,
    counters_from_offset,
    philox4x32,
    randint_below,
    uniform_from_words,
)
from torchstore.samplers.prioritized import PrioritizedSampler
from torchstore.samplers.sequence import SequenceWindowSampler
from torchstore.samplers.sumtree import SumTree
from torchstore.samplers.uniform import UniformSampler
from torchstore.samplers.windows import Windows, choose_windows, clip_segments, sample_windows

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
]
