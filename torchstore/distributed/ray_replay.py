"""A :class:`~torchstore.data.replay.StoreReplay` served from a Ray actor, and collector actors.

Two patterns (the README's "Scaling out" measures both):

1. **A central buffer.** :func:`serve_replay` builds torchrl's own ``RayReplayBuffer``: a
   Ray actor holding a ``TensorDictReplayBuffer`` over a ``StoreReplay`` ring and a
   torchstore sampler. Collector actors ``extend`` it through ``buffer.client()``; the
   learner ``sample``s and ``update_tensordict_priority``s; ``dumps`` checkpoints it
   (rows to a store file) and ``serve_replay(..., resume=folder)`` starts a new actor
   from that checkpoint. Batches cross processes as TensorDicts of tensors in Ray's
   object store.
2. **No central buffer.** Each :class:`ShardCollector` also commits every finished
   episode to a shard file of its own (one writer per file); the learner reads the
   shard folder as a :class:`~torchstore.StoreSet` (``refresh()`` to follow) and samples
   it resident or through a window.

A collector actor killed mid-run loses only its open episode: every episode it committed
is in its shard, and every row it extended is in the buffer.

Examples:
    >>> init_local_ray(num_cpus=2)
    >>> buffer = serve_replay(100_000, batch_size=256)
    >>> collectors = start_collectors(buffer, "runs/shards", 2, env_name="Pendulum-v1")
    >>> ray.get([c.collect.remote(1000) for c in collectors])
    >>> batch = buffer.sample()
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from torchstore.data.columns import ColumnSpec
from torchstore.errors import RayUnavailableError, TorchstoreError
from torchstore.extras import install_hint
from torchstore.validation import positive_int

__all__ = [
    "RayUnavailableError",
    "ShardCollector",
    "init_local_ray",
    "serve_replay",
    "start_collectors",
]

#: The keys a collector keeps of torchrl's transition layout.
TRANSITION_KEYS = (
    "observation",
    "action",
    "done",
    "terminated",
    "truncated",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
)


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError(
            f"torchstore.distributed needs Ray: {install_hint('ray')} (or pip install ray)"
        ) from exc
    return ray


def init_local_ray(num_cpus: int = 2, **kwargs: Any) -> None:
    """Start a one-machine Ray cluster on loopback only, unless Ray is already initialised.

    No dashboard, no usage statistics, the node bound to 127.0.0.1 (Ray otherwise resolves
    ``127.0.0.1`` to the host's routable address), worker logs not echoed to the driver.
    """
    ray = _ray()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    ray.init(num_cpus=num_cpus, **kwargs)


def serve_replay(
    capacity: int,
    *,
    batch_size: int,
    columns: Any = None,
    sampler: str = "uniform",
    alpha: float = 0.6,
    beta: float = 0.4,
    priority_key: str = "td_error",
    num_cpus: float = 0.5,
    memory: int = 512 * 2**20,
    resume: str | os.PathLike | None = None,
):
    """A ``StoreReplay`` ring in a Ray actor, through torchrl's ``RayReplayBuffer``.

    Args:
        capacity: ring rows.
        batch_size: rows per ``sample()``.
        columns: the ring's columns (inferred from the first ``extend`` when None).
        sampler: ``"uniform"`` (:class:`~torchstore.UniformSampler`) or ``"prioritized"``
            (:class:`~torchstore.PrioritizedSampler`, priorities from ``priority_key``).
        num_cpus, memory: the actor's Ray reservation. Fractional CPUs leave room for
            collector actors on a small cluster (a whole CPU each would leave them pending
            forever on a 2-CPU machine).
        resume: a folder the buffer's ``dumps`` wrote; the new actor ``loads`` it (rows,
            episode index, ring position and priorities). torchrl's ``loads`` also restores
            the checkpoint's batch size; ``sample(n)`` draws another size.

    Returns:
        torchrl's ``RayReplayBuffer``: ``extend``, ``sample``, ``update_tensordict_priority``,
        ``dumps``, ``loads``, ``len``, ``client()`` (a handle for other actors), ``close()``.
    """
    ray = _ray()
    if not ray.is_initialized():
        init_local_ray()
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    from torchstore.data.replay.ring import StoreReplay
    from torchstore.samplers.prioritized import PrioritizedSampler
    from torchstore.samplers.uniform import UniformSampler

    capacity = positive_int("capacity", capacity)
    if sampler == "uniform":
        make_sampler = functools.partial(UniformSampler)
    elif sampler == "prioritized":
        make_sampler = functools.partial(PrioritizedSampler, capacity, alpha=alpha, beta=beta)
    else:
        raise ValueError(f"sampler ({sampler!r}) must be 'uniform' or 'prioritized'")
    if resume is not None and not Path(resume).is_dir():
        raise FileNotFoundError(
            f"no replay checkpoint folder at {resume} (it is what buffer.dumps() writes)"
        )
    buffer = RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        storage=functools.partial(StoreReplay, capacity, columns=columns),
        sampler=make_sampler,
        batch_size=batch_size,
        priority_key=priority_key,
        remote_config={"num_cpus": num_cpus, "memory": memory},
    )
    if resume is not None:
        buffer.loads(str(resume))
    return buffer


def _columns_of(rows: TensorDictBase) -> list[ColumnSpec]:
    return [
        ColumnSpec(
            "/".join(key) if isinstance(key, tuple) else key, value.dtype, tuple(value.shape[1:])
        )
        for key, value in rows.items(include_nested=True, leaves_only=True)
    ]


class ShardCollector:
    """A collector (run it as a Ray actor: :func:`start_collectors`) that extends a served
    buffer and commits each finished episode to a shard file of its own.

    Args:
        client: ``buffer.client()`` of :func:`serve_replay` (or None: shard only).
        shard: this collector's store file (None: buffer only); one writer per file.
        env_name: a gymnasium id, run through torchrl's ``GymEnv``.
        seed: the env's seed (give each collector its own).
        policy_factory: a picklable ``f(env) -> TensorDictModule`` writing ``"action"``;
            None draws random actions. :meth:`set_weights` loads the learner's weights.
        frames_per_batch: rows per torchrl collector batch.
    """

    def __init__(
        self,
        client: Any,
        shard: str | os.PathLike | None,
        *,
        env_name: str = "Pendulum-v1",
        seed: int = 0,
        policy_factory: Callable[[Any], Any] | None = None,
        frames_per_batch: int = 100,
    ):
        from torchrl.collectors import Collector
        from torchrl.envs import GymEnv

        torch.set_num_threads(1)
        self.client = client
        self.shard = None if shard is None else Path(shard)
        self.env = GymEnv(env_name)
        self.env.set_seed(seed)
        self.policy = None if policy_factory is None else policy_factory(self.env)
        self.collector = Collector(
            create_env_fn=self.env,
            policy=self.policy,
            frames_per_batch=frames_per_batch,
            total_frames=-1,
            auto_register_policy_transforms=False,
        )
        self._batches = iter(self.collector)
        self.writer = None
        self.rows = 0
        self.episodes = 0

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load the learner's policy weights (a state dict of tensors)."""
        if self.policy is None:
            raise TorchstoreError("this collector draws random actions: give it a policy_factory")
        self.policy.load_state_dict(dict(weights))

    def collect(self, frames: int) -> dict[str, int]:
        """Collect at least ``frames`` rows: extend the buffer, commit finished episodes."""
        done_frames = 0
        while done_frames < frames:
            batch = next(self._batches).reshape(-1).select(*TRANSITION_KEYS, strict=False)
            if self.client is not None:
                self.client.extend(batch)
            if self.shard is not None:
                self._write(batch)
            done_frames += batch.numel()
            self.rows += batch.numel()
        return {"rows": self.rows, "episodes": self.episodes}

    def _write(self, batch: TensorDictBase) -> None:
        from torchstore.data.file.writer import TrajectoryStoreWriter

        if self.writer is None:
            if self.shard.exists():
                self.writer = TrajectoryStoreWriter.resume(self.shard)
                self.episodes = self.writer.num_episodes
            else:
                self.writer = TrajectoryStoreWriter(self.shard, _columns_of(batch))
        ends = torch.nonzero(batch["next", "done"].reshape(-1)).reshape(-1).tolist()
        start = 0
        for end in ends:
            self.writer.append(batch[start : end + 1])
            self.writer.end_episode()
            self.episodes += 1
            start = end + 1
        if start < batch.numel():
            self.writer.append(batch[start:])  # the open episode: committed when it ends

    def stats(self) -> dict[str, int]:
        return {"rows": self.rows, "episodes": self.episodes, "pid": os.getpid()}

    def close(self) -> dict[str, int]:
        """Close the shard (the open episode is dropped) and the env."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.collector.shutdown()
        return self.stats()


def start_collectors(
    buffer: Any,
    shard_folder: str | os.PathLike | None,
    count: int,
    *,
    num_cpus: float = 0.25,
    seed: int = 0,
    **kwargs: Any,
) -> list[Any]:
    """``count`` :class:`ShardCollector` actors feeding ``buffer`` (None: shards only),
    collector ``k`` writing ``shard_folder/collector-k.h5`` with seed ``seed + k``."""
    ray = _ray()
    if shard_folder is not None:
        Path(shard_folder).mkdir(parents=True, exist_ok=True)
    actor = ray.remote(num_cpus=num_cpus)(ShardCollector)
    client = None if buffer is None else buffer.client()
    return [
        actor.remote(
            client,
            None if shard_folder is None else Path(shard_folder) / f"collector-{k}.h5",
            seed=seed + k,
            **kwargs,
        )
        for k in range(count)
    ]
