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

import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.data.rows.packed import PackedColumns
from torchstore.samplers.draws import uniform_rows
from torchstore.samplers.ere import ERE
from torchstore.samplers.prioritized import PrioritizedSampler
from torchstore.samplers.uniform import UniformSampler

__all__ = ["PhiloxSampler", "sample_into", "empty_batch", "update_priority_"]


def _fill_level(storage: Any) -> Tensor:
    level = getattr(storage, "fill_level", None)
    if level is None:
        raise TypeError(
            f"{type(storage).__name__} has no device fill level; the device path needs a "
            "StoreReplay or the ResidentStorage that TrajectoryStore.resident() returns "
            "(ResidentStorage(resident_store) wraps a ResidentStore)"
        )
    return level


class PhiloxSampler(UniformSampler):
    """Uniform sampling from the core's Philox stream: ``UniformSampler(seed=...)``.

    A torchrl ``Sampler``: ``ReplayBuffer(storage=StoreReplay(...), sampler=PhiloxSampler())``
    works as is. Its key (from ``seed``) and position live in device tensors, and each draw
    advances the position in place, so the same seed gives the same indices on CPU and CUDA,
    the same rows as every other face of the core with that seed, and :func:`sample_into`
    with it is graph-safe. Indices are uniform on ``[0, fill level)`` by 64-bit
    multiply-shift (bias below ``n / 2**64``).

    Args:
        seed: the stream's key.
        stream: an independent sub-stream (rank, worker); streams never overlap.
        device: where the state lives; ``None`` follows the storage.
        ere: an :class:`~torchstore.samplers.ERE` schedule (the newest ``c_k`` rows).

    Examples:
        >>> from torchrl.data import ReplayBuffer
        >>> from torchstore.data.replay.ring import StoreReplay
        >>> rb = ReplayBuffer(storage=StoreReplay(100), sampler=PhiloxSampler(seed=1))
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        stream: int = 0,
        device: torch.device | str | None = None,
        ere: ERE | None = None,
    ):
        super().__init__(seed=seed, stream=stream, device=device, ere=ere)

    def draw(self, storage: Any, batch_size: int) -> Tensor:
        """``batch_size`` indices in the sampleable rows: graph-safe, no checks."""
        return _draw_uniform(self, storage, batch_size)

    def _empty(self) -> None:
        """Emptying the buffer keeps the stream's position (no index is ever reused)."""

    def __repr__(self) -> str:
        p = self.philox
        return f"PhiloxSampler(seed={p.seed}, stream={p.stream}, device={p.device}, ere={self.ere})"


def _draw_uniform(sampler: UniformSampler, storage: Any, batch_size: int) -> Tensor:
    count = _fill_level(storage)
    ere = sampler.ere
    if ere is None:
        return uniform_rows(sampler.philox, batch_size, count)
    recent = ere.recent_count(count)
    capacity = storage.capacity
    start = (storage.cursor_tensor - recent) % capacity
    return uniform_rows(sampler.philox, batch_size, recent, start=start, capacity=capacity)


def _draw_prioritized(
    sampler: PrioritizedSampler, storage: Any, batch_size: int
) -> tuple[Tensor, Tensor]:
    count = _fill_level(storage)
    if sampler.ere is not None:
        recent = sampler.ere.recent_count(count)
        start = (storage.cursor_tensor - recent) % storage.capacity
        return sampler.draw(batch_size, count=recent, start=start)
    # Priorities are only ever set for written rows (torchrl marks each write), so no leaf
    # past the fill level holds mass and the whole tree can be descended; the clamp keeps
    # an index valid even if that assumption is broken.
    index, weight = sampler.draw(batch_size)
    return torch.minimum(index, (count - 1).clamp(min=0)), weight


