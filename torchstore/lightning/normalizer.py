"""Per-column normalisation statistics, cached per store, and the :class:`Normalizer`.

Statistics (``mean``, ``std``, ``min``, ``max`` and ``count`` per element of a column) are
computed once over **all committed rows** of the store, from the rows already resident on
the device, in float64 (chunked, merged with Chan's parallel update). They do not depend
on the validation split, the rank or the seed, so every rank and every split of one store
gets the same numbers (as LeRobot's dataset statistics).

Cache. The statistics of a store are kept in a cache folder, never beside the data: a
dataset folder may be read-only, or shared by people and machines that should not write
into it. The file is ``<cache>/<store name>-<hash of the store's resolved path>.json``
(:func:`stats_path`) under :func:`stats_cache_dir` (``$TORCHSTORE_CACHE/stats``, else
``$XDG_CACHE_HOME/torchstore/stats``, else ``~/.cache/torchstore/stats``). It records the
store's content identity (committed rows and episodes, the manifest's creation time, the
file's size and modification time) and, per column, its spec; an entry is used only when
both match, so a rewritten, grown or replaced store is recomputed, never served stale
numbers. It is written atomically (a temporary file, then a rename); when the cache folder
cannot be written the statistics are simply kept in memory, and training goes on.

A ``<store>.stats.json`` beside a store, which earlier versions wrote there, is neither
read nor written: it only ever held numbers computed from the store, so recomputing them
once costs one pass over the rows and nothing else, and reading files from a data folder
that anyone may write would let a stale or foreign file steer training. Delete them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from torchstore.data.columns import name_from_key
from torchstore.data.residency.resident import ResidentStore
from torchstore.data.store.store import TrajectoryStore
from torchstore.errors import ColumnError
from torchstore.io.cache_root import cache_root
from torchstore.lightning.base import choice

__all__ = [
    "ColumnStats",
    "Normalization",
    "Normalizer",
    "column_stats",
    "load_or_compute_stats",
    "stats_cache_dir",
    "stats_path",
]

_FORMAT = "torchstore-stats"
_CHUNK_ROWS = 1 << 20


class Normalization(StrEnum):
    """How a column is normalised.

    ``mean_std``: ``(x - mean) / std`` (ACT-style); ``min_max``: onto ``[-1, 1]`` by
    ``2 (x - min) / (max - min) - 1`` (diffusion-policy style).
    """

    MEAN_STD = "mean_std"
    MIN_MAX = "min_max"


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """Element-wise statistics of one column (float64 CPU tensors of the column's shape)."""

    mean: Tensor
    std: Tensor
    min: Tensor
    max: Tensor
    count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "min": self.min.tolist(),
            "max": self.max.tolist(),
            "count": self.count,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColumnStats:
        def t(v: Any) -> Tensor:
            return torch.tensor(v, dtype=torch.float64)

        return cls(
            t(data["mean"]), t(data["std"]), t(data["min"]), t(data["max"]), int(data["count"])
        )


def stats_cache_dir() -> Path:
    """The folder statistics are cached in: ``$TORCHSTORE_CACHE/stats``, else
    ``$XDG_CACHE_HOME/torchstore/stats``, else ``~/.cache/torchstore/stats`` (the cache root
    that downloaded datasets use)."""
    return cache_root() / "stats"


def stats_path(store_path: str | os.PathLike) -> Path:
    """Where the statistics of the store at ``store_path`` are cached: one file per store,
    named for it and the hash of its resolved path, in :func:`stats_cache_dir`."""
    resolved = os.path.realpath(os.fspath(store_path))
    key = hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return stats_cache_dir() / f"{Path(resolved).name}-{key}.json"


def column_stats(resident: ResidentStore, name: str) -> ColumnStats:
    """Statistics of one resident column over all its rows (dequantised values)."""
    packed = resident.packed
    spec = next(s for s in packed.columns if s.name == name)
    view = packed.view(name)
    device = view.device if view.device.type != "mps" else torch.device("cpu")
    n = 0
    mean = m2 = lo = hi = None
    for start in range(0, resident.num_rows, _CHUNK_ROWS):
        x = view[start : start + _CHUNK_ROWS].to(device)
        if spec.quantize is not None:
            x = spec.quantize.decode(x, spec.dtype)
        x = x.to(torch.float64)
        k = x.shape[0]
        c_mean = x.mean(0)
        c_m2 = ((x - c_mean) ** 2).sum(0)
        c_lo, c_hi = x.amin(0), x.amax(0)
        if mean is None:
            mean, m2, lo, hi = c_mean, c_m2, c_lo, c_hi
        else:
            delta = c_mean - mean
            mean = mean + delta * (k / (n + k))
            m2 = m2 + c_m2 + delta**2 * (n * k / (n + k))
            lo, hi = torch.minimum(lo, c_lo), torch.maximum(hi, c_hi)
        n += k
    std = torch.sqrt(m2 / n)
    return ColumnStats(mean.cpu(), std.cpu(), lo.cpu(), hi.cpu(), n)


def _fingerprint(store: TrajectoryStore) -> dict[str, Any]:
    st = store.path.stat()
    return {
        "rows": store.num_rows,
        "episodes": store.num_episodes,
        "created": store.manifest.created,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def _read_cache(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return {}
    if data.get("fingerprint") != fingerprint or not isinstance(data.get("columns"), dict):
        return {}
    return data["columns"]


def _write_cache(path: Path, fingerprint: dict[str, Any], columns: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(
            json.dumps({"format": _FORMAT, "fingerprint": fingerprint, "columns": columns})
        )
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written: keep the statistics in memory
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def load_or_compute_stats(
    store: TrajectoryStore, resident: ResidentStore, names: Iterable[str], *, cache: bool = True
) -> dict[str, ColumnStats]:
    """Statistics of columns ``names`` (resident in ``resident``), from the cache when valid.

    Args:
        store: the open store the rows came from (for its path and fingerprint).
        resident: a resident view holding the columns.
        names: column names.
        cache: read and update the store's entry in :func:`stats_cache_dir`; ``False``
            computes in memory only.
    """
    names = list(names)
    specs = {s.name: s.to_dict() for s in store.columns}
    path = stats_path(store.path)
    fingerprint = _fingerprint(store) if cache else {}
    cached = _read_cache(path, fingerprint) if cache else {}
    out: dict[str, ColumnStats] = {}
    changed = False
    for name in names:
        entry = cached.get(name)
        if entry is not None and entry.get("spec") == specs[name]:
            try:
                out[name] = ColumnStats.from_json(entry)
                continue
            except (KeyError, TypeError, ValueError):
                pass
        out[name] = column_stats(resident, name)
        cached[name] = {"spec": specs[name], **out[name].to_json()}
        changed = True
    if cache and changed:
        _write_cache(path, fingerprint, cached)
    return out


class Normalizer(torch.nn.Module):
    """Element-wise affine normalisation of columns: ``x_n = (x - loc) / scale``.

    ``mean_std``: ``loc = mean``, ``scale = std``; ``min_max``: ``loc = (max + min) / 2``,
    ``scale = (max - min) / 2`` (values map onto ``[-1, 1]``). ``scale`` is clamped to at
    least ``eps``, so a constant element maps to 0. A module: assign it to a policy
    (``policy.normalizer = dm.normalizer``) and its ``loc``/``scale`` buffers follow the
    policy's device and checkpoint.

    Args:
        stats: column name -> :class:`ColumnStats`.
        mode: ``"mean_std"`` or ``"min_max"``.
        eps: smallest scale.

    Examples:
        >>> action = dm.normalizer.unnormalize("action", policy(obs))  # back to env units
    """

    def __init__(
        self,
        stats: Mapping[str, ColumnStats],
        mode: str | Normalization = "mean_std",
        eps: float = 1e-6,
    ):
        super().__init__()
        self.mode = choice(Normalization, mode, "normalization")
        self.stats = dict(stats)
        self.keys = tuple(self.stats)
        self._slot = {name: i for i, name in enumerate(self.keys)}
        for i, name in enumerate(self.keys):
            s = self.stats[name]
            if self.mode is Normalization.MEAN_STD:
                loc, scale = s.mean, s.std
            else:
                loc, scale = (s.max + s.min) / 2, (s.max - s.min) / 2
            self.register_buffer(f"loc_{i}", loc.to(torch.float32))
            self.register_buffer(f"scale_{i}", scale.clamp(min=eps).to(torch.float32))

    def _affine(self, key: str | tuple[str, ...]) -> tuple[Tensor, Tensor]:
        name = name_from_key(key)
        i = self._slot.get(name)
        if i is None:
            raise ColumnError(
                f"no normalisation statistics for column {name!r}; "
                f"columns with statistics are {list(self.keys)}"
            )
        return getattr(self, f"loc_{i}"), getattr(self, f"scale_{i}")

    def normalize(self, key: str | tuple[str, ...], value: Tensor) -> Tensor:
        """``(value - loc) / scale`` for column ``key``; ``value`` is ``[..., *shape]``."""
        loc, scale = self._affine(key)
        if not value.is_floating_point():
            value = value.to(loc.dtype)
        return (value - loc) / scale

    def unnormalize(self, key: str | tuple[str, ...], value: Tensor) -> Tensor:
        """The inverse of :meth:`normalize`: ``value * scale + loc``."""
        loc, scale = self._affine(key)
        return value * scale + loc

    def extra_repr(self) -> str:
        return f"mode={self.mode.value!r}, keys={list(self.keys)}"
