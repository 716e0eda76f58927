"""Minari datasets into stores: every episode exact, both of Minari's formats (HDF5, Arrow).

Minari keeps ``T + 1`` observations per episode of ``T`` steps; a store keeps one row per
step. So row ``t`` holds ``obs`` = observation ``t``, ``action``, ``reward``,
``terminated``, ``truncated``, ``done`` (either flag) of step ``t``, and ``next/obs`` =
observation ``t + 1``; the episode's final observation is the last ``next/obs``. Infos
that are numeric arrays (``T + 1`` rows, the reset info first) become ``info/<key>`` and
``next/info/<key>`` the same way; other infos are skipped with a warning. Dict and Tuple
observation spaces become nested columns (:mod:`torchstore.gym.spaces`).

The manifest records the env id, and under ``metadata["minari"]`` the dataset's
``metadata.json`` (spaces and env spec as Minari's JSON strings), so :func:`export_minari`
writes the same spaces back and ``store.make_env()`` rebuilds the env; each episode's
metadata holds its seed and Minari episode id. Reading goes through the ``minari``
package (``pip install -e ".[interop]"``).
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec, torch_dtype
from torchstore.errors import ColumnError, DatasetFormatError, TorchstoreError
from torchstore.extras import install_hint
from torchstore.gym.spaces import flatten_value, space_columns

__all__ = ["import_minari", "open_minari", "require_minari"]

#: Rows gathered before a commit (one commit per small episode costs more than its rows).
_COMMIT_ROWS = 65536
#: Keys of Minari's metadata.json that are sizes or counts of this copy, not facts about the data.
_LOCAL_KEYS = ("dataset_size", "total_episodes", "total_steps")


def require_minari():
    """The ``minari`` module, or an ImportError naming the extra to install."""
    try:
        import minari
    except ImportError as exc:
        raise ImportError(
            "reading and writing Minari datasets needs the minari package: "
            + install_hint("interop")
        ) from exc
    return minari


def _data_folder(path: Path) -> Path | None:
    for data in (path / "data", path):
        if (data / "metadata.json").is_file():
            return data
    return None


def open_minari(source: Any):
    """A ``MinariDataset`` from a dataset, a dataset folder or a local dataset id."""
    minari = require_minari()
    if isinstance(source, minari.MinariDataset):
        return source
    if not isinstance(source, str | os.PathLike):
        raise DatasetFormatError(
            "a Minari source must be a path, a dataset id or a MinariDataset, got "
            f"{type(source).__name__}"
        )
    path = Path(source)
    try:
        if path.exists():
            data = _data_folder(path) if path.is_dir() else None
            if data is None:
                raise DatasetFormatError(f"{path} is not a Minari dataset (no data/metadata.json)")
            return minari.MinariDataset(data)
        return minari.load_dataset(str(source))
    except TorchstoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - minari raises ValueError, KeyError, AssertionError, OSError...
        raise DatasetFormatError(
            f"{source}: not a readable Minari dataset ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]})"
        ) from exc


def _info_leaves(infos: Any, prefix: str = "info") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(infos, Mapping):
        for key, value in infos.items():
            out.update(_info_leaves(value, f"{prefix}/{key}"))
    else:
        out[prefix] = infos
    return out


def _info_columns(infos: Any, rows: int) -> list[ColumnSpec]:
    columns, skipped = [], []
    for name, value in _info_leaves(infos).items():
        array = np.asarray(value) if isinstance(value, np.ndarray | list) else None
        try:
            if array is None or array.ndim == 0 or array.shape[0] != rows:
                raise ColumnError("not an array with a row per observation")
            torch_dtype(array.dtype)
            columns.append(ColumnSpec(name, array.dtype, array.shape[1:]))
        except ColumnError:
            skipped.append(name.removeprefix("info/"))
    if skipped:
        warnings.warn(
            f"Minari infos {skipped} are not numeric arrays of one row per observation; skipped",
            stacklevel=3,
        )
    return columns


def _rows(name: str, value: Any, expected: int, where: str) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim == 0 or array.shape[0] != expected:
        got = "a scalar" if array.ndim == 0 else f"{array.shape[0]} rows"
        raise DatasetFormatError(f"{where}: '{name}' has {got}, expected {expected}")
    return array


def _episode_rows(ep: Any, ds: Any, infos: list[ColumnSpec], where: str) -> dict[str, np.ndarray]:
    steps = len(np.asarray(ep.rewards))
    try:
        obs = flatten_value("obs", ds.observation_space, ep.observations)
        act = flatten_value("action", ds.action_space, ep.actions)
    except ColumnError as exc:
        raise DatasetFormatError(f"{where}: {exc}") from exc
    rows: dict[str, np.ndarray] = {}
    for name, value in obs.items():
        value = _rows(f"observations{name[3:]}", value, steps + 1, where)
        rows[name], rows[f"next/{name}"] = value[:-1], value[1:]
    for name, value in act.items():
        rows[name] = _rows(f"actions{name[6:]}", value, steps, where)
    rows["reward"] = _rows("rewards", ep.rewards, steps, where)
    term = _rows("terminations", ep.terminations, steps, where).astype(bool)
    trunc = _rows("truncations", ep.truncations, steps, where).astype(bool)
    rows["terminated"], rows["truncated"], rows["done"] = term, trunc, term | trunc
    leaves = _info_leaves(ep.infos or {})
    for spec in infos:
        if spec.name not in leaves:
            raise DatasetFormatError(
                f"{where}: infos lack '{spec.name.removeprefix('info/')}', which episode 0 has"
            )
        value = _rows(f"infos{spec.name[4:]}", leaves[spec.name], steps + 1, where)
        rows[spec.name], rows[f"next/{spec.name}"] = value[:-1], value[1:]
    return rows


def _raw_metadata(ds: Any) -> dict[str, Any]:
    try:
        raw = json.loads((Path(ds.storage.data_path) / "metadata.json").read_text())
    except (OSError, ValueError) as exc:
        raise DatasetFormatError(
            f"{ds.storage.data_path}: metadata.json cannot be read ({exc})"
        ) from exc
    return {k: v for k, v in raw.items() if k not in _LOCAL_KEYS}


def import_minari(
    source: Any,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Import a Minari dataset into a new store at ``dest``; returns ``dest``.

    Args:
        source: a ``minari.MinariDataset``, a dataset folder (``<root>/<id>``, or its
            ``data`` folder), or the id of a dataset in the local Minari root
            (``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``; nothing is downloaded).
        dest: the store file to write.
        overwrite: replace an existing store at ``dest``.
        progress: draw a progress bar.

    Raises:
        DatasetFormatError: the dataset is unreadable, truncated, or its arrays do not
            have the lengths an episode needs (the message names the episode and key).

    Examples:
        >>> import_minari("D4RL/door/human-v2", "door.h5")
        PosixPath('door.h5')
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.io.progress import progress_bar

    ds = open_minari(source)
    label = str(source) if isinstance(source, str | os.PathLike) else ds.id
    indices = [int(i) for i in ds.episode_indices]
    storage = ds.storage
    try:
        seeds = {int(m["id"]): m.get("seed") for m in storage.get_episode_metadata(indices)}
    except Exception as exc:  # noqa: BLE001 - damaged per-episode metadata
        raise DatasetFormatError(f"{label}: the episode metadata cannot be read ({exc})") from exc
    episodes = _episodes(storage, indices, label)
    try:
        first_id, first = next(episodes)
    except StopIteration:
        raise DatasetFormatError(f"{label} holds no episodes") from None
    obs = space_columns("obs", ds.observation_space)
    infos = _info_columns(first.infos or {}, len(np.asarray(first.rewards)) + 1)
    columns = [
        *obs,
        *space_columns("action", ds.action_space),
        ColumnSpec("reward", _reward_dtype(first.rewards)),
        ColumnSpec("terminated", "bool"),
        ColumnSpec("truncated", "bool"),
        ColumnSpec("done", "bool"),
        *(ColumnSpec(f"next/{c.name}", c.dtype, c.shape) for c in obs),
        *infos,
        *(ColumnSpec(f"next/{c.name}", c.dtype, c.shape) for c in infos),
    ]
    meta = _raw_metadata(ds)
    env = ds.env_spec
    bar = progress_bar(
        enabled=progress, total=ds.total_steps, unit="step", desc="import", leave=False
    )
    pending: list[tuple[dict, dict]] = []
    empty: list[int] = []
    existed = Path(dest).exists()
    try:
        with TrajectoryStoreWriter(
            dest,
            columns,
            env_id=None if env is None else env.id,
            metadata={"minari": meta},
            overwrite=overwrite,
        ) as writer:
            for ep_id, ep in itertools.chain([(first_id, first)], episodes):
                where = f"{label} episode {ep_id}"
                if len(np.asarray(ep.rewards)) == 0:
                    empty.append(ep_id)
                    continue
                seed = seeds.get(ep_id)
                meta_ep = {"seed": None if seed is None else int(seed), "minari_id": ep_id}
                pending.append((_episode_rows(ep, ds, infos, where), meta_ep))
                if sum(len(r["reward"]) for r, _ in pending) >= _COMMIT_ROWS:
                    _flush(writer, pending, bar)
            _flush(writer, pending, bar)
    except BaseException:
        if not existed:  # a failed import leaves no partial store behind (a replaced one stays)
            Path(dest).unlink(missing_ok=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    if empty:
        warnings.warn(
            f"{label}: episodes {empty[:10]} have no steps; a store has no row for them, skipped",
            stacklevel=2,
        )
    return Path(dest)


def _reward_dtype(rewards: Any) -> Any:
    dtype = np.asarray(rewards).dtype
    return dtype if dtype.kind == "f" else np.float64


def _episodes(storage: Any, indices: list[int], label: str):
    from minari.dataset.episode_data import EpisodeData

    for i in indices:
        try:
            data = next(iter(storage.get_episodes([i])))
            ep = EpisodeData(**data)
        except Exception as exc:  # noqa: BLE001 - h5py/pyarrow errors from a damaged file
            raise DatasetFormatError(
                f"{label} episode {i} cannot be read ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:300]})"
            ) from exc
        yield i, ep


def _flush(writer: Any, pending: list, bar: Any) -> None:
    if not pending:
        return
    rows = {k: np.concatenate([r[k] for r, _ in pending]) for k in pending[0][0]}
    lengths = [len(r["reward"]) for r, _ in pending]
    try:
        writer.add_episodes(rows, lengths, [m for _, m in pending])
    except ColumnError as exc:
        raise DatasetFormatError(
            f"episodes {[m['minari_id'] for _, m in pending][:5]}...: {exc}"
        ) from exc
    if bar is not None:
        bar.update(sum(lengths))
    pending.clear()
