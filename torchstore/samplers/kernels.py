"""Compiled CPU kernels for the sampling core's hot loops (numba), one answer with the tensors.

On a CPU, eager tensor code pays a few microseconds per operation whatever the batch, and
the hot loops of the core are long chains of small operations: a sum-tree descent is about
20 levels x 8 ops, a batched priority update 20 levels x 6, a Philox block 10 rounds x 15.
These kernels run the same arithmetic as a plain loop compiled by numba (LLVM, shipped in
the wheels: no compiler needed on the user's machine):

- :func:`philox_words`: the Philox4x32-10 words of consecutive counters
  (:func:`~torchstore.samplers.philox.philox4x32` over
  :func:`~torchstore.samplers.philox.counters_from_offset`);
- :func:`descend_whole`: :meth:`~torchstore.samplers.sumtree.SumTree.sample_whole`'s
  descent, the same comparisons and subtractions in the same order;
- :func:`update_tree`: :meth:`~torchstore.samplers.sumtree.SumTree.update` (last write
  wins; then stored level by stored level every touched ancestor recomputed from its four
  final grandchildren as ``(a + b) + (c + d)`` and their min: the same float sums);
  :func:`checked_update` validates a prioritized sampler's batch and writes it in the same
  call.

The tensor versions stay: they run on accelerators, under ``torch.compile`` and inside CUDA
graphs. Both give bit-identical results for the same inputs (a property test holds them
together). :func:`torchstore.samplers.philox.cpu_kernels` decides, per call, whether a
tensor takes a kernel (CPU, not tracing, kernels on); it imports this module (and numba,
about a second) only on the first such call. ``TORCHSTORE_KERNELS=0`` in the environment
turns the kernels off.

Both work on the tree's one ``[2L, 2]`` node buffer, every other level stored (see
:mod:`~torchstore.samplers.sumtree`): a double step of the descent, or a stored level of
the update, reads one cache line. Speed-ups over the tensor code at 1 M rows, 4096-row
batches, one thread (medians; the absolute times depend on the load): the whole-tree
descent 2.3-10x (memory-latency bound: the kernel walks all draws a level at a time, in
mass order, to keep many cache misses in flight and neighbouring draws on shared paths),
the update 5x, 4096 Philox words about 60x. Against two separate arrays holding every level, a
cold-cache 4096-draw descent of a 1 M-leaf tree went from about 1.0 to 0.7 ms and the
update of the drawn rows right after it from about 0.85 to 0.45 ms (interleaved medians,
thread clock, loaded machine).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from torchstore.data.rows.rowgather import gather_rows, prefetch
from torchstore.kernel_cache import cached_njit

__all__ = [
    "philox_words",
    "randint_words",
    "randint_rows",
    "draw_gather",
    "draw_runs_gather",
    "uniform_words",
    "bucket_sorted",
    "descend_whole",
    "update_tree",
    "scan_priorities",
    "checked_update",
]

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_NO_RAW = np.empty(0, dtype=np.float64)
#: how many draws ahead the descent asks for the cache line it will read
_AHEAD = 16
#: counters a Philox kernel call works on at a time: four word arrays of this many fit in L1
_PHILOX_LANES = 256


@cached_njit(nogil=True)
def _philox(out, key0, key1, s_lo, s_hi, offset):  # pragma: no cover - compiled
    # Philox4x32-10 with its ten rounds written out (a fixed trip count LLVM unrolls), a
    # chunk of counters at a time into four word arrays, then stored as [n, 4] rows. The
    # counters of a chunk are independent, so the round loop runs on vector registers (32x32
    # multiplies as vpmuludq); storing [n, 4] rows straight from the rounds kept it scalar.
    # Measured 3x faster than one counter at a time (65536 counters: 1.26 ms -> 0.41 ms).
    ks0 = np.empty(10, dtype=np.uint64)
    ks1 = np.empty(10, dtype=np.uint64)
    k0 = key0
    k1 = key1
    for r in range(10):
        ks0[r] = k0
        ks1[r] = k1
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    w0 = np.empty(_PHILOX_LANES, dtype=np.uint64)
    w1 = np.empty(_PHILOX_LANES, dtype=np.uint64)
    w2 = np.empty(_PHILOX_LANES, dtype=np.uint64)
    w3 = np.empty(_PHILOX_LANES, dtype=np.uint64)
    n = out.shape[0]
    for first in range(0, n, _PHILOX_LANES):
        m = min(_PHILOX_LANES, n - first)
        for i in range(m):
            pos = np.uint64(offset) + np.uint64(first + i)
            c0 = pos & _MASK32
            c1 = (pos >> _SHIFT32) & _MASK32
            c2 = s_lo
            c3 = s_hi
            for r in range(10):
                p0 = _M0 * c0
                p1 = _M1 * c2
                c0, c1, c2, c3 = (
                    (p1 >> _SHIFT32) ^ c1 ^ ks0[r],
                    p1 & _MASK32,
                    (p0 >> _SHIFT32) ^ c3 ^ ks1[r],
                    p0 & _MASK32,
                )
            w0[i] = c0
            w1[i] = c1
            w2[i] = c2
            w3[i] = c3
        for i in range(m):
            out[first + i, 0] = np.int64(w0[i])
            out[first + i, 1] = np.int64(w1[i])
            out[first + i, 2] = np.int64(w2[i])
            out[first + i, 3] = np.int64(w3[i])


def philox_words(key: Tensor, stream: int, offset: int, n: int) -> Tensor:
    """``[n, 4]`` int64 Philox4x32-10 words of counters ``offset .. offset + n - 1`` (CPU).

    Equal to ``philox4x32(counters_from_offset(offset, n, stream), key)``.
    """
    out = np.empty((n, 4), dtype=np.int64)
    k = key.tolist()
    _philox(
        out,
        np.uint64(k[0] & 0xFFFFFFFF),
        np.uint64(k[1] & 0xFFFFFFFF),
        np.uint64(stream & 0xFFFFFFFF),
        np.uint64((stream >> 32) & 0xFFFFFFFF),
        np.uint64(offset),
    )
    return torch.from_numpy(out)


@cached_njit(nogil=True)
def _randint(words, n, out, offset):  # pragma: no cover - compiled
    # randint_below's exact 32-bit limb products, in uint64 (every product < 2**64), plus
    # offset
    n1 = np.uint64(n) >> _SHIFT32
    n0 = np.uint64(n) & _MASK32
    for i in range(out.shape[0]):
        x1 = np.uint64(words[i, 0]) & _MASK32
        x0 = np.uint64(words[i, 1]) & _MASK32
        hi00 = (x0 * n0) >> _SHIFT32
        p01 = x0 * n1
        p10 = x1 * n0
        mid = hi00 + (p01 & _MASK32) + (p10 & _MASK32)
        draw = x1 * n1 + (p01 >> _SHIFT32) + (p10 >> _SHIFT32) + (mid >> _SHIFT32)
        out[i] = np.int64(draw) + offset


def randint_words(words: Tensor, n: int) -> Tensor:
    """:func:`~torchstore.samplers.philox.randint_below` of ``[k, >= 2]`` words, one bound."""
    out = np.empty(words.shape[0], dtype=np.int64)
    _randint(words.numpy(), n, out, 0)
    return torch.from_numpy(out)


@cached_njit(nogil=True)
def _draw_gather(words, first, n, offset, src, index, out):  # pragma: no cover - compiled
    # gather_rows is compiled into this function, and numba's on-disk cache is keyed on
    # this file alone: a change to rowgather.gather_rows must come with an edit here
    _randint(words[first : first + index.shape[0]], n, index, offset)
    return gather_rows(src, index, out)


def draw_gather(
    words: np.ndarray, first: int, n: int, offset: int, src: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uniform rows of ``src`` in one call: ``index = offset +
    randint_below(words[first : first + count], n)`` and ``src[index]`` (see
    :func:`torchstore.data.rows.rowgather.gather_rows`), as new arrays.

    Raises:
        IndexError: if a drawn row lies outside ``src`` (``offset + n > len(src)``).
    """
    index = np.empty(count, dtype=np.int64)
    out = np.empty((count, src.shape[1]), dtype=src.dtype)
    bad = _draw_gather(words, first, n, offset, src, index, out)
    if bad >= 0:
        raise IndexError(f"row {int(index[bad])} is outside the {src.shape[0]} rows gathered from")
    return index, out


