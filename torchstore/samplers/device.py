"""The device path: sampling that never waits for the host.

On a GPU the cost of sampling is kernel launches and host round trips, not bytes. Every
function here is branch-free tensor code with fixed shapes: no ``.item()``, ``.tolist()``,
``nonzero``, boolean masking or Python branches on tensor values. The ring's fill level
comes from the storage's 0-d device tensor ``fill_level`` (which ``extend`` updates), and
randomness from a :class:`~torchstore.samplers.philox.PhiloxStream` whose position lives on
the device. So a training step that calls :func:`sample_into` can be compiled with
``torch.compile(fullgraph=True)`` or captured once in a CUDA graph and replayed: each replay
draws new indices, and rows added between replays are sampleable without recapture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.data.packed import PackedColumns
from torchstore.errors import EmptyStorageError
from torchstore.samplers.philox import PhiloxStream
from torchstore.samplers.prioritized import PrioritizedSampler
from torchstore.samplers.uniform import storage_device

__all__ = ["PhiloxSampler", "sample_into", "empty_batch", "update_priority_"]

_STATE_FILE = "philox_sampler.pt"


def _fill_level(storage: Any) -> Tensor:
    level = getattr(storage, "fill_level", None)
    if level is None:
        raise TypeError(
            f"{type(storage).__name__} has no device fill level; the device path needs a "
            "StoreReplay or a ResidentStore"
        )
    return level


class PhiloxSampler(Sampler):
    """Uniform sampling from a counter-based Philox stream on the storage's device.

    A torchrl ``Sampler``: ``ReplayBuffer(storage=StoreReplay(...), sampler=PhiloxSampler())``
    works as is. Its key (from ``seed``) and position live in device tensors, and each draw
    advances the position in place, so the same seed gives the same indices on CPU and CUDA
    and :func:`sample_into` with it is graph-safe. Indices are uniform on ``[0, fill level)``
    by 64-bit multiply-shift (bias below ``n / 2**64``).

    Args:
        seed: the stream's key.
        stream: an independent sub-stream (rank, worker); streams never overlap.
        device: where the state lives; ``None`` follows the storage.

    Examples:
        >>> from torchrl.data import ReplayBuffer
        >>> from torchstore.data.replay import StoreReplay
        >>> rb = ReplayBuffer(storage=StoreReplay(100), sampler=PhiloxSampler(seed=1))
    """

    def __init__(self, *, seed: int = 0, stream: int = 0, device: torch.device | str | None = None):
        self.philox = PhiloxStream(seed, stream, "cpu" if device is None else device)
        self._follow_device = device is None

    def _follow(self, storage: Any) -> None:
        if self._follow_device:
            device = storage_device(storage)
            if device != self.philox.device:
                self.philox.to(device)

    def draw(self, storage: Any, batch_size: int) -> Tensor:
        """``batch_size`` indices in ``[0, storage.fill_level)``: graph-safe, no checks."""
        return self.philox.randint(batch_size, _fill_level(storage))

    def sample(self, storage: Any, batch_size: int) -> tuple[Tensor, dict]:
        if len(storage) == 0:
            raise EmptyStorageError("Cannot sample from an empty storage: PhiloxSampler needs rows")
        self._follow(storage)
        level = getattr(storage, "fill_level", None)
        high = level if level is not None else torch.tensor(len(storage), device=self.philox.device)
        return self.philox.randint(batch_size, high), {}

    def _empty(self) -> None:
        """Emptying the buffer keeps the stream's position (no index is ever reused)."""

    def state_dict(self) -> dict[str, Any]:
        return {"philox": self.philox.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.philox.load_state_dict(state_dict["philox"])

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / _STATE_FILE)

    def loads(self, path: str | Path) -> None:
        self.load_state_dict(torch.load(Path(path) / _STATE_FILE, weights_only=True))

    def __repr__(self) -> str:
        return f"PhiloxSampler(seed={self.philox.seed}, stream={self.philox.stream}, device={self.philox.device})"


