"""Per-episode and dataset-level feature statistics in LeRobot v3.0's shapes.

LeRobot stores ``min, max, mean, std, count, q01, q10, q50, q90, q99`` for every non-string
feature: per episode as ``stats/<feature>/<stat>`` columns of the episodes table, and
aggregated over the dataset in ``meta/stats.json`` (shared/specs/lerobot-v3.md sections 5
and 7). This module computes both, and converts them to and from JSON.

Shapes follow the spec: a feature of shape ``[K]`` (or ``[A, B]``) gets stats of that shape,
a scalar gets shape ``(1,)``, a camera gets ``(C, 1, 1)`` per channel in ``[0, 1]``, and
``count`` is ``[n]`` int64. Everything else is float64.

Unlike lerobot, per-episode stats here are exact: numeric quantiles come from all frames
and camera statistics from a full 256-bin histogram of every pixel, not a frame sample.
Dataset-level quantiles follow lerobot 0.4-0.6.1 (count-weighted mean of the episodes'
quantiles), so they are approximations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchstore.errors import LeRobotFormatError

__all__ = [
    "STAT_NAMES",
    "QUANTILES",
    "numeric_stats",
    "ImageStatsAccumulator",
    "aggregate_stats",
    "aggregate_features",
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


def _quantile_points(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted-order neighbours and weights of each quantile among ``n`` values.

    Mirrors np.quantile(method="linear"): virtual index ``(n - 1) * q``, floor and floor + 1
    as neighbours, the fraction as weight; an index at the end takes the last value.
    """
    virtual = (n - 1) * _Q
    lo = np.floor(virtual)
    gamma = virtual - lo
    lo = lo.astype(np.intp)
    hi = lo + 1
    at_end = virtual >= n - 1
    lo[at_end] = n - 1
    hi[at_end] = n - 1
    gamma[at_end] = 0.0
    return lo, hi, gamma


def _lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """np.quantile's interpolation, bit for bit: from ``a`` below 0.5, from ``b`` above."""
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def numeric_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of one episode's values ``[n, *shape]`` over the frame axis, exactly.

    Any numeric or bool dtype (bool counts as 0/1); torch tensors are accepted too.
    Quantiles match ``np.quantile(..., method="linear")``; std is the population std
    (ddof=0), as in lerobot. A ``[n]`` input gives stats of shape ``(1,)``. Returns float64
    arrays of ``shape`` and ``count`` as int64 ``[n]``. Raises ValueError for no frames or a
    non-numeric dtype.
    """
    arr = _to_numpy(values)
    if arr.ndim == 0:
        raise ValueError("numeric_stats needs values of shape [n, *shape], got a 0-d array")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"numeric_stats needs a numeric or bool dtype, got {arr.dtype}")
    n = arr.shape[0]
    if n == 0:
        raise ValueError("numeric_stats needs at least one frame, got 0")
    x = arr.astype(np.float64).reshape(n, -1) if arr.ndim == 1 else arr.astype(np.float64)
    # One sort gives every quantile (cheaper than np.quantile's partition bookkeeping).
    ordered = np.sort(x, axis=0)
    lo, hi, gamma = _quantile_points(n)
    gamma = gamma.reshape((-1,) + (1,) * (x.ndim - 1))
    quantiles = _lerp(ordered[lo], ordered[hi], gamma)
    has_nan = np.isnan(ordered[-1])  # NaN sorts last; np.quantile gives NaN for such slices
    if has_nan.any():
        quantiles[:, has_nan] = np.nan
    stats = {
        "min": x.min(axis=0),
        "max": x.max(axis=0),
        "mean": x.mean(axis=0),
        "std": x.std(axis=0),
        "count": np.array([n], dtype=np.int64),
    }
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
        if not isinstance(channels, int | np.integer) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        self._channels = int(channels)
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
        lo, hi, gamma = _quantile_points(n)
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
            cumulative = np.cumsum(hist)
            a = np.searchsorted(cumulative, lo, side="right") / 255.0
            b = np.searchsorted(cumulative, hi, side="right") / 255.0
            quantiles = _lerp(a, b, gamma)
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
    """Nested lists for meta/stats.json: floats as Python floats, count as ints.

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
            else:
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
    if arr.dtype.kind not in "iuf" or arr.size == 0:
        raise LeRobotFormatError(f"{where}: expected a non-empty list of numbers, got {value!r}")
    return arr


def stats_from_json(data: Mapping) -> dict[str, dict[str, np.ndarray]]:
    """Inverse of :func:`stats_to_json`: count as int64, every other stat float64.

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
