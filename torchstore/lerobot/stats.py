"""Per-episode and dataset-level feature statistics, as lerobot 0.6 writes them.

LeRobot stores ``min, max, mean, std, count, q01, q10, q50, q90, q99`` for every non-string
feature: per episode as ``stats/<feature>/<stat>`` columns of the episodes table, and
aggregated over the dataset in ``meta/stats.json``. This module computes both, and converts
them to and from JSON.

What matches lerobot 0.6 (``lerobot/datasets/compute_stats.py``), so a dataset extended by
either library aggregates the same:

* shapes: a numeric feature is reduced over every axis but the last (``[K]`` and
  ``[A, K]`` give ``(K,)``, a scalar ``(1,)``); a camera gives ``(C, 1, 1)`` per channel in
  ``[0, 1]``; ``count`` is ``[frames]`` int64;
* quantiles: a 5000-bin histogram per column between ``min - 1e-10`` and ``max + 1e-10``,
  the quantile interpolated inside the bin where the cumulative count reaches
  ``q * count`` (an episode of one frame gets quantiles equal to its mean);
* types: lerobot 0.6 promotes a feature to ``np.result_type(dtype, float32)`` before any
  stat (bool, int8/16, uint8/16 and float16 to float32, wider ints to float64), so every
  stat is a float (a bool feature's ``min``/``max`` are 0.0/1.0, not booleans) and the
  quantiles' histogram edges are computed in that type; here every stat but ``count`` is
  float64 holding those values. Stats written as booleans (lerobot 0.4, older torchstore)
  are read as 0.0/1.0 and aggregate to the same numbers;
* the dataset level: min of mins, max of maxes, count-weighted mean, the parallel variance
  formula for std, and the count-weighted mean of the episodes' quantiles (lerobot
  0.4-0.6.1).

Where it differs, on purpose: camera stats use every pixel of every frame (lerobot samples
about ``n**0.75`` frames and down-samples large ones), std is the exact population std
(lerobot's ``sqrt(E[x^2] - E[x]^2)`` overflows on uint8 pixels), and a one-frame episode of a
2-D feature is reduced to ``(K,)`` like every other (lerobot keeps ``(A, K)`` there, which
its own aggregation then refuses) and gets float stats like every other (lerobot keeps the
raw dtype there: booleans or integers). A column holding NaN or inf gets NaN quantiles, which
``stats_to_json`` refuses. :class:`RunningStats` aggregates episode by episode in constant
time per episode, for recorders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchstore.errors import LeRobotFormatError
from torchstore.validation import positive_int

__all__ = [
    "STAT_NAMES",
    "QUANTILES",
    "numeric_stats",
    "ImageStatsAccumulator",
    "aggregate_stats",
    "aggregate_features",
    "RunningStats",
    "stats_to_json",
    "stats_from_json",
]

STAT_NAMES: tuple[str, ...] = (
    "min",
    "max",
    "mean",
    "std",
    "count",
    "q01",
    "q10",
    "q50",
    "q90",
    "q99",
)
QUANTILES: dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.5, "q90": 0.9, "q99": 0.99}

_Q = np.array(list(QUANTILES.values()), dtype=np.float64)
_REQUIRED = ("min", "max", "mean", "std", "count")


def _to_numpy(x: Any) -> np.ndarray:
    """A numpy view of ``x``; torch tensors are detached and moved to the CPU first."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


_BINS = 5000  # lerobot 0.6's histogram resolution for quantiles
_PAD = 1e-10  # and the padding of its histogram range


def histogram_quantiles(hist: np.ndarray, edges: np.ndarray, count: int) -> np.ndarray:
    """The five quantiles from a histogram, the way lerobot 0.6 reads them off.

    The quantile lies in the first bin where the cumulative count reaches ``q * count``,
    linearly interpolated inside it; before the first bin it is the lowest edge, past the
    last the highest.
    """
    cumulative = np.cumsum(hist)
    target = _Q * count
    idx = np.searchsorted(cumulative, target)
    out = np.empty(len(_Q), dtype=np.float64)
    for i, (k, t) in enumerate(zip(idx.tolist(), target.tolist(), strict=True)):
        if k == 0:
            out[i] = edges[0]
        elif k >= len(cumulative):
            out[i] = edges[-1]
        else:
            before = cumulative[k - 1]
            inside = cumulative[k] - before
            if inside == 0:
                out[i] = edges[k]
            else:
                out[i] = edges[k] + (t - before) / inside * (edges[k + 1] - edges[k])
    return out


