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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import ColumnError, DestinationExistsError, EnvUnavailableError
from torchstore.gym.spaces import unflatten_value
from torchstore.minari.importer import require_minari

__all__ = ["export_minari"]

FORMATS = ("hdf5", "arrow")


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
    children = sorted({n[len(prefix) + 1 :].split("/")[0] for n in names if n.startswith(prefix + "/")})
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
    if isinstance(minari_meta.get("observation_space"), str) and isinstance(minari_meta.get("action_space"), str):
        from minari.serialization import deserialize_space

        return deserialize_space(minari_meta["observation_space"]), deserialize_space(minari_meta["action_space"]), spec
    recorded = meta.get("gymnasium") if isinstance(meta.get("gymnasium"), dict) else {}
    if isinstance(recorded.get("observation_space"), dict) and isinstance(recorded.get("action_space"), dict):
        from torchstore.gym.spaces import space_from_json

        return space_from_json(recorded["observation_space"]), space_from_json(recorded["action_space"]), spec
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


def export_minari(
    store: Any,
    dataset_id: str,
    *,
    root: str | os.PathLike | None = None,
    data_format: str = "hdf5",
    progress: bool = True,
) -> Path:
    """Write ``store`` as the Minari dataset ``dataset_id``; returns the dataset's folder.

    Args:
        store: a :class:`~torchstore.data.store.TrajectoryStore` or a store path.
        dataset_id: ``(namespace/)name-vN``, as ``minari.load_dataset`` takes it.
        root: the Minari datasets root to write under (default: ``$MINARI_DATASETS_PATH``,
            else ``~/.minari/datasets``).
        data_format: ``"hdf5"`` or ``"arrow"``.
        progress: draw a progress bar.

    Raises:
        DestinationExistsError: the dataset id already exists under the root.
        ColumnError: the store lacks a column a Minari episode needs.
    """
    from torchstore.data.store import TrajectoryStore
    from torchstore.io.progress import progress_bar

    minari = require_minari()
    from minari.data_collector import EpisodeBuffer

    if data_format not in FORMATS:
        raise ValueError(f"data_format ({data_format!r}) must be one of {FORMATS}")
    if not isinstance(dataset_id, str) or not dataset_id:
        raise ValueError(f"dataset_id ({dataset_id!r}) must be a non-empty string like name-v0")
    own = not isinstance(store, TrajectoryStore)
    if own:
        store = TrajectoryStore(store)
    try:
        obs_space, act_space, spec = _spaces(store)
        _check_columns(store, obs_space, act_space)
        info_names = [c.name for c in store.columns if c.name.startswith("info/")]
        buffers = []
        bar = progress_bar(enabled=progress, total=store.num_rows, unit="step", desc="export", leave=False)
        for i in range(store.num_episodes):
            ep = store.episode(i)
            flat = {
                (k if isinstance(k, str) else "/".join(k)): v.numpy()
                for k, v in ep.items(include_nested=True, leaves_only=True)
            }
            whole = {n: np.concatenate([flat[n], flat[f"next/{n}"][-1:]]) for n in flat if n.startswith(("obs", "info/"))}
            infos: dict[str, Any] = {}
            for name in info_names:
                node = infos
                parts = name.split("/")[1:]
                for part in parts[:-1]:
                    node = node.setdefault(part, {})
                node[parts[-1]] = whole[name]
            seed = store.episode_metadata(i).get("seed")
            buffers.append(
                EpisodeBuffer(
                    id=i,
                    seed=seed,
                    observations=unflatten_value("obs", obs_space, whole),
                    actions=unflatten_value("action", act_space, flat),
                    rewards=flat["reward"],
                    terminations=flat["terminated"],
                    truncations=flat["truncated"],
                    infos=infos,
                )
            )
            if bar is not None:
                bar.update(len(flat["reward"]))
        if bar is not None:
            bar.close()
        meta = store.manifest.metadata.get("minari") or {}
        with _datasets_root(root):
            from minari.storage import get_dataset_path

            try:
                env = spec
                if env is not None:
                    import gymnasium

                    try:
                        gymnasium.make(env).close()
                    except Exception:  # noqa: BLE001 - the env is not installed here: write no spec
                        env = None
                dataset = minari.create_dataset_from_buffers(
                    dataset_id,
                    buffers,
                    env=env,
                    observation_space=obs_space,
                    action_space=act_space,
                    algorithm_name=meta.get("algorithm_name"),
                    author=meta.get("author") and set(meta["author"]),
                    author_email=meta.get("author_email") and set(meta["author_email"]),
                    code_permalink=meta.get("code_permalink"),
                    description=meta.get("description") or f"exported from the torchstore store {store.path.name}",
                    data_format=data_format,
                    jpeg_encoding=False,
                )
            except ValueError as exc:
                if "already exists" in str(exc):
                    raise DestinationExistsError(
                        f"the Minari dataset {dataset_id!r} already exists under {get_dataset_path()}"
                    ) from exc
                raise
        return Path(dataset.storage.data_path).parent
    finally:
        if own:
            store.close()
