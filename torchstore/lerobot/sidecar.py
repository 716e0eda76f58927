"""``meta/torchstore.json``: what a store knew that LeRobot's format cannot say.

:func:`~torchstore.lerobot.export_lerobot` writes it beside LeRobot's metadata; LeRobot
reads only the files it knows, so the dataset loads there as before. An import of the
folder finds it and restores the store as it was: the same columns (names with their
``/`` nesting, dtypes, shapes, quantisation, and no column the export added), the env id,
the seed, the manifest's metadata and each episode's metadata.

The file is one JSON object::

    {"format": "torchstore-lerobot-sidecar", "version": 1,
     "columns": [{"feature": "next.state", "name": "next/state", "dtype": "float32",
                  "shape": [3], "quantize": null}, ...],
     "env_id": "Pendulum-v1", "seed": 7, "metadata": {...},
     "episodes": [{...episode 0's metadata...}, ...]}

Every field is checked before use. A sidecar naming a feature the dataset no longer has
(the folder was edited since the export) is ignored with a warning; a malformed one is a
:class:`~torchstore.errors.LeRobotFormatError`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError, LeRobotFormatError
from torchstore.lerobot.features import DEFAULT_FEATURES, Feature

__all__ = ["SIDECAR", "Sidecar", "read_sidecar", "write_sidecar"]

log = logging.getLogger(__name__)

SIDECAR = "meta/torchstore.json"
_FORMAT = "torchstore-lerobot-sidecar"
_VERSION = 1


@dataclass(frozen=True)
class Sidecar:
    """The store a LeRobot folder was exported from, as far as the folder cannot say it."""

    columns: dict[str, ColumnSpec]  # feature name -> the store column it came from
    env_id: str | None
    seed: int | None
    metadata: dict[str, Any]
    episodes: list[dict[str, Any]]  # by LeRobot episode index


def write_sidecar(root: str | os.PathLike, store, features: Mapping[str, str]) -> None:
    """Describe ``store``'s columns that became ``features`` (``{column: feature name}``).

    Columns of a LeRobot-imported store named like LeRobot's default features are listed
    too (the export regenerates them, the import reads them back).
    """
    from torchstore.lerobot.info import write_json_atomically

    imported = bool(store.manifest.metadata.get("lerobot"))
    columns = []
    for spec in store.columns:
        if spec.name in features:
            feature = features[spec.name]
        elif imported and spec.name in DEFAULT_FEATURES:
            feature = spec.name
        else:
            continue
        columns.append({"feature": feature, **spec.to_dict()})
    data = {
        "format": _FORMAT,
        "version": _VERSION,
        "columns": columns,
        "env_id": store.manifest.env_id,
        "seed": store.manifest.seed,
        "metadata": store.manifest.metadata,
        "episodes": [store.episode_metadata(i) for i in range(store.num_episodes)],
    }
    write_json_atomically(Path(root) / SIDECAR, data)


def read_sidecar(root: str | os.PathLike, features: Mapping[str, Feature]) -> Sidecar | None:
    """The checked sidecar of ``root``, or None when there is none (or it no longer fits)."""
    from torchstore.lerobot.info import read_json

    path = Path(root) / SIDECAR
    data = read_json(path, missing=None)
    if data is None:
        return None

    def bad(what: str) -> LeRobotFormatError:
        return LeRobotFormatError(f"{path}: {what}")

    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise bad(f"not a torchstore sidecar (format must be {_FORMAT!r})")
    if data.get("version") != _VERSION:
        raise bad(
            f"version {data.get('version')!r} is not supported (this torchstore reads {_VERSION})"
        )
    items = data.get("columns")
    if not isinstance(items, list) or not items:
        raise bad("'columns' must be a non-empty list")
    columns: dict[str, ColumnSpec] = {}
    for item in items:
        feature, spec = _column(item, columns, bad)
        if feature not in features:
            log.warning(
                "%s names feature %r, which %s no longer has: the sidecar is ignored",
                path,
                feature,
                root,
            )
            return None
        want = features[feature].value_shape
        if tuple(spec.shape) != want and int(_size(spec.shape)) != int(_size(want)):
            raise bad(
                f"column {spec.name!r} has shape {list(spec.shape)}, "
                f"feature {feature!r} holds {list(want)}"
            )
        columns[feature] = spec
    return _sidecar(data, columns, bad)


def _column(item: Any, seen: Mapping[str, ColumnSpec], bad) -> tuple[str, ColumnSpec]:
    """One ``columns`` entry as ``(feature, ColumnSpec)``; ``bad(what)`` builds the error."""
    if not isinstance(item, dict) or not isinstance(item.get("feature"), str):
        raise bad(f"column entry {item!r:.80} needs a string 'feature'")
    feature = item["feature"]
    if feature in seen:
        raise bad(f"feature {feature!r} is listed twice")
    try:
        return feature, ColumnSpec.from_dict({k: v for k, v in item.items() if k != "feature"})
    except ColumnError as exc:
        raise bad(f"column of feature {feature!r}: {exc}") from None


def _sidecar(data: Mapping[str, Any], columns: dict[str, ColumnSpec], bad) -> Sidecar:
    """The sidecar of checked ``columns`` and the rest of ``data``, each part checked."""
    env_id, seed, metadata, episodes = (
        data.get("env_id"),
        data.get("seed"),
        data.get("metadata"),
        data.get("episodes"),
    )
    if env_id is not None and not isinstance(env_id, str):
        raise bad(f"env_id must be a string or null, got {env_id!r:.80}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f"seed must be an int or null, got {seed!r:.80}")
    if not isinstance(metadata, dict):
        raise bad("'metadata' must be an object")
    if not isinstance(episodes, list) or not all(isinstance(e, dict) for e in episodes):
        raise bad("'episodes' must be a list of objects")
    return Sidecar(columns, env_id, seed, metadata, episodes)


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
