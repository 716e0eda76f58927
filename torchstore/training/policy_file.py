"""A trained policy's tensors, with the normaliser it was trained behind, in one safetensors file.

A policy trained on normalised data is only usable with its normalisation statistics, so
they travel in the same file: each column's ``mean``, ``std``, ``min``, ``max`` and
``count`` under ``normalizer.<column>.<part>``, and the normaliser's mode in the file's
metadata (``normalization``). Everything else in the file is the caller's: tensor names
are kept as given, metadata is ``str -> str`` (safetensors' rule; ints and bools given
to :func:`save_policy_file` are written as text, bools as ``"true"`` / ``"false"``).

safetensors, not pickle: loading a file never runs code, so a policy fetched from a
shared location is as safe to open as one written here. A file is written to a temporary
name, synced and renamed, so a reader sees the previous file or the new one, never half.

Examples:
    >>> save_policy_file("policy.safetensors", net.state_dict(), normalizer=dm.normalizer,
    ...                  metadata={"step": 2000})  # doctest: +SKIP
    >>> saved = read_policy_file("policy.safetensors")  # doctest: +SKIP
    >>> net.load_state_dict(saved.tensors)  # doctest: +SKIP
    >>> action = saved.normalizer().unnormalize("action", net(obs))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchstore.errors import ArgumentError, ArgumentTypeError, StoreFormatError

if TYPE_CHECKING:
    from torchstore.lightning.normalizer import Normalizer

__all__ = [
    "NORMALIZATION_KEY",
    "NORMALIZER_PREFIX",
    "PolicyFile",
    "read_policy_file",
    "save_policy_file",
]

NORMALIZER_PREFIX = "normalizer."
NORMALIZATION_KEY = "normalization"
_STAT_PARTS = ("mean", "std", "min", "max", "count")


def _metadata_text(metadata: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise ArgumentTypeError(f"metadata key {key!r} must be a str")
        if isinstance(value, bool):
            out[key] = str(value).lower()
        elif isinstance(value, (str, int, float)):
            out[key] = str(value)
        else:
            raise ArgumentTypeError(
                f"metadata[{key!r}] ({type(value).__name__}) must be a str, int, float or bool"
            )
    return out


def _normalizer_tensors(normalizer: Normalizer) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, stats in normalizer.stats.items():
        for part in _STAT_PARTS[:-1]:
            tensors[f"{NORMALIZER_PREFIX}{name}.{part}"] = getattr(stats, part)
        tensors[f"{NORMALIZER_PREFIX}{name}.count"] = torch.tensor(int(stats.count))
    return tensors


def _unshared(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, and no two sharing memory: safetensors refuses shared tensors (tied
    weights, one statistics tensor for two columns), so a repeat is written as a copy."""
    seen: set[int] = set()
    out = {}
    for name, value in tensors.items():
        value = value.to("cpu").contiguous()
        if value.untyped_storage().data_ptr() in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        out[name] = value
    return out


def save_policy_file(
    path: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    *,
    normalizer: Normalizer | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``tensors`` (and ``normalizer``'s statistics) to ``path`` as safetensors.

    Tensors are copied to the CPU; the file replaces ``path`` atomically.

    Args:
        path: the file to write (``policy.safetensors`` in a run folder).
        tensors: name -> tensor, typically a ``state_dict()``, possibly with prefixes.
        normalizer: the :class:`~torchstore.lightning.Normalizer` the policy was trained
            behind; :func:`read_policy_file` rebuilds it.
        metadata: text (or int, float, bool) stored in the file's header.

    Raises:
        ArgumentTypeError: a value of ``tensors`` is not a tensor, or a metadata value is
            not text, a number or a bool.
        ArgumentError: a tensor name starts with ``normalizer.`` while ``normalizer`` is
            given, or ``metadata`` sets ``normalization`` itself.
    """
    from safetensors.torch import save

    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"tensors[{name!r}] is a {type(value).__name__}, not a tensor")
    data = _unshared({k: v.detach() for k, v in tensors.items()})
    meta = _metadata_text(metadata or {})
    if normalizer is not None:
        clash = [k for k in data if k.startswith(NORMALIZER_PREFIX)]
        if clash:
            raise ArgumentError(
                f"tensor names {clash[:3]} start with {NORMALIZER_PREFIX!r}, where the "
                "normalizer's statistics go; rename them or save without normalizer="
            )
        if NORMALIZATION_KEY in meta:
            raise ArgumentError(
                f"metadata[{NORMALIZATION_KEY!r}] is written from the normalizer's mode; "
                "leave it out of metadata="
            )
        data = _unshared({**data, **_normalizer_tensors(normalizer)})
        meta[NORMALIZATION_KEY] = normalizer.mode.value
    blob = save(data, metadata=meta)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """A policy file's content (:func:`read_policy_file`), or the same from fetched tensors.

    Attributes:
        state: every tensor of the file, under its saved name (what
            ``torchstore.remote.fetch_policy_weights`` returns for it).
        metadata: the file's header metadata (``str -> str``).

    Examples:
        >>> saved = PolicyFile(fetch_policy_weights(location, "reach-bc"))  # doctest: +SKIP
        >>> saved.normalizer("min_max")  # the mode from the run's config  # doctest: +SKIP
    """

    state: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The policy's own tensors: every tensor but the normaliser's statistics."""
        return {k: v for k, v in self.state.items() if not k.startswith(NORMALIZER_PREFIX)}

    def normalizer(self, mode: str | None = None) -> Normalizer | None:
        """The :class:`~torchstore.lightning.Normalizer` saved with the policy, or ``None``
        when the file holds no statistics.

        Args:
            mode: ``"mean_std"`` or ``"min_max"``; by default the mode the file records
                (``metadata["normalization"]``), else ``"mean_std"``.

        Raises:
            StoreFormatError: a column's statistics lack a part (``mean``, ``std``, ...).
        """
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in self.state.items():
            if key.startswith(NORMALIZER_PREFIX):
                name, _, part = key[len(NORMALIZER_PREFIX) :].rpartition(".")
                parts.setdefault(name, {})[part] = value
        if not parts:
            return None
        from torchstore.lightning.normalizer import ColumnStats, Normalizer

        stats = {}
        for name, p in parts.items():
            missing = [part for part in _STAT_PARTS if part not in p]
            if missing or not name:
                raise StoreFormatError(
                    f"normalizer statistics of column {name!r} lack {missing or _STAT_PARTS}; "
                    f"each column needs {list(_STAT_PARTS)} under '{NORMALIZER_PREFIX}<column>.'"
                )
            stats[name] = ColumnStats(p["mean"], p["std"], p["min"], p["max"], int(p["count"]))
        if mode is None:
            mode = self.metadata.get(NORMALIZATION_KEY, "mean_std")
        return Normalizer(stats, mode)


def read_policy_file(path: str | os.PathLike) -> PolicyFile:
    """The tensors and metadata :func:`save_policy_file` wrote to ``path``
    (:meth:`PolicyFile.normalizer` rebuilds the normaliser).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        StoreFormatError: the file is not a readable safetensors file (truncated, say).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no policy file at {path}")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as exc:  # SafetensorError has no stable import path
        raise StoreFormatError(f"{path} is not a readable safetensors file: {exc}") from exc
    return PolicyFile(tensors, metadata)
