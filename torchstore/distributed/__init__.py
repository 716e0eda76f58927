"""Beyond one machine on Ray: a replay buffer served from a Ray actor, and collector actors
that feed it and write shards of their own (read together as a :class:`~torchstore.StoreSet`).

Ray is an optional extra (``pip install -e ".[ray]"``); only this package imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.distributed.ray_replay import (
        ShardCollector,
        init_local_ray,
        serve_replay,
        start_collectors,
    )
    from torchstore.errors import RayUnavailableError

_EXPORTS = {
    "RayUnavailableError": "torchstore.errors",
    "ShardCollector": "torchstore.distributed.ray_replay",
    "init_local_ray": "torchstore.distributed.ray_replay",
    "serve_replay": "torchstore.distributed.ray_replay",
    "start_collectors": "torchstore.distributed.ray_replay",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "RayUnavailableError",
    "ShardCollector",
    "init_local_ray",
    "serve_replay",
    "start_collectors",
]
