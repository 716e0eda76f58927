"""D4RL-style flat HDF5 files into stores: the layout most offline-RL papers' data comes in.

One file, every array with the same leading length N (one row per transition, episodes
concatenated): ``observations (N, ...)``, ``actions (N, ...)``, ``rewards (N,)`` or
``(N, 1)``, ``terminals`` likewise, optional ``timeouts`` and ``next_observations``, and
optional ``infos/...`` arrays. An episode ends at row ``i`` when ``terminals[i] or
timeouts[i]``; rows after the last such flag are an unfinished last episode, kept with
``{"unfinished": true}`` in its metadata.

Columns: ``obs``, ``action``, ``reward``, ``terminated`` (from ``terminals``),
``truncated`` (from ``timeouts``), ``done``, ``next/obs`` (only when the file has
``next_observations``: D4RL files without them do not hold each episode's final
observation) and ``info/<path>`` for numeric ``infos`` arrays. Scalar entries of a
``metadata`` group go to the manifest's ``metadata["d4rl"]``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError, DatasetFormatError, TorchstoreError

__all__ = ["import_d4rl", "episode_lengths"]

REQUIRED = ("observations", "actions", "rewards", "terminals")


def episode_lengths(ends: np.ndarray) -> tuple[list[int], bool]:
    """Episode lengths from a per-row "episode ends here" flag, and whether rows trail the last end.

    Examples:
        >>> episode_lengths(np.array([0, 0, 0, 1, 0, 0, 1, 0, 0, 0], dtype=bool))
        ([4, 3, 3], True)
    """
    last = np.flatnonzero(ends)
    lengths = np.diff(np.concatenate([[-1], last])).tolist()
    tail = len(ends) - (int(last[-1]) + 1 if len(last) else 0)
    if tail:
        lengths.append(tail)
    return [int(n) for n in lengths], bool(tail)


def _flags(f: h5py.File, key: str, n: int, source: Path) -> np.ndarray:
    array = _array(f, key, n, source)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise DatasetFormatError(
            f"{source}: '{key}' must have shape [{n}] or [{n}, 1], got {list(array.shape)}"
        )
    if array.dtype != bool:
        if array.dtype.kind not in "iuf" or not np.isin(array, (0, 1)).all():
            raise DatasetFormatError(f"{source}: '{key}' must hold only 0/1 or booleans")
        array = array.astype(bool)
    return array


def _array(f: h5py.File, key: str, n: int | None, source: Path) -> np.ndarray:
    obj = f.get(key)
    if not isinstance(obj, h5py.Dataset):
        raise DatasetFormatError(f"{source}: '{key}' is not an array")
    try:
        array = obj[()]
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DatasetFormatError(
            f"{source}: '{key}' cannot be read ({exc}); the file is truncated or damaged"
        ) from exc
    if not isinstance(array, np.ndarray) or array.ndim == 0:
        raise DatasetFormatError(f"{source}: '{key}' must be an array with one row per transition")
    if n is not None and array.shape[0] != n:
        raise DatasetFormatError(
            f"{source}: '{key}' has {array.shape[0]} rows, 'observations' has {n}; every array "
            "needs one row per transition"
        )
    return array


def import_d4rl(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    env_id: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Import a D4RL-style flat HDF5 file into a new store at ``dest``; returns ``dest``.

    Args:
        source: the ``.hdf5`` file.
        dest: the store file to write.
        env_id: the env the data comes from (D4RL files do not say); kept in the manifest.
        overwrite: replace an existing store at ``dest``.

    Raises:
        DatasetFormatError: the file is unreadable, lacks a required array, or its arrays
            disagree in length or shape (the message names the key).

    Examples:
        >>> import_d4rl("hopper-medium-v2.hdf5", "hopper.h5", env_id="Hopper-v5")
        PosixPath('hopper.h5')
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter

    source = Path(source)
    try:
        f = h5py.File(source, "r")
    except (OSError, ValueError) as exc:
        raise DatasetFormatError(
            f"{source} is not a readable HDF5 file ({' '.join(str(exc).split())[:200]})"
        ) from exc
    try:
        with f:
            rows, meta, skipped = _read(f, source)
    except (OSError, KeyError, RuntimeError) as exc:
        if isinstance(exc, TorchstoreError):
            raise
        raise DatasetFormatError(
            f"{source} cannot be read ({' '.join(str(exc).split())[:200]}); the file is truncated "
            "or damaged"
        ) from exc
    if skipped:
        warnings.warn(
            f"{source}: infos {skipped} are not numeric arrays of one row per transition; skipped",
            stacklevel=2,
        )
    if len(rows["obs"]) == 0:
        raise DatasetFormatError(f"{source} holds no transitions")
    try:
        columns = [ColumnSpec(name, a.dtype, a.shape[1:]) for name, a in rows.items()]
    except ColumnError as exc:
        raise DatasetFormatError(f"{source}: {exc}") from exc
    lengths, unfinished = episode_lengths(rows["done"])
    episode_meta = [None] * len(lengths)
    if unfinished:
        episode_meta[-1] = {"unfinished": True}
    metadata = {"d4rl": {"source": source.name, **{k: v for k, v in meta.items() if _jsonable(v)}}}
    existed = Path(dest).exists()
    try:
        with TrajectoryStoreWriter(
            dest, columns, env_id=env_id, metadata=metadata, overwrite=overwrite
        ) as writer:
            writer.add_episodes(rows, lengths, episode_meta)
    except BaseException:
        if not existed:  # a failed import leaves no partial store behind (a replaced one stays)
            Path(dest).unlink(missing_ok=True)
        raise
    return Path(dest)


def _read(f: h5py.File, source: Path) -> tuple[dict[str, np.ndarray], dict[str, Any], list[str]]:
    """The file's columns (checked), its scalar metadata, and the infos that were skipped."""
    missing = [k for k in REQUIRED if k not in f]
    if missing:
        raise DatasetFormatError(
            f"{source} lacks {missing}; a D4RL-style file holds {list(REQUIRED)} (+ timeouts, "
            "next_observations)"
        )
    obs = _array(f, "observations", None, source)
    n = obs.shape[0]
    rows: dict[str, np.ndarray] = {"obs": obs, "action": _array(f, "actions", n, source)}
    rows["reward"] = _rewards(f, n, source)
    terminated = _flags(f, "terminals", n, source)
    truncated = _flags(f, "timeouts", n, source) if "timeouts" in f else np.zeros(n, dtype=bool)
    rows.update(terminated=terminated, truncated=truncated, done=terminated | truncated)
    if "next_observations" in f:
        nxt = _array(f, "next_observations", n, source)
        if nxt.shape != obs.shape:
            raise DatasetFormatError(
                f"{source}: 'next_observations' has shape {list(nxt.shape)}, 'observations' "
                f"{list(obs.shape)}"
            )
        rows["next/obs"] = nxt
    skipped = _read_infos(f, n, source, rows)
    return rows, _read_metadata(f), skipped