def _draw_prioritized(sampler: PrioritizedSampler, storage: Any, batch_size: int) -> tuple[Tensor, Tensor]:
    philox = getattr(sampler, "philox", None)
    if philox is None:
        raise TypeError(
            "the device path draws a PrioritizedSampler's uniforms from a Philox stream: "
            "build it with PrioritizedSampler(capacity, philox=PhiloxStream(seed, device=...))"
        )
    count = _fill_level(storage)
    tree = sampler.tree
    u = philox.uniform(batch_size, dtype=tree.dtype)
    # Priorities are only ever set for written rows (torchrl marks each write), so no leaf
    # past the fill level holds mass and the whole tree can be descended; the clamp keeps
    # an index valid even if that assumption is broken.
    index, value, _ = tree.sample_whole(u)
    index = torch.minimum(index, (count - 1).clamp(min=0))
    p_min = tree.min_whole()
    # beta is read at trace time: under torch.compile a new beta recompiles; a captured
    # graph keeps the beta it was captured with.
    weight = torch.pow(value / p_min, -sampler.beta).to(torch.float32)
    return index, weight


@torch.no_grad()
def update_priority_(sampler: PrioritizedSampler, index: Tensor, priority: Tensor) -> None:
    """Graph-safe batched priority update (no validation; priorities must be finite, >= 0).

    The eager ``sampler.update_priority`` validates on the host; this one is for compiled or
    captured training steps. Duplicates: the last occurrence wins, as there.
    """
    sampler.write_priorities(index.reshape(-1), priority.reshape(-1))


def empty_batch(storage: Any, batch_size: int, *, raw: bool = False) -> TensorDict:
    """A preallocated batch for :func:`sample_into`, on the storage's device.

    One contiguous leaf per column (quantised columns as float, or as uint8 codes with
    ``raw=True``), plus ``index`` (int64) and ``priority_weight`` (float32).
    """
    packed: PackedColumns = storage.packed
    rows = torch.zeros(batch_size, dtype=torch.int64, device=packed.device)
    batch = packed.gather(rows, raw=raw).apply(torch.empty_like)
    batch.set("index", torch.zeros(batch_size, dtype=torch.int64, device=packed.device))
    batch.set("priority_weight", torch.ones(batch_size, dtype=torch.float32, device=packed.device))
    return batch


def sample_into(storage: Any, sampler: Sampler, out: TensorDictBase) -> TensorDictBase:
    """Draw ``len(out)`` rows with ``sampler`` and write them into ``out`` in place.

    ``storage`` is a :class:`~torchstore.data.replay.StoreReplay` or a
    :class:`~torchstore.data.resident.ResidentStore`; ``sampler`` a :class:`PhiloxSampler`
    or a :class:`PrioritizedSampler` built with ``philox=``. ``out`` is a TensorDict with
    batch size ``[B]`` holding the storage's columns (from :func:`empty_batch`, or any
    TensorDict of the right shapes; quantised columns are dequantised into float leaves or
    copied as codes into uint8 leaves), and optionally ``index`` and ``priority_weight``.

    Graph-safe: no host synchronisation, fixed shapes. Nothing is validated here (an empty
    storage draws row 0); check ``len(storage)`` before the first call.
    """
    batch_size = out.batch_size[0]
    weight = None
    if isinstance(sampler, PhiloxSampler):
        index = sampler.draw(storage, batch_size)
    elif isinstance(sampler, PrioritizedSampler):
        index, weight = _draw_prioritized(sampler, storage, batch_size)
    else:
        raise TypeError(
            f"sample_into takes a PhiloxSampler or a PrioritizedSampler, got {type(sampler).__name__}"
        )
    _gather_into(storage.packed, index, out)
    if "index" in out.keys():
        out.get("index").copy_(index)
    if weight is not None and "priority_weight" in out.keys():
        out.get("priority_weight").copy_(weight)
    return out


def _gather_into(packed: PackedColumns, index: Tensor, out: TensorDictBase) -> None:
    # One gather per dtype block, then one copy per column into the caller's leaves. (The
    # caller's buffers cannot be found from its leaves under tracing, so no gather goes
    # straight into them.)
    blocks = packed.gather_blocks(index)
    for spec in packed.columns:
        leaf = out.get(spec.key)
        leaf.copy_(packed.leaf(blocks, spec.name, raw=leaf.dtype == torch.uint8))