@torch.no_grad()
def update_priority_(sampler: PrioritizedSampler, index: Tensor, priority: Tensor) -> None:
    """Graph-safe batched priority update (no validation; priorities must be finite, >= 0).

    The eager ``sampler.update_priority`` validates on the host; this one is for compiled or
    captured training steps. Duplicates: the last occurrence wins, as there.
    """
    sampler.write_priorities(index.reshape(-1), priority.reshape(-1))


def empty_batch(
    storage: Any, batch_size: int, *, raw: bool = False, packed: bool = False
) -> TensorDict:
    """A preallocated batch for :func:`sample_into`, on the storage's device.

    One leaf per column (quantised columns as float, or as uint8 codes with ``raw=True``),
    plus ``index`` (int64) and ``priority_weight`` (float32). By default each leaf is its
    own contiguous tensor. With ``packed=True`` the columns' leaves are views into one row
    block laid out as the storage's (every column of a row side by side), and eager
    :func:`sample_into` (CUDA-graph capture included) gathers the rows straight into it:
    one ``index_select`` for the whole batch, no per-column copy. Not for
    ``torch.compile``, which cannot write views of one buffer that differ in dtype; keep
    the default there. Quantised columns read as float stay their own tensors, decoded
    from the block's codes.
    """
    store: PackedColumns = storage.packed
    if not packed:
        rows = torch.zeros(batch_size, dtype=torch.int64, device=store.device)
        batch = store.gather(rows, raw=raw).apply(torch.empty_like)
    else:
        blocks = [
            torch.zeros((batch_size, *block.shape[1:]), dtype=block.dtype, device=block.device)
            for block in store.blocks
        ]
        batch = store.batch_from_blocks(blocks, raw=raw).apply(
            lambda leaf: leaf if _shares(leaf, blocks) else leaf.clone()
        )
    batch.set("index", torch.zeros(batch_size, dtype=torch.int64, device=store.device))
    batch.set("priority_weight", torch.ones(batch_size, dtype=torch.float32, device=store.device))
    return batch


def _shares(leaf: Tensor, blocks: list[Tensor]) -> bool:
    ptr = leaf.untyped_storage().data_ptr()
    return any(ptr == block.untyped_storage().data_ptr() for block in blocks)


def sample_into(storage: Any, sampler: Sampler, out: TensorDictBase) -> TensorDictBase:
    """Draw ``len(out)`` rows with ``sampler`` and write them into ``out`` in place.

    ``storage`` is a :class:`~torchstore.data.replay.ring.StoreReplay` or a
    :class:`~torchstore.data.residency.resident_storage.ResidentStorage` (``store.resident()``);
    ``sampler`` a :class:`PhiloxSampler` (or any ``UniformSampler(seed=...)``) or a
    :class:`PrioritizedSampler` built with ``seed=`` or ``philox=``; with an ERE schedule
    the draws come from the ring's newest ``c_k`` rows. The rows are those eager
    ``rb.sample`` draws from the same stream state.
    ``out`` is a TensorDict with batch size ``[B]`` holding the storage's columns (from
    :func:`empty_batch`, or any TensorDict of the right shapes; quantised columns are
    dequantised into float leaves or copied as codes into uint8 leaves), and optionally
    ``index`` and ``priority_weight``.

    Graph-safe: no host synchronisation, fixed shapes. Nothing is validated here (an empty
    storage draws row 0); check ``len(storage)`` before the first call.
    """
    batch_size = out.batch_size[0]
    weight = None
    if isinstance(sampler, UniformSampler) and sampler.philox is not None:
        index = _draw_uniform(sampler, storage, batch_size)
    elif isinstance(sampler, PrioritizedSampler):
        index, weight = _draw_prioritized(sampler, storage, batch_size)
    else:
        raise TypeError(
            "sample_into takes a PhiloxSampler (a UniformSampler with seed=) or a "
            f"PrioritizedSampler, got {type(sampler).__name__}"
        )
    _gather_into(storage.packed, index, out)
    if "index" in out.keys():
        out.get("index").copy_(index)
    if weight is not None and "priority_weight" in out.keys():
        out.get("priority_weight").copy_(weight)
    return out


