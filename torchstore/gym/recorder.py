"""Recording gymnasium environments into a store, one episode per ``terminated or truncated``.

Each row is one step: ``obs`` (the observation the action was taken in), ``action``,
``reward``, ``terminated``, ``truncated``, ``done`` (either flag) and ``next/obs`` (the
observation the step returned), with observation and action columns declared from the
env's spaces (:mod:`torchstore.gym.spaces`). Steps are given one at a time, without a
time axis, as the env returns them; values are converted to the column dtypes when no
information is lost (the writer's rule, :func:`~torchstore.data.file.writer.lossless_cast`).
An episode is committed when it ends, so a killed recording keeps every finished one.

The manifest records the env id, the first reset seed and, under ``metadata["gymnasium"]``,
the observation and action spaces and the env spec (``EnvSpec.to_json``, kwargs
included), from which
:meth:`TrajectoryStore.make_env <torchstore.data.store.store.TrajectoryStore.make_env>` rebuilds
the env. Each episode's metadata holds its reset seed (None when the reset was not seeded)
and, for vector envs, the sub-env (``stream``) it came from.

Examples:
    >>> import gymnasium as gym
    >>> record(gym.make("CartPole-v1"), None, episodes=3, path="cartpole.h5", seed=0)
    PosixPath('cartpole.h5')
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError, EpisodeError
from torchstore.gym.spaces import flatten_value, space_columns, space_to_json, take
from torchstore.validation import positive_int

__all__ = [
    "EpisodeRecorder",
    "RecordEpisodes",
    "RecordVectorEpisodes",
    "record",
    "env_spec_metadata",
]

OBS, ACTION, NEXT_OBS = "obs", "action", "next/obs"


def env_spec_metadata(spec: Any) -> dict[str, Any]:
    """What the manifest keeps of a gymnasium ``EnvSpec``: its JSON and its kwargs."""
    if spec is None:
        return {}
    meta: dict[str, Any] = {"id": spec.id}
    try:
        meta["env_spec"] = spec.to_json()
    except (ValueError, TypeError) as exc:
        warnings.warn(
            f"the spec of {spec.id!r} cannot be written as JSON ({exc}); only its id is recorded",
            stacklevel=3,
        )
    try:
        json.dumps(spec.kwargs, allow_nan=False)
        meta["kwargs"] = dict(spec.kwargs)
    except (TypeError, ValueError):
        pass
    return meta


def _quantised(
    columns: list[ColumnSpec], space: Any, quantize: Mapping[str, Any]
) -> list[ColumnSpec]:
    """``columns`` with the uint8 quantisation ``quantize`` asks for."""
    from torchstore.data.quantize import Quantize
    from torchstore.gym.spaces import leaf_space

    names = {c.name for c in columns}
    unknown = sorted(set(quantize) - names)
    if unknown:
        raise ColumnError(
            f"quantize names {unknown}, which are not observation columns; they are {sorted(names)}"
        )
    out = []
    for c in columns:
        q = quantize.get(c.name)
        if isinstance(q, str) and q == "bounds":
            box = leaf_space(space, c.name.split("/")[1:])
            low, high = (
                np.asarray(getattr(box, "low", np.nan)),
                np.asarray(getattr(box, "high", np.nan)),
            )
            if not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise ColumnError(
                    f"column '{c.name}' has no finite bounds to quantise to; give a Quantize(low, "
                    "high)"
                )
            q = Quantize(float(low.min()), float(high.max()))
        elif q is not None and not isinstance(q, Quantize):
            raise ColumnError(
                f"quantize['{c.name}'] must be a Quantize or \"bounds\", got {q!r:.80}"
            )
        out.append(ColumnSpec(c.name, c.dtype, c.shape, q) if q is not None else c)
    return out


def _encoded(columns: list[ColumnSpec], codecs: Mapping[str, Any]) -> list[ColumnSpec]:
    """``columns`` with the frame codecs ``codecs`` asks for (camera observations)."""
    names = {c.name for c in columns}
    unknown = sorted(set(codecs) - names)
    if unknown:
        raise ColumnError(
            f"codecs names {unknown}, which are not observation columns; they are {sorted(names)}"
        )
    return [
        ColumnSpec(c.name, c.dtype, c.shape, c.quantize, codec=codecs[c.name])
        if c.name in codecs
        else c
        for c in columns
    ]


class EpisodeRecorder:
    """Steps of one or more episode streams in, committed episodes out.

    Args:
        path: the store to write.
        observation_space: the (single) observation space.
        action_space: the (single) action space.
        streams: how many independent episode streams (sub-envs) feed it.
        spec: the env's ``EnvSpec`` (for the manifest and ``make_env``), or None.
        reward_dtype: the reward column's dtype; gymnasium rewards are float64.
        quantize: observation columns to keep as uint8 codes (``{"obs": Quantize(0, 1)}``,
            or ``"bounds"`` for the Box's own finite bounds); applies to ``next/`` too.
        codecs: camera observation columns (``uint8 [H, W, C]``) to keep encoded on disk,
            ``{"obs/pixels": "av1"}`` (a kind name or a ``FrameCodec``; see
            docs/cameras.md); applies to ``next/`` too. Frames are encoded on background
            threads while the env steps.
        metadata: extra manifest metadata.
        overwrite: replace an existing store.

    The store file is created at the first :meth:`reset`, so the manifest records the
    first reset's seed.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        observation_space: Any,
        action_space: Any,
        *,
        streams: int = 1,
        spec: Any = None,
        reward_dtype: Any = "float64",
        quantize: Mapping[str, Any] | None = None,
        codecs: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ):
        self.path = Path(path)
        self.observation_space, self.action_space = observation_space, action_space
        obs = _quantised(space_columns(OBS, observation_space), observation_space, quantize or {})
        obs = _encoded(obs, codecs or {})
        self.columns: list[ColumnSpec] = [
            *obs,
            *space_columns(ACTION, action_space),
            ColumnSpec("reward", reward_dtype),
            ColumnSpec("terminated", "bool"),
            ColumnSpec("truncated", "bool"),
            ColumnSpec("done", "bool"),
            *(
                ColumnSpec(f"next/{c.name}", c.dtype, c.shape, c.quantize, codec=c.codec)
                for c in obs
            ),
        ]
        self._shapes = {c.name: c.shape for c in self.columns}
        self._spec = spec
        self._metadata = dict(metadata or {})
        self._overwrite = overwrite
        self._writer = None
        self._current: list[dict[str, Any] | None] = [None] * streams
        self._rows: list[list[dict[str, Any]]] = [[] for _ in range(streams)]
        self._seeds: list[int | None] = [None] * streams
        self.episodes = 0

    # ------------------------------------------------------------------ streams
    def reset(self, stream: int, observation: Any, seed: int | None = None) -> None:
        """Start an episode on ``stream`` (an unfinished one there is dropped)."""
        if self._writer is None:
            self._open(seed)
        self._current[stream] = self._flat(OBS, self.observation_space, observation)
        self._rows[stream] = []
        self._seeds[stream] = None if seed is None else int(seed)

    def step(
        self,
        stream: int,
        action: Any,
        observation: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
    ) -> int | None:
        """Record one step; returns the episode number committed when it ended the episode."""
        current = self._current[stream]
        if current is None:
            raise EpisodeError(
                f"step() on stream {stream} before reset(): the first observation is unknown"
            )
        nxt = self._flat(OBS, self.observation_space, observation)
        terminated, truncated = bool(terminated), bool(truncated)
        row = {**current, **self._flat(ACTION, self.action_space, action)}
        row["reward"] = self._leaf("reward", reward)
        row["terminated"], row["truncated"] = np.bool_(terminated), np.bool_(truncated)
        row["done"] = np.bool_(terminated or truncated)
        row.update({f"next/{k}": v for k, v in nxt.items()})
        self._rows[stream].append(row)
        self._current[stream] = nxt
        if not (terminated or truncated):
            return None
        return self._commit(stream)

    def _commit(self, stream: int) -> int:
        rows = self._rows[stream]
        batch = {name: np.stack([r[name] for r in rows]) for name in self._shapes}
        meta: dict[str, Any] = {"seed": self._seeds[stream]}
        if len(self._rows) > 1:
            meta["stream"] = stream
        episode = self._writer.add_episode(batch, meta)
        self._rows[stream], self._current[stream], self._seeds[stream] = [], None, None
        self.episodes += 1
        return episode

    def _flat(self, prefix: str, space: Any, value: Any) -> dict[str, Any]:
        return {k: self._leaf(k, v) for k, v in flatten_value(prefix, space, value).items()}

    def _leaf(self, name: str, value: Any) -> np.ndarray:
        array = np.asarray(value)
        shape = self._shapes[name]
        if array.shape != shape:
            if array.size == 1 and int(np.prod(shape, dtype=np.int64)) == 1:
                array = array.reshape(shape)  # np.array([r]) for a scalar reward
            else:
                raise ColumnError(
                    f"column '{name}' expects one step of shape {list(shape)}, got "
                    f"{list(array.shape)}"
                )
        return array

    # ------------------------------------------------------------------ lifetime
    def _open(self, seed: int | None) -> None:
        from torchstore.data.file.writer import TrajectoryStoreWriter

        gym_meta = {
            **env_spec_metadata(self._spec),
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
        }
        metadata = {**self._metadata, "gymnasium": gym_meta}
        self._writer = TrajectoryStoreWriter(
            self.path,
            self.columns,
            env_id=None if self._spec is None else self._spec.id,
            seed=None if seed is None else int(seed),
            metadata=metadata,
            overwrite=self._overwrite,
        )

    def close(self) -> None:
        """Close the store; unfinished episodes are dropped."""
        if self._writer is not None:
            self._writer.close()

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()