@cached_njit(nogil=True)
def _draw_runs_gather(
    words, first, n, run_end, packed_off, store_off, src, at, index, out
):  # pragma: no cover - compiled
    # gather_rows is compiled in here too: see _draw_gather
    _randint(words[first : first + at.shape[0]], n, at, 0)
    runs = run_end.shape[0]
    for i in range(at.shape[0]):
        x = at[i]
        lo, hi = 0, runs  # the first run ending past x (numpy's searchsorted, side="right")
        while lo < hi:
            mid = (lo + hi) >> 1
            if run_end[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        q = min(lo, runs - 1)
        at[i] = x + packed_off[q]
        index[i] = x + store_off[q]
    return gather_rows(src, at, out)


def draw_runs_gather(
    words: np.ndarray,
    first: int,
    n: int,
    runs: tuple[np.ndarray, np.ndarray, np.ndarray],
    src: np.ndarray,
    out: np.ndarray,
) -> np.ndarray:
    """``len(out)`` uniform draws over ``n`` units laid out in runs, mapped and gathered in
    one call: draw ``x = randint_below(words[first : ...], n)`` lies in run ``q`` (the first
    whose ``run_end`` exceeds ``x``), at row ``x + packed_off[q]`` of ``src`` and store row
    ``x + store_off[q]``; ``runs`` is ``(run_end, packed_off, store_off)``, int64. Writes the
    rows into ``out`` and returns the store rows, a new array.

    Raises:
        IndexError: if a mapped row lies outside ``src``.
    """
    count = out.shape[0]
    at = np.empty(count, dtype=np.int64)
    index = np.empty(count, dtype=np.int64)
    run_end, packed_off, store_off = runs
    bad = _draw_runs_gather(words, first, n, run_end, packed_off, store_off, src, at, index, out)
    if bad >= 0:
        raise IndexError(f"row {int(at[bad])} is outside the {src.shape[0]} rows gathered from")
    return index


def randint_rows(words: np.ndarray, first: int, count: int, n: int, offset: int) -> Tensor:
    """``offset + randint_below(words[first : first + count], n)`` as a new tensor."""
    out = np.empty(count, dtype=np.int64)
    _randint(words[first : first + count], n, out, offset)
    return torch.from_numpy(out)


@cached_njit(nogil=True)
def _uniform64(words, out):  # pragma: no cover - compiled
    # uniform_from_words, float64: a 53-bit integer (exact in a double) times 2**-53
    for i in range(out.shape[0]):
        hi = (np.uint64(words[i, 0]) & _MASK32) >> np.uint64(6)
        lo = (np.uint64(words[i, 1]) & _MASK32) >> np.uint64(5)
        out[i] = np.float64((hi << np.uint64(27)) + lo) * 1.1102230246251565e-16


@cached_njit(nogil=True)
def _uniform32(words, out):  # pragma: no cover - compiled
    # uniform_from_words, float32: a 24-bit integer (exact in a float) times 2**-24
    for i in range(out.shape[0]):
        top = (np.uint64(words[i, 0]) & _MASK32) >> np.uint64(8)
        out[i] = np.float32(top) * np.float32(5.960464477539063e-08)


def uniform_words(words: Tensor, dtype: torch.dtype) -> Tensor:
    """:func:`~torchstore.samplers.philox.uniform_from_words` of ``[k, >= 2]`` words."""
    if dtype == torch.float64:
        out = np.empty(words.shape[0], dtype=np.float64)
        _uniform64(words.numpy(), out)
    else:
        out = np.empty(words.shape[0], dtype=np.float32)
        _uniform32(words.numpy(), out)
    return torch.from_numpy(out)


@cached_njit(nogil=True)
def _bucket_order(key, buckets):  # pragma: no cover - compiled
    # A counting sort of keys in [0, buckets): a permutation that visits the keys in
    # non-decreasing order, in O(n + buckets) (an argsort costs several times more).
    n = key.shape[0]
    start = np.zeros(buckets + 1, dtype=np.int64)
    for i in range(n):
        start[key[i] + 1] += 1
    for b in range(buckets):
        start[b + 1] += start[b]
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        k = key[i]
        order[start[k]] = i
        start[k] += 1
    return order


def bucket_sorted(index: Tensor, capacity: int) -> Tensor:
    """``index`` (int64 in ``[0, capacity)``) in non-decreasing order up to buckets of about
    ``capacity / len(index)`` rows: a counting sort, O(n), for address-ordered gathers."""
    idx = index.contiguous().numpy()
    n = idx.shape[0]
    shift = 0
    while (capacity >> shift) > 2 * max(n, 1):
        shift += 1
    order = _bucket_order(idx >> shift, (capacity >> shift) + 1)
    return torch.from_numpy(idx[order])


@cached_njit(nogil=True)
def _descend(nodes, depth, u, out_index, out_value, capacity, ratio):  # pragma: no cover
    # ``nodes`` is the tree's ``[2L, 2]`` buffer, flat: node k's sum at 2k, its min at
    # 2k + 1, every other level stored (see sumtree's module doc). A double step from a
    # stored node k reads its four grandchildren (sums at 8k, 8k + 2, 8k + 4, 8k + 6: one
    # cache line), adds them two by two into the children's sums exactly as the tree
    # would have stored them, and makes the two binary decisions.
    # Draws are independent, so the order they are walked in is free: walking them in
    # (bucketed) order of mass makes neighbouring draws share their upper path and touch
    # leaves in increasing address order (cache and prefetcher friendly), and walking all
    # draws one level at a time keeps many cache misses in flight. The step is branch-free
    # (a mispredicted branch would squash the loads in flight). Each draw still meets the
    # same comparisons and subtractions as in the tensor code (``m - r_left * go`` there
    # too), so the answers are the same bits. The masses ``u * total`` and, with ``ratio``,
    # ``out_value = leaf / p_min`` (the importance weight's ratio, ``p_min`` the min-tree's
    # root) are the tensor code's products and quotients in the tree's dtype: the same bits
    # again.
    num_leaves = 1 << depth
    n = u.shape[0]
    odd = depth % 2 == 1  # the root's level is not stored: nodes 2 and 3 make it
    if odd:
        total = nodes[4] + nodes[6]
        p_min = min(nodes[5], nodes[7]) if ratio else total
    else:
        total = nodes[2]
        p_min = nodes[3] if ratio else total
    mass = u * total
    buckets = max(n, 1)
    scale = buckets / total if total > 0 else 0.0
    key = np.empty(n, dtype=np.int64)
    for i in range(n):
        b = int(mass[i] * scale)
        key[i] = min(max(b, 0), buckets - 1)
    order = _bucket_order(key, buckets)
    node = np.ones(n, dtype=np.int64)
    m = mass[order]
    if odd:  # one single step from the root onto stored level 1
        r_left = nodes[4]
        r_right = nodes[6]
        for j in range(n):
            go = (r_left <= 0) | ((m[j] >= r_left) & (r_right > 0))
            m[j] = m[j] - r_left * go
            node[j] = 2 + go
    for _ in range(depth // 2):
        for j in range(n):
            # latency bound: a line asked for _AHEAD draws early arrives while the draws
            # in between are walked (the descent 1.4-1.6x at 1 M leaves; the update's
            # writes gained nothing from it, so it has none)
            if j + _AHEAD < n:
                prefetch(nodes, 8 * node[j + _AHEAD])
            g = 8 * node[j]
            s0 = nodes[g]
            s1 = nodes[g + 2]
            s2 = nodes[g + 4]
            s3 = nodes[g + 6]
            r_left = s0 + s1
            r_right = s2 + s3
            mj = m[j]
            go = (r_left <= 0) | ((mj >= r_left) & (r_right > 0))
            mj = mj - r_left * go
            # the chosen child's two children loaded by address (the line is in L1
            # already) rather than picked from the four sums by value: the same values,
            # and the descent 12-19 % faster here at 1 M leaves
            h = g + 4 * go
            r_left = nodes[h]
            r_right = nodes[h + 2]
            go2 = (r_left <= 0) | ((mj >= r_left) & (r_right > 0))
            m[j] = mj - r_left * go2
            node[j] = 4 * node[j] + 2 * go + go2
    for j in range(n):
        leaf = min(max(node[j] - num_leaves, 0), capacity - 1)
        i = order[j]
        out_index[i] = leaf
        if ratio:
            out_value[i] = nodes[2 * (leaf + num_leaves)] / p_min
        else:
            out_value[i] = nodes[2 * (leaf + num_leaves)]


def _flat(nodes: Tensor) -> np.ndarray:
    """The tree's ``[2L, 2]`` node buffer as a flat numpy view (sum of node k at 2k, min at
    2k + 1)."""
    return nodes.numpy().reshape(-1)


def descend_whole(
    nodes: Tensor, depth: int, capacity: int, u: Tensor, *, ratio: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """The whole-tree descent of :meth:`SumTree.sample_whole` over the tree's ``[2L, 2]``
    node buffer: ``(index, value, total)``.

    With ``ratio``, ``value`` is the drawn leaf divided by the smallest positive leaf (the
    min-tree's root): :func:`~torchstore.samplers.draws.importance_weight`'s ratio.
    """
    total = nodes[1, 0] if depth % 2 == 0 else nodes[2, 0] + nodes[3, 0]
    un = u.to(nodes.dtype).reshape(-1).contiguous().numpy()
    index = np.empty(un.shape[0], dtype=np.int64)
    value = np.empty(un.shape[0], dtype=un.dtype)
    _descend(_flat(nodes), depth, un, index, value, capacity, ratio)
    return (
        torch.from_numpy(index).reshape(u.shape),
        torch.from_numpy(value).reshape(u.shape),
        total,
    )


@cached_njit(nogil=True)
def _update(nodes, depth, index, value, raw, raw_value):  # pragma: no cover
    # ``nodes`` flat as in ``_descend``: a stored node's sum and min and its four
    # grandchildren's share a line, so each step of a (stored) level pass touches one line.
    # The leaves (and the raw priorities when ``raw`` is not empty) are written in bucketed
    # address order (cache and prefetcher friendly). The counting sort is stable, so the
    # duplicates of a leaf, which share a bucket, keep the caller's order: the last write
    # wins. Then, level by level as the tensor code does, every touched parent is
    # recomputed from its final children, in the same order; at every level above the
    # bucket width that order is sorted, so a shared ancestor is recomputed once a level.
    # Below it a parent may be recomputed twice: from the same final children, to the same
    # value.
    num_leaves = 1 << depth
    n = index.shape[0]
    inf = np.inf
    with_raw = raw.shape[0] > 0
    high = -np.inf  # the largest raw value written (the caller's running maximum)
    shift = 0
    while (num_leaves >> shift) > 2 * n:
        shift += 1
    buckets = num_leaves >> shift
    key = np.empty(n, dtype=np.int64)
    for i in range(n):
        key[i] = index[i] >> shift
    order = _bucket_order(key, buckets)
    leaves = np.empty(n, dtype=np.int64)
    for j in range(n):
        i = order[j]
        k = index[i]
        v = value[i]
        at = 2 * (k + num_leaves)
        nodes[at] = v
        nodes[at + 1] = v if v > 0 else inf
        if with_raw:
            raw[k] = raw_value[i]
            if raw_value[i] > high:
                high = raw_value[i]
        leaves[j] = k + num_leaves
    for level in range(2, depth + 1, 2):  # the stored levels
        prev = -1
        for j in range(n):
            node = leaves[j] >> level
            if node == prev:
                continue
            prev = node
            g = 8 * node  # the four grandchildren: one cache line
            at = 2 * node
            nodes[at] = (nodes[g] + nodes[g + 2]) + (nodes[g + 4] + nodes[g + 6])
            nodes[at + 1] = min(min(nodes[g + 1], nodes[g + 3]), min(nodes[g + 5], nodes[g + 7]))
    return high


def update_tree(
    nodes: Tensor,
    depth: int,
    index: Tensor,
    value: Tensor,
    *,
    raw: Tensor | None = None,
    raw_value: Tensor | None = None,
) -> float:
    """:meth:`SumTree.update` in place on the tree's ``[2L, 2]`` node buffer: leaves
    ``index`` get ``value`` (last write wins).

    With ``raw``, also ``raw[index] = raw_value`` (last write wins): a prioritized
    sampler's raw priorities, written in the same call. One compiled call in all.

    Returns:
        the largest of ``raw_value`` (``-inf`` without ``raw``).
    """
    idx = index.to(torch.int64).contiguous().numpy()
    val = value.to(nodes.dtype).contiguous().numpy()
    if raw is None:
        raw_np = raw_val = _NO_RAW.astype(val.dtype)
    else:
        raw_np = raw.numpy()
        raw_val = raw_value.to(raw.dtype).contiguous().numpy()
    return _update(_flat(nodes), depth, idx, val, raw_np, raw_val)


@cached_njit(nogil=True)
def _scan(index, priority, capacity):  # pragma: no cover - compiled
    negative = 0
    bad = -1
    over = -1
    top = -1
    high = -np.inf
    for i in range(index.shape[0]):
        k = index[i]
        if k < 0:
            negative += 1
            continue
        p = priority[i]
        if bad < 0 and not (p >= 0 and p < np.inf):  # NaN fails both comparisons
            bad = i
        if over < 0 and k >= capacity:
            over = i
        if k > top:
            top = k
        if p > high:
            high = p
    return negative, bad, over, top, high


def scan_priorities(index: Tensor, priority: Tensor, capacity: int) -> tuple[int, int, int, int]:
    """One pass over a priority update: ``(negatives, first bad priority, first index >=
    capacity, largest index)``; positions are -1 when there is none (negatives skipped)."""
    return _scan(index.contiguous().numpy(), priority.contiguous().numpy(), capacity)[:4]


@cached_njit(nogil=True)
def _checked_update(nodes, depth, index, value, raw, raw_value, capacity):  # pragma: no cover
    negative, bad, over, top, high = _scan(index, raw_value, capacity)
    if negative == 0 and bad < 0 and over < 0:
        _update(nodes, depth, index, value, raw, raw_value)
    return negative, bad, over, top, high


def checked_update(
    nodes: Tensor,
    depth: int,
    index: Tensor,
    value: Tensor,
    raw: Tensor,
    raw_value: Tensor,
    capacity: int,
) -> tuple[bool, int, float]:
    """:func:`scan_priorities` of ``(index, raw_value)`` and, when the batch is clean (no
    negative index, every priority finite and ``>= 0``, every index below ``capacity``),
    :func:`update_tree` with ``raw``, in one compiled call.

    Returns:
        ``(written, largest index, largest priority)``; nothing is written when
        ``written`` is false (the caller then filters and validates).
    """
    idx = index.to(torch.int64).contiguous().numpy()
    val = value.to(nodes.dtype).contiguous().numpy()
    raw_val = raw_value.to(raw.dtype).contiguous().numpy()
    negative, bad, over, top, high = _checked_update(
        _flat(nodes), depth, idx, val, raw.numpy(), raw_val, capacity
    )
    return negative == 0 and bad < 0 and over < 0, top, high
