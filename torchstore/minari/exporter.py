"""Stores out as Minari datasets that ``minari.load_dataset`` opens, with equal values.

The inverse of :func:`~torchstore.minari.import_minari`: each episode's ``T`` rows give
``T + 1`` observations (``obs`` rows, then the last ``next/obs``), ``T`` actions, rewards,
terminations and truncations, and infos from ``info/*`` and ``next/info/*``. The spaces
come from the manifest (a Minari import and a gymnasium recording keep them), else from
the env (``store.make_env()``), else from the columns (unbounded ``Box`` spaces, ``Dict`` for
nested names). Images are written raw (``jpeg_encoding=False``), so values stay exact.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import (
    ColumnError,
    DestinationExistsError,
    EnvUnavailableError,
    EpisodeError,
    UnsafePathError,
)
from torchstore.gym.spaces import unflatten_value
from torchstore.minari.importer import require_minari

__all__ = ["export_minari"]

FORMATS = ("hdf5", "arrow")
#: Steps handed to minari at a time (its writers take whole episode buffers in memory).
CHUNK_STEPS = 65536


@contextlib.contextmanager
def _datasets_root(root: str | os.PathLike | None) -> Iterator[None]:
    """Point minari at ``root`` while the dataset is written (minari reads only the variable)."""
    if root is None:
        yield
        return
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(root).absolute())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _inferred_space(prefix: str, names: dict[str, Any]):
    from gymnasium import spaces

    if prefix in names:
        spec = names[prefix]
        dtype = np.dtype(str(spec.dtype).removeprefix("torch."))
        if dtype.kind == "f":
            return spaces.Box(-np.inf, np.inf, spec.shape, dtype)
        if dtype.kind == "b":
            return spaces.MultiBinary(spec.shape or 1)
        info = np.iinfo(dtype)
        return spaces.Box(info.min, info.max, spec.shape, dtype)
    children = sorted(
        {n[len(prefix) + 1 :].split("/")[0] for n in names if n.startswith(prefix + "/")}
    )
    if not children:
        raise ColumnError(f"the store has no '{prefix}' column, which a Minari dataset needs")
    return spaces.Dict({c: _inferred_space(f"{prefix}/{c}", names) for c in children})


def _spaces(store: Any) -> tuple[Any, Any, Any]:
    """(observation space, action space, env spec or None) for ``store``."""
    from gymnasium.envs.registration import EnvSpec

    meta = store.manifest.metadata
    minari_meta = meta.get("minari") if isinstance(meta.get("minari"), dict) else {}
    spec = None
    for entry in (minari_meta, meta.get("gymnasium")):
        if isinstance(entry, dict) and isinstance(entry.get("env_spec"), str):
            with contextlib.suppress(Exception):
                spec = EnvSpec.from_json(entry["env_spec"])
                break
    if isinstance(minari_meta.get("observation_space"), str) and isinstance(
        minari_meta.get("action_space"), str
    ):
        from minari.serialization import deserialize_space

        return (
            deserialize_space(minari_meta["observation_space"]),
            deserialize_space(minari_meta["action_space"]),
            spec,
        )
    recorded = meta.get("gymnasium") if isinstance(meta.get("gymnasium"), dict) else {}
    if isinstance(recorded.get("observation_space"), dict) and isinstance(
        recorded.get("action_space"), dict
    ):
        from torchstore.gym.spaces import space_from_json

        return (
            space_from_json(recorded["observation_space"]),
            space_from_json(recorded["action_space"]),
            spec,
        )
    if store.manifest.env_id:
        with contextlib.suppress(EnvUnavailableError):
            env = store.make_env()
            try:
                return env.observation_space, env.action_space, spec or env.spec
            finally:
                env.close()
    names = {c.name: c for c in store.columns}
    return _inferred_space("obs", names), _inferred_space("action", names), None


def _check_columns(store: Any, obs_space: Any, act_space: Any) -> None:
    from torchstore.gym.spaces import space_columns

    have = {c.name for c in store.columns}
    need = [c.name for c in space_columns("obs", obs_space)]
    need += [f"next/{n}" for n in need] + [c.name for c in space_columns("action", act_space)]
    need += ["reward", "terminated", "truncated"]
    missing = [n for n in need if n not in have]
    if missing:
        raise ColumnError(
            f"{store.path} lacks the columns {missing} that a Minari dataset needs "
            "(observations, next observations, actions, rewards, terminations, truncations)"
        )


def _check_id(dataset_id: Any) -> None:
    from minari.dataset.minari_dataset import parse_dataset_id

    if not isinstance(dataset_id, str) or not dataset_id:
        raise ValueError(f"dataset_id ({dataset_id!r}) must be a non-empty string like name-v0")
    if dataset_id.startswith("/") or any(part in ("", ".", "..") for part in dataset_id.split("/")):
        raise UnsafePathError(
            f"dataset_id ({dataset_id!r}) must not be absolute or hold empty, '.' or '..' parts"
        )
    try:
        parse_dataset_id(dataset_id)
    except ValueError as exc:
        raise ValueError(f"dataset_id ({dataset_id!r}) must look like (namespace/)name-vN") from exc


def _episode_buffers(store: Any, obs_space: Any, act_space: Any, bar: Any) -> Iterator[list]:
    """The store's episodes as minari ``EpisodeBuffer`` lists of about :data:`CHUNK_STEPS` steps."""
    from minari.data_collector import EpisodeBuffer

    info_names = [c.name for c in store.columns if c.name.startswith("info/")]
    chunk: list = []
    steps = 0
    for i in range(store.num_episodes):
        ep = store.episode(i)
        flat = {
            (k if isinstance(k, str) else "/".join(k)): v.numpy()
            for k, v in ep.items(include_nested=True, leaves_only=True)
        }
        whole = {
            n: np.concatenate([flat[n], flat[f"next/{n}"][-1:]])
            for n in flat
            if n.startswith(("obs", "info/"))
        }
        infos: dict[str, Any] = {}
        for name in info_names:
            node = infos
            parts = name.split("/")[1:]
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = whole[name]
        chunk.append(
            EpisodeBuffer(
                id=i,
                seed=store.episode_metadata(i).get("seed"),
                observations=unflatten_value("obs", obs_space, whole),
                actions=unflatten_value("action", act_space, flat),
                rewards=flat["reward"],
                terminations=flat["terminated"],
                truncations=flat["truncated"],
                infos=infos,
            )
        )
        steps += len(flat["reward"])
        if bar is not None:
            bar.update(len(flat["reward"]))
        if steps >= CHUNK_STEPS:
            yield chunk
            chunk, steps = [], 0
    if chunk:
        yield chunk