def _gather_into(packed: PackedColumns, index: Tensor, out: TensorDictBase) -> None:
    # Eagerly, when ``out``'s leaves are views into row blocks laid out as the storage's
    # (``empty_batch``), the rows are gathered straight into those blocks. Otherwise (a
    # caller's own TensorDict, or under tracing, where a leaf's buffer cannot be looked
    # up): one gather per dtype block, then one copy per column into the caller's leaves.
    dest = None if torch.compiler.is_compiling() else _cached_destination(packed, out)
    if dest is not None:
        packed.gather_blocks(index, out=dest)
        for spec in packed.columns:
            leaf = out.get(spec.key)
            if spec.quantize is not None and leaf.dtype != torch.uint8:
                leaf.copy_(packed.leaf(dest, spec.name))
        return
    blocks = packed.gather_blocks(index)
    for spec in packed.columns:
        leaf = out.get(spec.key)
        leaf.copy_(packed.leaf(blocks, spec.name, raw=leaf.dtype == torch.uint8))


#: the last answer of :func:`_destination_blocks`: ``(packed, storage blocks, leaves, leaf
#: addresses)`` as weak references and values, then ``out``'s row blocks (one batch's
#: buffers stay referenced here until another batch is written)
_last_destination: list = [None]


def _cached_destination(packed: PackedColumns, out: TensorDictBase) -> list[Tensor] | None:
    """:func:`_destination_blocks`, remembered for the batch written last: a training loop
    writes the same ``out`` every step, and checking that its leaves are still the same
    tensors at the same addresses costs a fraction of finding the blocks again."""
    leaves = [out.get(spec.key) for spec in packed.columns]
    memo = _last_destination[0]
    if (
        memo is not None
        and memo[0]() is packed
        and len(memo[1]) == len(packed.blocks)
        and all(ref() is block for ref, block in zip(memo[1], packed.blocks))
        and all(ref() is leaf for ref, leaf in zip(memo[2], leaves))
        and memo[3] == [(leaf.data_ptr(), leaf.shape) for leaf in leaves]
    ):
        return memo[4]
    dest = _destination_blocks(packed, out, leaves)
    _last_destination[0] = None
    if dest is not None:
        _last_destination[0] = (
            weakref.ref(packed),
            [weakref.ref(block) for block in packed.blocks],
            [weakref.ref(leaf) for leaf in leaves],
            [(leaf.data_ptr(), leaf.shape) for leaf in leaves],
            dest,
        )
    return dest


def _destination_blocks(
    packed: PackedColumns, out: TensorDictBase, leaves: list[Tensor]
) -> list[Tensor] | None:
    """``out``'s row blocks when every stored column's leaf (``leaves``, in the order of
    ``packed.columns``) is exactly its view into one (as :func:`empty_batch` makes them),
    else ``None``."""
    n = out.batch_size[0]
    blocks: list[Tensor | None] = [None] * len(packed.blocks)
    for spec, leaf in zip(packed.columns, leaves):
        if spec.quantize is not None and leaf.dtype != torch.uint8:
            continue  # decoded from the block's codes
        b = packed._slots[spec.name].block  # noqa: SLF001 - the column's block number
        block = blocks[b]
        if block is None:
            source = packed.blocks[b]
            storage = leaf.untyped_storage()
            nbytes = n * source.shape[1] * source.element_size()
            if leaf.device != source.device or storage.nbytes() != nbytes:
                return None
            block = blocks[b] = torch.empty(0, dtype=source.dtype, device=source.device).set_(
                storage, 0, (n, source.shape[1])
            )
        want = packed.leaf(blocks, spec.name, raw=True)
        if (
            leaf.data_ptr() != want.data_ptr()
            or leaf.stride() != want.stride()
            or leaf.shape != want.shape
            or leaf.dtype != want.dtype
        ):
            return None
    if any(block is None for block in blocks):
        return None
    return blocks