def _rewards(f: h5py.File, n: int, source: Path) -> np.ndarray:
    """``rewards`` as numbers of shape ``[n]`` (``[n, 1]`` is squeezed, ints become floats)."""
    reward = _array(f, "rewards", n, source)
    if reward.ndim == 2 and reward.shape[1] == 1:
        reward = reward[:, 0]
    if reward.ndim != 1 or reward.dtype.kind not in "iuf":
        raise DatasetFormatError(
            f"{source}: 'rewards' must be numbers of shape [{n}] or [{n}, 1], got "
            f"{reward.dtype}{list(reward.shape)}"
        )
    return reward if reward.dtype.kind == "f" else reward.astype(np.float64)


def _read_infos(f: h5py.File, n: int, source: Path, rows: dict[str, np.ndarray]) -> list[str]:
    """Add each per-row numeric array under ``infos/`` to ``rows``; returns those skipped."""
    skipped: list[str] = []
    if not isinstance(f.get("infos"), h5py.Group):
        return skipped

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            if obj.ndim >= 1 and obj.shape[0] == n and obj.dtype.kind in "biuf":
                rows[f"info/{name}"] = _array(f, f"infos/{name}", n, source)
            else:
                skipped.append(name)

    f["infos"].visititems(visit)
    return skipped


def _read_metadata(f: h5py.File) -> dict[str, Any]:
    """The scalar datasets under ``metadata/`` (bytes decoded as UTF-8)."""
    meta: dict[str, Any] = {}
    if not isinstance(f.get("metadata"), h5py.Group):
        return meta
    for key, obj in f["metadata"].items():
        if isinstance(obj, h5py.Dataset) and obj.ndim == 0:
            value = obj[()]
            meta[key] = (
                value.decode("utf-8", "replace")
                if isinstance(value, bytes)
                else np.asarray(value).item()
            )
    return meta


def _jsonable(value: Any) -> bool:
    return isinstance(value, str | int | bool) or (isinstance(value, float) and np.isfinite(value))