def _column_quantiles(
    column: np.ndarray,
    lo: float,
    hi: float,
    *,
    weights: np.ndarray | None = None,
    count: int | None = None,
) -> np.ndarray:
    """Quantiles of one column of values (or of ``column`` levels with ``weights`` counts)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return np.full(len(_Q), np.nan)
    edges = np.linspace(lo - _PAD, hi + _PAD, _BINS + 1)
    if not (np.diff(edges) > 0).all():  # a range too narrow for float64 at this magnitude
        if lo == hi:
            return np.full(len(_Q), float(lo))
        values = column if weights is None else np.repeat(column, weights)
        return np.quantile(values, _Q)
    hist, _ = np.histogram(column, bins=edges, weights=weights)
    return histogram_quantiles(hist, edges, len(column) if count is None else count)


def _columns_quantiles(x: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """:func:`_column_quantiles` of every column of ``x`` ``[rows, K]`` at once: ``[5, K]``.

    The same numbers as reading lerobot's histogram, without building it: the cumulative
    count first reaches ``t = q * rows`` in the bin of the ``ceil(t)``-th smallest value,
    and the counts before and inside that bin are positions in the sorted column. (Bins as
    ``np.histogram`` with explicit edges: left-closed, the last one closed on both sides.)
    Edge ``j`` is ``j * step + start`` as ``np.linspace`` computes it (the last one is
    ``stop``), so only the edges needed are computed.
    """
    rows, k = x.shape
    out = np.full((len(_Q), k), np.nan)
    work = _working_dtype(lows.dtype)
    lows, highs = lows.astype(work, copy=False), highs.astype(work, copy=False)
    # as lerobot computes them: in the working dtype (float32 edges for float32 or bool)
    start, stop = lows - _PAD, highs + _PAD
    step = (stop - start) / start.dtype.type(_BINS)
    finite = np.isfinite(lows) & np.isfinite(highs)
    with np.errstate(invalid="ignore", over="ignore"):
        # steps this far above rounding make the edges strictly increasing
        regular = finite & (
            step > 8 * np.finfo(start.dtype).eps * np.maximum(np.abs(start), np.abs(stop))
        )
    for c in np.flatnonzero(finite & ~regular):  # too narrow a range for this magnitude
        out[:, c] = _column_quantiles(x[:, c], lows[c], highs[c])
    cols = np.flatnonzero(regular)
    if not len(cols):
        return out
    ordered = np.sort(x[:, cols], axis=0)
    start, stop, step = start[cols], stop[cols], step[cols]

    def edge(j: np.ndarray) -> np.ndarray:  # np.linspace's arithmetic, in the edges' dtype
        return np.where(j >= _BINS, stop, j.astype(start.dtype) * step + start)

    target = _Q * rows
    rank = np.ceil(target).astype(np.intp)  # the cumulative count is an integer
    v = ordered[rank - 1]  # [5, K]: the value whose bin the quantile is in
    j = np.clip(np.floor((v - start) / step), 0, _BINS - 1).astype(np.intp)
    for _ in range(2):  # the estimate is off by at most one bin: settle on e[j] <= v < e[j + 1]
        j = np.where(edge(j) > v, j - 1, j)
        j = np.where((j < _BINS - 1) & (edge(j + 1) <= v), j + 1, j)
    j = np.clip(j, 0, _BINS - 1)
    low, high = edge(j), edge(j + 1)
    if rows * len(cols) * len(_Q) <= 4_000_000:
        before = (ordered[:, None, :] < low[None]).sum(axis=0)
        through = (ordered[:, None, :] < high[None]).sum(axis=0)
    else:
        before = np.stack(
            [np.searchsorted(ordered[:, i], low[:, i]) for i in range(len(cols))], axis=1
        )
        through = np.stack(
            [np.searchsorted(ordered[:, i], high[:, i]) for i in range(len(cols))], axis=1
        )
    through = np.where(j == _BINS - 1, rows, through)
    inside = np.maximum(through - before, 1)
    value = low + (target[:, None] - before) / inside * (high - low)  # float64, as lerobot's
    out[:, cols] = np.where(j == 0, start, value)
    return out


def _working_dtype(dtype: np.dtype) -> np.dtype:
    """The float type lerobot 0.6 computes a feature's stats in (``RunningQuantileStats``)."""
    return np.result_type(dtype, np.float32)