def _recorder(env: Any, path: Any, streams: int, **kwargs: Any) -> EpisodeRecorder:
    single = streams > 1 or hasattr(env, "single_observation_space")
    obs_space = env.single_observation_space if single else env.observation_space
    act_space = env.single_action_space if single else env.action_space
    spec = getattr(env, "spec", None)
    if spec is None and single:
        try:
            spec = env.get_attr("spec")[0]
        except Exception:  # noqa: BLE001 - a vector env without get_attr records no spec
            spec = None
    return EpisodeRecorder(path, obs_space, act_space, streams=streams, spec=spec, **kwargs)


def _wrapper_base():
    import gymnasium

    return gymnasium.Wrapper


class RecordEpisodes(_wrapper_base()):
    """A ``gymnasium.Wrapper`` that records every episode the env plays into a store.

    Args:
        env: the env to record.
        path: the store file to write (created at the first ``reset``).
        reward_dtype: the reward column's dtype (default float64, gymnasium's).
        metadata: extra manifest metadata.
        overwrite: replace an existing store.

    ``close()`` closes the store; an episode still running then is dropped.

    Examples:
        >>> env = RecordEpisodes(gym.make("CartPole-v1"), "cartpole.h5")
        >>> obs, info = env.reset(seed=0)
    """

    def __init__(self, env: Any, path: str | os.PathLike, **kwargs: Any):
        super().__init__(env)
        self.recorder = _recorder(env, path, 1, **kwargs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.recorder.reset(0, obs, seed)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.recorder.step(0, action, obs, reward, terminated, truncated)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self.recorder.close()
        finally:
            super().close()


def record(
    env: Any,
    policy: Callable[[Any], Any] | None,
    episodes: int,
    path: str | os.PathLike,
    *,
    seed: int | None = None,
    **kwargs: Any,
) -> Path:
    """Play ``episodes`` episodes of ``env`` with ``policy`` and record them into ``path``.

    Args:
        env: a ``gymnasium.Env``, or a vector env (each sub-env is its own episode stream;
            every autoreset mode is handled).
        policy: ``policy(observation) -> action`` (batched for a vector env); None samples
            the action space.
        episodes: finished episodes to record (episodes still running at the end are dropped).
        path: the store file to write.
        seed: the first reset's seed (a vector env seeds sub-env ``i`` with ``seed + i``).
        **kwargs: passed to :class:`EpisodeRecorder` (``reward_dtype``, ``metadata``,
            ``overwrite``).

    Returns:
        The store's path.
    """
    episodes = positive_int("episodes", episodes, error=EpisodeError)
    policy = policy or (lambda _obs: env.action_space.sample())
    if hasattr(env, "num_envs") and hasattr(env, "single_observation_space"):
        return _record_vector(env, policy, episodes, path, seed, kwargs)
    recorder = _recorder(env, path, 1, **kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        recorder.reset(0, obs, seed)
        while recorder.episodes < episodes:
            action = policy(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            recorder.step(0, action, obs, reward, terminated, truncated)
            if (terminated or truncated) and recorder.episodes < episodes:
                obs, _ = env.reset()
                recorder.reset(0, obs)
    except BaseException:
        recorder.close()
        raise
    recorder.close()
    return Path(path)


class _VectorStreams:
    """Turns a vector env's batched resets and steps into per-sub-env episode streams.

    Handles every gymnasium autoreset mode: NEXT_STEP (the step after an end only resets
    that sub-env: it is not a step of any episode), SAME_STEP (the final observation is in
    ``info["final_obs"]``, the returned one already starts the next episode) and DISABLED
    (the caller resets ended sub-envs, with ``reset_mask``).
    """

    def __init__(self, env: Any, recorder: EpisodeRecorder):
        from gymnasium.vector import AutoresetMode

        self.n = env.num_envs
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        self.modes = AutoresetMode
        self.recorder = recorder
        self._restart = np.zeros(self.n, dtype=bool)

    def reset(self, obs: Any, seed: int | None, mask: Any = None) -> None:
        for i in range(self.n):
            if mask is None or mask[i]:
                self.recorder.reset(i, take(obs, i), None if seed is None else seed + i)
                self._restart[i] = False

    def step(
        self, actions, obs, rewards, terms, truncs, info, *, limit: int | None = None
    ) -> np.ndarray:
        """Record one batched step; returns which sub-envs ended an episode."""
        ended = np.zeros(self.n, dtype=bool)
        for i in range(self.n):
            if self._restart[i]:
                self.recorder.reset(i, take(obs, i))
                continue
            final = take(obs, i)
            done = bool(terms[i] or truncs[i])
            if done and self.mode == self.modes.SAME_STEP:
                final = take(info["final_obs"], i)
            self.recorder.step(i, take(actions, i), final, rewards[i], terms[i], truncs[i])
            ended[i] = done
            if done and self.mode == self.modes.SAME_STEP:
                self.recorder.reset(i, take(obs, i))
            if limit is not None and self.recorder.episodes >= limit:
                break
        self._restart = ended if self.mode == self.modes.NEXT_STEP else np.zeros(self.n, dtype=bool)
        return ended


def _vector_wrapper_base():
    import gymnasium

    return gymnasium.vector.VectorWrapper


class RecordVectorEpisodes(_vector_wrapper_base()):
    """A ``gymnasium.vector.VectorWrapper`` recording each sub-env as its own episode stream.

    Arguments as :class:`RecordEpisodes`. Episodes are committed as each sub-env ends
    one; each episode's metadata names its sub-env (``stream``) and reset seed
    (``seed + i`` for sub-env ``i`` of a seeded reset, None after an autoreset).
    """

    def __init__(self, env: Any, path: str | os.PathLike, **kwargs: Any):
        super().__init__(env)
        self.recorder = _recorder(env, path, env.num_envs, **kwargs)
        self._streams = _VectorStreams(env, self.recorder)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        mask = (options or {}).get("reset_mask")
        self._streams.reset(obs, seed if isinstance(seed, int) else None, mask)
        return obs, info

    def step(self, actions: Any):
        obs, rewards, terms, truncs, info = self.env.step(actions)
        self._streams.step(actions, obs, rewards, terms, truncs, info)
        return obs, rewards, terms, truncs, info

    def close(self, **kwargs: Any) -> None:
        try:
            self.recorder.close()
        finally:
            super().close(**kwargs)


def _record_vector(env, policy, episodes, path, seed, kwargs) -> Path:
    recorder = _recorder(env, path, env.num_envs, **kwargs)
    streams = _VectorStreams(env, recorder)
    try:
        obs, _ = env.reset(seed=seed)
        streams.reset(obs, seed)
        while recorder.episodes < episodes:
            actions = policy(obs)
            obs, rewards, terms, truncs, info = env.step(actions)
            ended = streams.step(actions, obs, rewards, terms, truncs, info, limit=episodes)
            if (
                streams.mode == streams.modes.DISABLED
                and ended.any()
                and recorder.episodes < episodes
            ):
                obs, _ = env.reset(options={"reset_mask": ended})
                streams.reset(obs, None, ended)
    except BaseException:
        recorder.close()
        raise
    recorder.close()
    return Path(path)