def _env_for(spec: Any) -> Any:
    """``spec`` if gymnasium can build it here (minari makes the env), else None."""
    if spec is None:
        return None
    import gymnasium

    try:
        gymnasium.make(spec).close()
    except Exception:  # noqa: BLE001 - the env is not installed here: write no spec
        return None
    return spec


def export_minari(
    store: Any,
    dataset_id: str,
    *,
    root: str | os.PathLike | None = None,
    data_format: str = "hdf5",
    progress: bool = True,
) -> Path:
    """Write ``store`` as the Minari dataset ``dataset_id``; returns the dataset's folder.

    Episodes are handed to minari in chunks of about :data:`CHUNK_STEPS` steps, so a store
    larger than memory exports. A failed export removes the partial dataset.

    Args:
        store: a :class:`~torchstore.data.store.store.TrajectoryStore` or a store path.
        dataset_id: ``(namespace/)name-vN``, as ``minari.load_dataset`` takes it.
        root: the Minari datasets root to write under (default: ``$MINARI_DATASETS_PATH``,
            else ``~/.minari/datasets``).
        data_format: ``"hdf5"`` or ``"arrow"``.
        progress: draw a progress bar.

    Raises:
        DestinationExistsError: the dataset id already exists under the root.
        ColumnError: the store lacks a column a Minari episode needs.
        UnsafePathError: the id would land outside the root (``..`` parts).
    """
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.io.progress import progress_bar

    minari = require_minari()
    if data_format not in FORMATS:
        raise ValueError(f"data_format ({data_format!r}) must be one of {FORMATS}")
    _check_id(dataset_id)
    own = not isinstance(store, TrajectoryStore)
    if own:
        store = TrajectoryStore(store)
    try:
        if store.num_episodes == 0:
            raise EpisodeError(
                f"{store.path} holds no episodes; a Minari dataset needs at least one"
            )
        obs_space, act_space, spec = _spaces(store)
        _check_columns(store, obs_space, act_space)
        meta = store.manifest.metadata.get("minari") or {}
        with _datasets_root(root):
            from minari.storage import get_dataset_path

            target = get_dataset_path(dataset_id)
            if target.exists():
                raise DestinationExistsError(
                    f"the Minari dataset {dataset_id!r} already exists at {target}"
                )
            env = _env_for(spec)
            bar = progress_bar(
                enabled=progress, total=store.num_rows, unit="step", desc="export", leave=False
            )
            dataset = None
            try:
                for chunk in _episode_buffers(store, obs_space, act_space, bar):
                    if dataset is not None:
                        dataset.update_dataset_from_buffer(chunk)
                        continue
                    dataset = minari.create_dataset_from_buffers(
                        dataset_id,
                        chunk,
                        env=env,
                        observation_space=obs_space,
                        action_space=act_space,
                        algorithm_name=meta.get("algorithm_name"),
                        author=meta.get("author") and set(meta["author"]),
                        author_email=meta.get("author_email") and set(meta["author_email"]),
                        code_permalink=meta.get("code_permalink"),
                        description=meta.get("description")
                        or f"exported from the torchstore store {store.path.name}",
                        data_format=data_format,
                        jpeg_encoding=False,
                    )
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)  # it did not exist before
                raise
            finally:
                if bar is not None:
                    bar.close()
        return Path(dataset.storage.data_path).parent
    finally:
        if own:
            store.close()