def numeric_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of one episode's values ``[n, *shape]``, as lerobot 0.6 computes them.

    Reduces over every axis but the last: ``[n]`` and ``[n, 1]`` give ``(1,)``, ``[n, K]`` and
    ``[n, A, K]`` give ``(K,)``. Any numeric or bool dtype; torch tensors are accepted too.
    Quantiles come from lerobot's 5000-bin histogram (see the module docstring); std is the
    population std (ddof=0). Returns float64 arrays (a bool input's ``min``/``max`` are
    0.0/1.0, as lerobot 0.6 writes them), ``count`` int64 ``[n]``. Raises ValueError for no
    frames or a non-numeric dtype.
    """
    arr = _to_numpy(values)
    if arr.ndim == 0:
        raise ValueError("numeric_stats needs values of shape [n, *shape], got a 0-d array")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"numeric_stats needs a numeric or bool dtype, got {arr.dtype}")
    if arr.nbytes <= _MEMO_BYTES:
        # episodes of one length repeat their frame_index and timestamp columns, and a
        # task_index is often one value: such columns are computed once
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        hit = _MEMO.get(key)
        if hit is None:
            hit = _MEMO[key] = _numeric_stats(arr)
            if len(_MEMO) > _MEMO_SIZE:
                _MEMO.pop(next(iter(_MEMO)))
        return {k: v.copy() for k, v in hit.items()}
    return _numeric_stats(arr)


_MEMO: dict[tuple, dict[str, np.ndarray]] = {}
_MEMO_SIZE = 256
_MEMO_BYTES = 1 << 16


def _numeric_stats(arr: np.ndarray) -> dict[str, np.ndarray]:
    n = arr.shape[0]
    if n == 0:
        raise ValueError("numeric_stats needs at least one frame, got 0")
    x = arr.reshape(-1, 1) if arr.ndim == 1 else arr.reshape(-1, arr.shape[-1])
    xf = x.astype(np.float64)
    work = x.astype(_working_dtype(x.dtype), copy=False)  # lerobot 0.6's type for min/max
    mins, maxes = work.min(axis=0), work.max(axis=0)
    mean = xf.mean(axis=0)
    stats = {
        "min": mins.astype(np.float64),
        "max": maxes.astype(np.float64),
        "mean": mean,
        "std": xf.std(axis=0),
        "count": np.array([n], dtype=np.int64),
    }
    if n < 2:
        quantiles = np.repeat(mean[None], len(_Q), axis=0)
    else:
        quantiles = _columns_quantiles(xf, mins, maxes)
    for i, name in enumerate(QUANTILES):
        stats[name] = quantiles[i]
    return stats


class ImageStatsAccumulator:
    """Streams frames of one camera for one episode into exact per-channel stats.

    Keeps a 256-bin histogram per channel of uint8 pixels, so memory stays bounded however
    many frames arrive, and min, max, mean, std and the quantiles all come out of the
    histograms exactly (quantiles as ``np.quantile`` of every pixel / 255). Values are scaled
    to ``[0, 1]`` and shaped ``(C, 1, 1)``, as in LeRobot; ``count`` is the number of frames.
    """

    def __init__(self, channels: int = 3):
        self._channels = positive_int("channels", channels)
        self._hist = np.zeros((self._channels, 256), dtype=np.int64)
        self._frames = 0

    def update(self, frames: Any) -> None:
        """Adds uint8 frames ``[H, W, C]`` or ``[N, H, W, C]`` (numpy or torch)."""
        arr = _to_numpy(frames)
        if arr.dtype != np.uint8:
            if arr.dtype.kind == "f":
                raise ValueError(
                    f"ImageStatsAccumulator needs uint8 pixels 0..255, got {arr.dtype}; pass "
                    "uint8 frames (e.g. (frames * 255).round().astype(np.uint8)), "
                    "not floats in [0, 1]"
                )
            raise ValueError(f"ImageStatsAccumulator needs uint8 pixels, got {arr.dtype}")
        if arr.ndim not in (3, 4) or arr.shape[-1] != self._channels:
            raise ValueError(
                f"frames must be [H, W, {self._channels}] or [N, H, W, {self._channels}], "
                f"got shape {tuple(arr.shape)}"
            )
        if arr.shape[-3] == 0 or arr.shape[-2] == 0:
            raise ValueError(f"frames have no pixels: shape {tuple(arr.shape)}")
        n = 1 if arr.ndim == 3 else arr.shape[0]
        if n == 0:
            return
        flat = arr.reshape(-1, self._channels)
        for c in range(self._channels):
            self._hist[c] += np.bincount(flat[:, c], minlength=256)
        self._frames += n

    @property
    def count(self) -> int:
        """Frames seen so far."""
        return self._frames

    def result(self) -> dict[str, np.ndarray]:
        """The stats, each ``(C, 1, 1)`` float64 in ``[0, 1]``; ``count`` int64 ``(1,)``."""
        if self._frames == 0:
            raise ValueError("ImageStatsAccumulator.result() needs at least one frame")
        levels = np.arange(256)
        n = int(self._hist[0].sum())
        out = {k: np.empty((self._channels, 1, 1), dtype=np.float64) for k in STAT_NAMES}
        for c in range(self._channels):
            hist = self._hist[c]
            nonzero = np.flatnonzero(hist)
            # Exact integer moments, then one correctly rounded division each.
            s1 = int(hist @ levels)
            s2 = int(hist @ (levels * levels))
            out["min"][c] = nonzero[0] / 255.0
            out["max"][c] = nonzero[-1] / 255.0
            out["mean"][c] = s1 / (n * 255)
            out["std"][c] = math.sqrt((n * s2 - s1 * s1) / (n * n * 65025))
            # lerobot's histogram over the pixel values, built from the exact level counts
            quantiles = (
                _column_quantiles(
                    levels.astype(np.float64),
                    float(nonzero[0]),
                    float(nonzero[-1]),
                    weights=hist,
                    count=n,
                )
                / 255.0
            )
            for i, name in enumerate(QUANTILES):
                out[name][c] = quantiles[i]
        out["count"] = np.array([self._frames], dtype=np.int64)
        return out


def _episode_array(stats: Mapping[str, Any], index: int, name: str) -> np.ndarray:
    """One stat of one episode as float64, or a format error naming both."""
    if name not in stats:
        raise LeRobotFormatError(f"stats of episode {index} lack {name!r}")
    try:
        return np.asarray(stats[name], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise LeRobotFormatError(f"stats of episode {index}: {name!r} is not numeric: {e}") from e


class RunningStats:
    """Dataset-level stats of one dataset, updated one episode at a time in O(features).

    Gives what :func:`aggregate_features` gives over all episodes added (min/max exactly,
    mean and std by Chan's parallel update instead of one pass, so equal to rounding), so a
    recorder need not re-aggregate every episode at every save. :meth:`plus` returns a new
    object and leaves this one unchanged, so stats can be computed before a commit and
    kept only if it succeeds.
    """

    def __init__(self) -> None:
        self._features: dict[str, dict[str, Any]] = {}

    def plus(self, episode: Mapping[str, Mapping[str, np.ndarray]]) -> RunningStats:
        """A copy with one episode's ``{feature: stats}`` added."""
        out = RunningStats()
        out._features = dict(self._features)
        for feature, stats in episode.items():
            try:
                out._features[feature] = _merge(self._features.get(feature), stats)
            except LeRobotFormatError as e:
                raise LeRobotFormatError(f"feature {feature!r}: {e}") from e
        return out

    def result(self) -> dict[str, dict[str, np.ndarray]]:
        """``{feature: stats}`` over every episode added, in first-seen order."""
        out = {}
        for feature, acc in self._features.items():
            n = acc["count"]
            stats = {
                "min": acc["min"],
                "max": acc["max"],
                "mean": acc["mean"],
                "std": np.sqrt(np.maximum(acc["m2"] / n, 0.0)),
                "count": np.array([n], dtype=np.int64),
            }
            for name, total in acc["q"].items():
                stats[name] = total / n
            out[feature] = stats
        return out


def _merge(acc: dict[str, Any] | None, stats: Mapping[str, Any]) -> dict[str, Any]:
    count = _episode_array(stats, 0, "count").reshape(-1)
    if count.size != 1 or not 0 < count[0] < np.inf or count[0] != np.floor(count[0]):
        raise LeRobotFormatError(f"'count' must be one positive integer, got {count}")
    c = int(count[0])
    mins, maxes = _episode_array(stats, 0, "min"), _episode_array(stats, 0, "max")
    mean = _episode_array(stats, 0, "mean")
    var = _episode_array(stats, 0, "std") ** 2
    quantiles = {q: c * _episode_array(stats, 0, q) for q in QUANTILES if q in stats}
    if acc is None:
        return {"count": c, "min": mins, "max": maxes, "mean": mean, "m2": c * var, "q": quantiles}
    if acc["mean"].shape != mean.shape or acc["min"].shape != mins.shape:
        raise LeRobotFormatError(
            f"episodes disagree on the shape of the stats: {acc['mean'].shape} and {mean.shape}"
        )
    n = acc["count"] + c
    delta = mean - acc["mean"]
    return {
        "count": n,
        "min": np.minimum(acc["min"], mins),
        "max": np.maximum(acc["max"], maxes),
        "mean": acc["mean"] + delta * (c / n),
        "m2": acc["m2"] + c * var + delta**2 * (acc["count"] * c / n),
        # a quantile is kept only while every episode has it (as aggregate_stats does)
        "q": {q: acc["q"][q] + quantiles[q] for q in acc["q"] if q in quantiles},
    }


def aggregate_stats(per_episode: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset-level stats of one feature from its per-episode stats (spec section 7).

    min of mins, max of maxes, count-weighted mean, population std (ddof=0) by the
    parallel-variance formula, so these equal the stats of the concatenated frames;
    count is the sum. Quantiles are the count-weighted mean of the per-episode quantiles, as
    in lerobot 0.4-0.6.1: an approximation, not the true dataset quantiles. A quantile is
    kept only when every episode has it. Raises ValueError for no episodes or no frames and
    LeRobotFormatError for missing or mismatched stats.
    """
    if len(per_episode) == 0:
        raise ValueError("aggregate_stats needs at least one episode's stats")
    counts = np.empty(len(per_episode), dtype=np.int64)
    for i, stats in enumerate(per_episode):
        count = _episode_array(stats, i, "count").reshape(-1)
        if count.size != 1 or not 0 <= count[0] < np.inf or count[0] != np.floor(count[0]):
            raise LeRobotFormatError(
                f"stats of episode {i}: 'count' must be one non-negative integer, got {count}"
            )
        counts[i] = int(count[0])
    total = int(counts.sum())
    if total == 0:
        raise ValueError("aggregate_stats: the episodes hold no frames (all counts are 0)")

    def stacked(name: str) -> np.ndarray:
        arrays = [_episode_array(stats, i, name) for i, stats in enumerate(per_episode)]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise LeRobotFormatError(
                f"episodes disagree on the shape of {name!r}: {sorted(shapes)}"
            )
        return np.stack(arrays)

    mins, maxes, means, stds = (stacked(k) for k in ("min", "max", "mean", "std"))
    shape = means.shape[1:]
    if not mins.shape[1:] == maxes.shape[1:] == stds.shape[1:] == shape:
        raise LeRobotFormatError(
            f"min/max/mean/std shapes differ: {mins.shape[1:]}, {maxes.shape[1:]}, "
            f"{shape}, {stds.shape[1:]}"
        )
    weights = counts.astype(np.float64).reshape((-1,) + (1,) * len(shape))
    mean = (weights * means).sum(axis=0) / total
    variance = (weights * (stds**2 + (means - mean) ** 2)).sum(axis=0) / total
    out = {
        "min": mins.min(axis=0),
        "max": maxes.max(axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([total], dtype=np.int64),
    }
    for name in QUANTILES:
        if all(name in stats for stats in per_episode):
            values = stacked(name)
            if values.shape[1:] != shape:
                raise LeRobotFormatError(f"{name!r} has shape {values.shape[1:]}, mean has {shape}")
            out[name] = (weights * values).sum(axis=0) / total
    return out


def aggregate_features(
    per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]],
) -> dict[str, dict[str, np.ndarray]]:
    """``{feature: stats}`` over the dataset from each episode's ``{feature: stats}``.

    A feature missing from some episodes is aggregated over the episodes that have it;
    features come out in first-seen order. Errors name the feature.
    """
    by_feature: dict[str, list[Mapping[str, np.ndarray]]] = {}
    for episode in per_episode:
        for feature, stats in episode.items():
            by_feature.setdefault(feature, []).append(stats)
    out = {}
    for feature, stats_list in by_feature.items():
        try:
            out[feature] = aggregate_stats(stats_list)
        except LeRobotFormatError as e:
            raise LeRobotFormatError(f"feature {feature!r}: {e}") from e
        except ValueError as e:
            raise ValueError(f"feature {feature!r}: {e}") from e
    return out


def stats_to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Nested lists for meta/stats.json: floats as Python floats, count as ints (lerobot 0.6).

    stats.json must hold finite numbers (a NaN would be written as the non-standard token
    ``NaN``), so NaN or inf raises ValueError naming the feature and stat.
    """
    out: dict[str, dict[str, Any]] = {}
    for feature, feature_stats in stats.items():
        entry: dict[str, Any] = {}
        for name, value in feature_stats.items():
            arr = _to_numpy(value)
            if arr.dtype.kind not in "biuf":
                raise ValueError(f"feature {feature!r}: stat {name!r} is not numeric ({arr.dtype})")
            if not np.isfinite(arr).all():
                raise ValueError(
                    f"feature {feature!r}: stat {name!r} holds NaN or inf, which stats.json "
                    "cannot store (check the feature's values)"
                )
            if name == "count":
                if arr.dtype.kind == "f" and not (arr == np.round(arr)).all():
                    raise ValueError(f"feature {feature!r}: count {arr} is not an integer")
                entry[name] = arr.astype(np.int64).tolist()
            else:  # a bool feature's min/max too: lerobot 0.6 writes them as 0.0/1.0
                entry[name] = arr.astype(np.float64).tolist()
        out[str(feature)] = entry
    return out


def _json_array(value: Any, feature: str, name: str) -> np.ndarray:
    """A stat's nested list as an int/float array, or a format error naming feature and stat."""
    where = f"stats of feature {feature!r}, stat {name!r}"
    if not isinstance(value, list):
        raise LeRobotFormatError(f"{where}: expected a (nested) list, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise LeRobotFormatError(f"{where}: not a rectangular list of numbers ({e})") from e
    if (
        arr.dtype.kind not in "biuf"
        or arr.size == 0
        or (arr.dtype.kind == "b" and name not in ("min", "max"))
    ):
        raise LeRobotFormatError(f"{where}: expected a non-empty list of numbers, got {value!r}")
    return arr


def stats_from_json(data: Mapping) -> dict[str, dict[str, np.ndarray]]:
    """Inverse of :func:`stats_to_json`: count as int64, the rest float64.

    A bool feature's min/max written as booleans (lerobot 0.4, torchstore before it matched
    lerobot 0.6) are read as 0.0/1.0, the numbers lerobot 0.6 writes for them.

    Accepts NaN/inf (lerobot's json.dump may write them). Anything that is not an object of
    objects of non-empty numeric nested lists raises LeRobotFormatError naming the feature
    and stat.
    """
    if not isinstance(data, Mapping):
        raise LeRobotFormatError(
            f"stats.json must be an object of features, got {type(data).__name__}"
        )
    out: dict[str, dict[str, np.ndarray]] = {}
    for feature, feature_stats in data.items():
        if not isinstance(feature_stats, Mapping):
            raise LeRobotFormatError(
                f"stats of feature {feature!r}: expected an object of stats, "
                f"got {type(feature_stats).__name__}"
            )
        entry: dict[str, np.ndarray] = {}
        for name, value in feature_stats.items():
            arr = _json_array(value, feature, name)
            if name == "count":
                if (
                    not np.isfinite(arr).all()
                    or (arr < 0).any()
                    or (arr.dtype.kind == "f" and not (arr == np.round(arr)).all())
                ):
                    raise LeRobotFormatError(
                        f"stats of feature {feature!r}, stat 'count': expected non-negative "
                        f"integers, got {value!r}"
                    )
                entry[name] = arr.astype(np.int64)
            else:
                entry[name] = arr.astype(np.float64)
        out[feature] = entry
    return out
