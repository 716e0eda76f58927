"""The index policies of the sampling core as pure functions of state tensors and one stream.

Each policy is *state* (tensors: a fill level, a sum-tree, episode segments) + a
:class:`~torchstore.samplers.philox.PhiloxStream` + ``n`` -> row indices (and importance
weights). The torchrl ``Sampler`` classes, :func:`~torchstore.samplers.sample_into` and the
Lightning DataModules are faces over these functions, so the same seed and stream position
give the same rows on every face.

- :func:`uniform_rows`: uniform over a (ring) range of ``count`` rows starting at ``start``
  (all rows, or ERE's newest ``c_k``); :func:`uniform_gathered` draws and gathers in one
  CPU call;
- :func:`prioritized_rows`: proportional to the sum-tree's leaves over the whole tree or a
  ring range, with :func:`importance_weight`;
- :func:`importance_weight`: the one importance-weight formula;
- windows and row sets: :mod:`torchstore.samplers.windows`.

Everything here is branch-free tensor code with fixed shapes when the bounds are tensors, so
it runs under ``torch.compile(fullgraph=True)`` and in a captured CUDA graph.

Examples:
    >>> import torch
    >>> from torchstore.samplers.philox import PhiloxStream, cpu_kernels
    >>> uniform_rows(PhiloxStream(3), 4, torch.tensor(10)).tolist()
    [8, 2, 7, 1]
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from torchstore.samplers.philox import PhiloxStream, cpu_kernels
from torchstore.samplers.sumtree import SumTree

__all__ = ["importance_weight", "uniform_rows", "uniform_gathered", "prioritized_rows"]


def importance_weight(value: Tensor, p_min: Tensor, beta: float) -> Tensor:
    """Importance weights of drawn rows, normalised buffer-wide: ``(value / p_min) ** -beta``.

    With ``P(i) = value_i / total`` and ``N`` sampleable rows, the weight ``(N * P(i)) **
    -beta`` divided by the largest weight in the range (that of the row with the smallest
    positive stored value ``p_min``) is this closed form; ``N`` and ``total`` cancel. It
    matches torchrl's ``PrioritizedSampler`` (its min-tree) and lies in ``(0, 1]``.

    Args:
        value: stored values ``(p + eps) ** alpha`` of the drawn rows.
        p_min: smallest positive stored value in the sampled range (0-d).
        beta: importance-sampling exponent (read at trace time under ``torch.compile``).

    Returns:
        float32 weights of ``value``'s shape.
    """
    return torch.pow(value / p_min, -beta).to(torch.float32)


def uniform_rows(
    stream: PhiloxStream,
    n: int,
    count: Tensor | int,
    *,
    start: Tensor | int = 0,
    capacity: int | None = None,
) -> Tensor:
    """``n`` rows uniform over the ring range ``(start + [0, count)) % capacity``.

    ``count`` may be a 0-d device tensor (a fill level): the draw then never reads it on the
    host, and a compiled caller does not recompile as it grows. ``count == 0`` gives
    ``start``. Without ``capacity`` the range is the plain ``[start, start + count)``.
    """
    offset = stream.randint(n, count)
    if capacity is None:
        return offset if isinstance(start, int) and start == 0 else offset + start
    return (offset + start) % capacity


def uniform_gathered(
    stream: PhiloxStream, n: int, count: int, start: int, source: np.ndarray
) -> tuple[Tensor, np.ndarray] | None:
    """:func:`uniform_rows` over ``[start, start + count)`` and the rows of ``source`` (a
    CPU block as a 2-D numpy array) it drew, in one compiled call: ``(index, rows)``, a new
    tensor and a new array. None where the stream has no CPU kernel (graph-safe mode
    ``block=0``, an accelerator, kernels off); nothing is drawn then.

    The same stream positions and rows as :func:`uniform_rows`. For a small batch the
    calls are most of the cost: 256 pendulum rows drawn and gathered in 16-22 us, against
    27-30 us for ``uniform_rows`` and a gather (one thread).
    """
    kernels = cpu_kernels(stream.key) if stream.block else None
    if kernels is None:
        return None
    words, first = stream.block_words(n)
    index, rows = kernels.draw_gather(words, first, count, start, source, n)
    return torch.from_numpy(index), rows


def prioritized_rows(
    tree: SumTree,
    stream: PhiloxStream,
    n: int,
    beta: float,
    *,
    count: Tensor | int | None = None,
    start: Tensor | int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` rows drawn with probability proportional to the tree's leaves.

    ``count=None`` descends the whole tree (the cheap path: valid whenever no leaf outside
    the sampleable rows holds mass); otherwise the ring range of ``count`` leaves from
    ``start`` (ERE's newest rows, or a prefix). One uniform of the tree's dtype per row.

    Returns:
        ``(index, weight, total)``: int64 rows, float32 :func:`importance_weight`, and the
        range's total mass (0-d; zero means nothing can be drawn and ``index`` is
        unspecified).
    """
    if tree.dtype in (torch.float64, torch.float32):
        u = stream.uniform(n, dtype=tree.dtype)
    else:  # a half-precision tree: float32 uniforms in the tree's dtype, kept below 1
        u = stream.uniform(n, dtype=torch.float32).to(tree.dtype)
        below_one = 1.0 - torch.finfo(tree.dtype).eps / 2
        u = torch.clamp(u, max=below_one)
    return weighted_rows(tree, u, beta, count=count, start=start)


def weighted_rows(
    tree: SumTree,
    u: Tensor,
    beta: float,
    *,
    count: Tensor | int | None = None,
    start: Tensor | int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`prioritized_rows` of given uniforms ``u`` (of the tree's dtype, in ``[0, 1)``).

    On a CPU outside tracing the whole-tree case is one compiled call that descends and
    divides by ``p_min`` (the same bits); only the ``pow`` of :func:`importance_weight`
    stays a tensor operation.
    """
    if count is None:
        nodes = tree._nodes  # noqa: SLF001 - the tree's own buffer
        kernels = cpu_kernels(nodes)
        if kernels is not None:
            index, ratio, total = kernels.descend_whole(
                nodes, tree.depth, tree.capacity, u, ratio=True
            )
            return index, torch.pow(ratio, -beta, out=ratio).to(torch.float32), total
        index, value, total = tree.sample_whole(u)
        p_min = tree.min_whole()
    else:
        index, value, total = tree.sample(u, count, start=start)
        p_min = tree.min(count, start=start)
    return index, importance_weight(value, p_min, beta), total
