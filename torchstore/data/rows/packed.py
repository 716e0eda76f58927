"""Columns held in memory as one row-major block: every column of a row, side by side.

Gathering scattered rows is the hot path of sampling. One ``index_select`` over a block
holding every column of a row costs about what the raw floor costs; gathering five
columns separately costs about 3x that, and TensorDict advanced indexing about 2.5x more
again. A second block for a lone ``done`` column still adds 10-15 % at 1M rows (its cache
misses are separate), and a 2-D gather of a few bool columns about 40 % (measured, 4096 of
1M walker rows, one thread). So the columns of every dtype share one block of machine
words: each row is the columns' bytes, widest dtype first so every column is aligned,
padded to a whole number of words. A column is a dtype view plus a strided slice of the
block, a gather is one ``index_select``, and the batch's leaves are views into it.

This module holds the layout (:class:`PackedColumns`: the slots, writes, gathers) and the
switch that lets writes and gathers take compiled kernels (:func:`row_kernels`,
:func:`gather_kernels`). Two siblings hold the rest, re-exported here:
:mod:`torchstore.data.rows.packed_plan` cuts a batch's leaves out of gathered blocks
(:class:`BatchPlan`, :func:`tensordict_of`), and :mod:`torchstore.data.rows.packed_rowcopy`
prepares a write's values for the compiled row copy.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchstore.data.columns import ColumnSpec, numpy_dtype, set_nested
from torchstore.data.rows.packed_plan import (
    BatchPlan,
    _plain_matches,  # noqa: F401 - importable from here, as before the split
    _Recipe,
    _state,  # noqa: F401 - importable from here, as before the split
    tensordict_of,
)
from torchstore.data.rows.packed_rowcopy import _ByteColumn, copy_rows
from torchstore.data.rows.recycled import RECYCLE_BYTES, RecycledBuffers

__all__ = ["PackedColumns", "PackedRows", "BatchPlan", "tensordict_of"]

# The word a block is made of: the widest of these that divides the row's byte width.
_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@dataclass(frozen=True, slots=True)
class _Slot:
    block: int
    offset: int  # in elements of the column's storage dtype, within the row
    width: int  # elements per row


class PackedColumns:
    """Fixed-capacity resident storage for a set of columns.

    Args:
        columns: the column specs (quantised columns are held as uint8 codes).
        capacity: number of rows.
        device: where the blocks live.

    Examples:
        >>> cols = [ColumnSpec("obs", torch.float32, (3,)), ColumnSpec("done", torch.bool)]
        >>> packed = PackedColumns(cols, capacity=4)
        >>> packed.blocks[0].shape, packed.blocks[0].dtype  # 13 bytes per row, padded to 16
        (torch.Size([4, 2]), torch.int64)
        >>> packed.view("obs").shape
        torch.Size([4, 3])
    """

    def __init__(
        self, columns: Iterable[ColumnSpec], capacity: int, device: torch.device | str = "cpu"
    ):
        self.columns: tuple[ColumnSpec, ...] = tuple(columns)
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.on_cpu = self.device.type == "cpu"
        self._specs = {spec.name: spec for spec in self.columns}
        self._slots: dict[str, _Slot] = {}
        itemsize = {spec.name: _itemsize(spec.storage_dtype) for spec in self.columns}
        offset = 0  # bytes
        for spec in sorted(self.columns, key=lambda s: -itemsize[s.name]):
            width = int(np.prod(spec.shape, dtype=np.int64))
            self._slots[spec.name] = _Slot(0, offset // itemsize[spec.name], width)
            offset += width * itemsize[spec.name]
        align = max(itemsize.values(), default=1)
        row_bytes = max(align, -(-offset // align) * align)
        word = next(size for size in _WORD_DTYPES if row_bytes % size == 0)
        self.row_bytes = row_bytes
        self.blocks: list[torch.Tensor] = [
            _zeros(self.capacity, row_bytes // word, _WORD_DTYPES[word], self.device)
        ]
        self._recipes = {name: self._recipe(name) for name in self._specs}
        self._words = [self._word_view(block) for block in self.blocks]
        #: memory of large CPU gathers, used again once a batch is gone (see recycled)
        self._recycled = RecycledBuffers()
        self._block_row_bytes = [block.shape[1] * block.element_size() for block in self.blocks]
        # every column's [capacity, *shape] view, made once (the blocks are never replaced)
        self._views = {
            name: self._leaf(self.blocks[self._slots[name].block], name) for name in self._specs
        }
        self._plans: dict[tuple, BatchPlan] = {}
        self._plain_plans: dict[tuple, BatchPlan] = {}  # by (names or None, raw)

    def _recipe(self, name: str) -> _Recipe:
        spec, slot = self._specs[name], self._slots[name]
        inner: list[int] = []
        step = 1
        for size in reversed(spec.shape):
            inner.append(step)
            step *= size
        inner_strides = tuple(reversed(inner))
        row_stride = self.row_bytes // _itemsize(spec.storage_dtype)
        return _Recipe(
            key=spec.key,
            block=slot.block,
            offset=slot.offset,
            shape=spec.shape,
            inner_strides=inner_strides,
            spec=spec,
            strides=(row_stride, *inner_strides),
        )

    @staticmethod
    def _word_view(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(block, 1-D view)`` when a row is a single word: a 1-D gather is much faster."""
        if block.shape[1] != 1 or not block.is_contiguous():
            return None
        return block, block.view(block.shape[0])

    def view(self, name: str) -> torch.Tensor:
        """The column's rows as a ``[capacity, *shape]`` view into its block (storage dtype)."""
        return self._views[name]

    def _leaf(self, block: torch.Tensor, name: str) -> torch.Tensor:
        spec, slot = self._specs[name], self._slots[name]
        typed = block.view(spec.storage_dtype) if block.dtype != spec.storage_dtype else block
        part = typed.narrow(1, slot.offset, slot.width)
        return part.unflatten(1, spec.shape) if spec.shape else part.select(1, 0)

    def write(self, rows: slice | torch.Tensor, values: Mapping[str, torch.Tensor]) -> None:
        """Write already-validated storage-dtype values at ``rows`` (a slice or int64 index).

        With a slice, a value may have more leading dims than one (``[time, env, ...]``):
        they are laid out row-major over the sliced rows.

        On the CPU, outside ``torch.compile`` tracing, a slice write of columns whose rows'
        bytes are contiguous goes through one compiled row-by-row copy
        (:func:`torchstore.data.rows.rowcopy.copy_rows`): a 1000-row walker chunk into a 1 M-row
        block in about 0.8x the time of a ``copy_`` per column. Other values (another
        dtype, broadcast shapes, a source inside the block, ...) take the ``copy_`` path."""
        views, device = self._views, self.device
        on_cpu = device.type == "cpu"
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(self.capacity)
            count = max(stop - start, 0)
            if on_cpu and count:
                values = self._copy_rows(start, count, values)
        for name, value in values.items():
            view = views[name]
            if not (on_cpu and value.is_cpu) and value.device != device:
                value = value.to(device, non_blocking=True)
            if isinstance(rows, slice):
                dest = view.narrow(0, start, count)
                if value.ndim > dest.ndim:  # rows given as [time, env]: one strided copy
                    dest = dest.unflatten(0, value.shape[: value.ndim - dest.ndim + 1])
                dest.copy_(value)
            else:
                view.index_copy_(0, rows, value)

    @cached_property
    def _byte_columns(self) -> dict[str, _ByteColumn]:
        """Each column's bytes within a block row (for the row-copy kernel)."""
        columns = {}
        for name, recipe in self._recipes.items():
            itemsize = _itemsize(recipe.spec.storage_dtype)
            slot = self._slots[name]
            columns[name] = _ByteColumn(
                block=slot.block,
                offset=slot.offset * itemsize,
                width=slot.width * itemsize,
                dtype=recipe.spec.storage_dtype,
                shape=tuple(recipe.shape),
                ndim=len(recipe.shape),
                inner_strides=recipe.inner_strides,
                itemsize=itemsize,
                complex=recipe.spec.storage_dtype.is_complex,
            )
        return columns

    def _copy_rows(
        self, start: int, count: int, values: Mapping[str, torch.Tensor]
    ) -> Mapping[str, torch.Tensor]:
        """Copy rows ``[start, start + count)`` of the columns the kernel can take (see
        :func:`torchstore.data.rows.packed_rowcopy.copy_rows`); returns the columns left for the
        ``copy_`` path."""
        kernels = row_kernels()
        if kernels is None:
            return values
        return copy_rows(self, kernels, start, count, values)

    def pack_rows(self, values: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Every column's ``[n, *shape]`` values laid out as the blocks' rows (new tensors).

        The bytes of each row are concatenated in slot order (padding zeroed) and read as
        the block's word: made of bit casts of fresh tensors only, so a compiled write can
        ``index_copy_`` it into a block in the block's own dtype (aot_autograd refuses
        mutating an input through a view of another dtype). ``values`` must hold every
        column in its storage dtype.
        """
        n = next(iter(values.values())).shape[0]
        pieces: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        ends = [0] * len(self.blocks)
        order = sorted(self._slots.items(), key=lambda item: (item[1].block, item[1].offset))
        for name, slot in order:
            itemsize = _itemsize(self._specs[name].storage_dtype)
            start = slot.offset * itemsize
            if start > ends[slot.block]:
                pieces[slot.block].append(self._zero_bytes(n, start - ends[slot.block]))
            raw = values[name].reshape(n, slot.width).contiguous().view(torch.uint8)
            pieces[slot.block].append(raw)
            ends[slot.block] = start + slot.width * itemsize
        rows = []
        for b, block in enumerate(self.blocks):
            if ends[b] < self.row_bytes:
                pieces[b].append(self._zero_bytes(n, self.row_bytes - ends[b]))
            rows.append(torch.cat(pieces[b], 1).view(block.dtype))
        return rows

    def _zero_bytes(self, n: int, width: int) -> torch.Tensor:
        return torch.zeros(n, width, dtype=torch.uint8, device=self.device)

    def gather_blocks(
        self, index: torch.Tensor, out: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Each block's rows at ``index``; into ``out`` when given (preallocated, no
        allocation). On the CPU one compiled, prefetching copy per block
        (:mod:`torchstore.data.rows.rowgather`); elsewhere (or for an index or ``out`` it does
        not take) one ``index_select`` per block, a block whose row is a single word
        gathered as a 1-D tensor of words (several times faster than a 2-D gather of
        one-element rows).
        """
        arrays = self._kernel_gather(index, out)
        if arrays is not None:
            return out if out is not None else [torch.from_numpy(a) for a in arrays]
        result = []
        for b, block in enumerate(self.blocks):
            dest = None if out is None else out[b]
            words = self._words[b]
            if words is not None and words[0] is block and (dest is None or dest.is_contiguous()):
                if dest is None:
                    dest = torch.index_select(words[1], 0, index).unsqueeze(1)
                else:
                    torch.index_select(words[1], 0, index, out=dest.view(dest.shape[0]))
            elif dest is None:
                if self.on_cpu and index.shape[0] * self._block_row_bytes[b] >= RECYCLE_BYTES:
                    dest = self._recycled.empty(index.shape[0], block.shape[1], block.dtype)
                    torch.index_select(block, 0, index, out=dest)
                else:
                    dest = torch.index_select(block, 0, index)
            else:
                torch.index_select(block, 0, index, out=dest)
            result.append(dest)
        return out if out is not None else result

    def _kernels_for(self, index: Any) -> Any:
        """The compiled gather kernels, where they apply to ``index``: a 1-D contiguous CPU
        int64 tensor into a block on the CPU, with kernels on and not tracing; else None."""
        if not self.on_cpu or type(index) is not torch.Tensor or index.dtype != torch.int64:
            return None
        if index.ndim != 1 or not index.is_cpu or not index.is_contiguous():
            return None
        return gather_kernels()

    def _kernel_gather(
        self, index: torch.Tensor, out: list[torch.Tensor] | None = None
    ) -> list[np.ndarray] | None:
        """The gather through the compiled CPU kernel (:mod:`torchstore.data.rows.rowgather`):
        each block's rows at ``index`` as a numpy array (``out``'s memory when given), or
        None where the kernel does not apply (another device, an index that is not a 1-D
        contiguous CPU int64 tensor, a strided ``out``, kernels off or tracing).

        Raises:
            IndexError: for an index outside the block (nothing is written).
        """
        kernels = self._kernels_for(index)
        if kernels is None:
            return None
        n = index.shape[0]
        if out is not None and not all(
            d.is_cpu and d.is_contiguous() and d.dtype == b.dtype and d.shape == (n, *b.shape[1:])
            for d, b in zip(out, self.blocks, strict=True)
        ):
            return None  # index_select's own checks and conversions apply
        rows = index.numpy()
        sources = self.block_arrays()
        arrays = []
        for b, source in enumerate(sources):
            dest = self.batch_array(b, n) if out is None else out[b].numpy()
            bad = kernels.gather_rows(source, rows, dest)
            if bad >= 0:
                raise IndexError(
                    f"row index {int(rows[bad])} is out of range for a block of "
                    f"{source.shape[0]} rows"
                )
            arrays.append(dest)
        return arrays

    def gather_column(self, index: torch.Tensor, name: str, *, raw: bool = False) -> torch.Tensor:
        """Column ``name`` at rows ``index``: a ``[len(index), *shape]`` tensor in fresh
        memory (dequantised unless ``raw``), made of that column's bytes only.

        :meth:`gather_blocks` copies whole rows, every column of them: the right gather when
        a batch returns every column of its rows, and the wrong one for an action chunk of
        50 steps from a block that also holds camera frames (50 frames' bytes per sample
        that the batch throws away). This reads the column's slice of each row only: on the
        CPU one compiled, prefetching copy (:func:`torchstore.data.rows.rowgather.
        gather_slices`), a gather of :data:`RECYCLE_BYTES` or more into recycled memory;
        elsewhere one ``index_select`` over the column's strided view.

        Raises:
            IndexError: for an index outside the block (nothing is written).
        """
        spec, slot = self._specs[name], self._slots[name]
        n = index.shape[0]
        dtype = spec.storage_dtype
        nbytes = n * slot.width * dtype.itemsize
        leaf = self._kernel_gather_column(index, name, nbytes)
        if leaf is None:
            source = self._leaf(self.blocks[slot.block], name).reshape(self.capacity, slot.width)
            if self.on_cpu and nbytes >= RECYCLE_BYTES:
                leaf = self._recycled.empty(n, slot.width, dtype)
                torch.index_select(source, 0, index, out=leaf)
            else:
                leaf = torch.index_select(source, 0, index)
        leaf = leaf.view(n, *spec.shape)
        if spec.quantize is not None and not raw:
            leaf = spec.quantize.decode(leaf, spec.dtype)
        return leaf

    def gather_columns(
        self, index: torch.Tensor, names: Iterable[str], *, raw: bool = False
    ) -> dict[str, torch.Tensor]:
        """Columns ``names`` at rows ``index``, each ``[len(index), *shape]`` (dequantised
        unless ``raw``), read the cheaper way: when they hold at least half a row's bytes,
        the whole rows in one :meth:`gather_blocks` (their leaves are views into it; one
        pass over the rows beats one per column), else each column's own bytes
        (:meth:`gather_column`), so the columns a batch does not return are never read."""
        names = tuple(names)
        wanted = sum(self.column_bytes(name) for name in names)
        if 2 * wanted >= self.row_bytes and index.numel():
            blocks = self.gather_blocks(index)
            return {name: self.leaf(blocks, name, raw=raw) for name in names}
        return {name: self.gather_column(index, name, raw=raw) for name in names}

    def column_bytes(self, name: str) -> int:
        """Bytes one row of column ``name`` takes in its block (storage dtype)."""
        return self._slots[name].width * self._specs[name].storage_dtype.itemsize

    def _kernel_gather_column(
        self, index: torch.Tensor, name: str, nbytes: int
    ) -> torch.Tensor | None:
        """:meth:`gather_column`'s copy through the compiled kernel, as ``[n, width]`` of the
        column's storage dtype; None where the kernel does not apply (as
        :meth:`_kernel_gather`)."""
        kernels = self._kernels_for(index)
        if kernels is None:
            return None
        slot, dtype = self._slots[name], self._specs[name].storage_dtype
        start, width = slot.offset * dtype.itemsize, slot.width * dtype.itemsize
        # copied in the widest word that divides the slice and the row (a byte loop is
        # about 5x slower: 64 frames of 480x640x3 in 113 ms against 21 ms in int64 words)
        size = next(s for s in _WORD_DTYPES if start % s == width % s == self.row_bytes % s == 0)
        word = _WORD_DTYPES[size]
        n = index.shape[0]
        source = self.block_arrays()[slot.block].view(numpy_dtype(word))
        if nbytes >= RECYCLE_BYTES:
            dest = self._recycled.empty(n, width // size, word)
        else:
            dest = torch.empty(n, width // size, dtype=word)
        rows = index.numpy()
        bad = kernels.gather_slices(source, rows, start // size, dest.numpy())
        if bad >= 0:
            raise IndexError(
                f"row index {int(rows[bad])} is out of range for a block of {source.shape[0]} rows"
            )
        return dest.view(dtype)

    def batch_array(self, b: int, n: int) -> np.ndarray:
        """Fresh CPU memory for ``n`` rows of block ``b`` (a C-contiguous numpy array), for a
        gather to fill: a batch of :data:`RECYCLE_BYTES` or more reuses the memory of an
        earlier batch that is gone (see :mod:`torchstore.data.rows.recycled`)."""
        block = self.blocks[b]
        if n * self._block_row_bytes[b] >= RECYCLE_BYTES:
            return self._recycled.empty(n, block.shape[1], block.dtype).numpy()
        return np.empty((n, block.shape[1]), dtype=numpy_dtype(block.dtype))

    def gather_leaves(self, index: torch.Tensor, plan: BatchPlan) -> dict:
        """``plan``'s nested dict of leaves at rows ``index``, in fresh memory: on the CPU
        through the gather kernel and numpy views (:meth:`BatchPlan.leaves_of_arrays`),
        else :meth:`gather_blocks` and :meth:`BatchPlan.leaves`."""
        n = index.shape[0]
        if plan.cuts_arrays:
            arrays = self._kernel_gather(index)
            if arrays is not None:
                return plan.leaves_of_arrays(arrays, n)
        return plan.leaves(self.gather_blocks(index), n, fresh=True)

    def block_arrays(self) -> list[np.ndarray] | None:
        """The blocks as numpy arrays (for compiled gathers), None off the CPU. Made again
        whenever a block's memory moved (``share_memory_`` moves it in place)."""
        if not self.on_cpu:
            return None
        cached = self.__dict__.get("_arrays")
        if cached is not None:
            pointers, arrays = cached
            for pointer, block in zip(pointers, self.blocks):
                if pointer != block.data_ptr():
                    break
            else:
                return arrays
        arrays = [block.numpy() for block in self.blocks]
        self._arrays = ([block.data_ptr() for block in self.blocks], arrays)
        return arrays

    def __getstate__(self) -> dict:
        # numpy views of the blocks are this process's memory: a copy makes its own
        state = dict(self.__dict__)
        state.pop("_arrays", None)
        return state

    def leaf(self, blocks: list[torch.Tensor], name: str, *, raw: bool = False) -> torch.Tensor:
        """One column of gathered ``blocks`` as a view (dequantised unless ``raw``)."""
        spec = self._specs[name]
        leaf = self._leaf(blocks[self._slots[name].block], name)
        if spec.quantize is not None and not raw:
            leaf = spec.quantize.decode(leaf, spec.dtype)
        return leaf

    def batch_plan(
        self,
        names: Iterable[str] | None = None,
        *,
        keys: Mapping[str, str | tuple[str, ...]] | None = None,
        unsqueeze: Iterable[str] = (),
        raw: bool = False,
    ) -> BatchPlan:
        """The precomputed cut of batches of columns ``names`` (all when ``None``), made once.

        ``keys`` maps a column to the key its leaf takes (its own key otherwise);
        ``unsqueeze`` names scalar columns whose leaf gets a trailing dimension of 1.
        """
        names = tuple(names) if names is not None else tuple(self._recipes)
        unsqueeze = frozenset(unsqueeze)
        cache_key = (names, None if keys is None else tuple(sorted(keys.items())), unsqueeze, raw)
        plan = self._plans.get(cache_key)
        if plan is None:
            plan = self._plans[cache_key] = BatchPlan(self, names, keys or {}, unsqueeze, raw)
        return plan

    def batch_from_blocks(
        self,
        blocks: list[torch.Tensor],
        *,
        raw: bool = False,
        names: Iterable[str] | None = None,
        extra: Mapping[str | tuple[str, ...], torch.Tensor] | None = None,
    ) -> TensorDict:
        """A TensorDict whose leaves are views into gathered ``blocks``; dequantised unless ``raw``.

        ``extra`` adds leaves as they are (for instance the gathered row indices). The
        TensorDict is built without re-validating leaves, which are correct by
        construction (see :func:`tensordict_of`).
        """
        n = blocks[0].shape[0] if blocks else 0
        leaves = self._plain_plan(names, raw).leaves(blocks, n)
        return self._batch(leaves, n, extra)

    def _plain_plan(self, names: Iterable[str] | None, raw: bool) -> BatchPlan:
        if names is not None and type(names) is not tuple:
            names = tuple(names)
        plan = self._plain_plans.get((names, raw))
        if plan is None:
            plan = self._plain_plans[(names, raw)] = self.batch_plan(names, raw=raw)
        return plan

    def _batch(
        self, leaves: dict, n: int, extra: Mapping[str | tuple[str, ...], torch.Tensor] | None
    ) -> TensorDict:
        if extra:
            for key, value in extra.items():
                if type(key) is str:
                    leaves[key] = value
                else:
                    set_nested(leaves, key, value)
        return tensordict_of(leaves, torch.Size([n]), self.device)

    def gather(
        self,
        index: torch.Tensor,
        *,
        raw: bool = False,
        extra: Mapping[str | tuple[str, ...], torch.Tensor] | None = None,
    ) -> TensorDict:
        """Rows at ``index`` (int64 on this device): a TensorDict of batch size
        ``[len(index)]`` in fresh memory (:meth:`gather_leaves`); ``extra`` adds leaves as
        :meth:`batch_from_blocks` does."""
        leaves = self.gather_leaves(index, self._plain_plan(None, raw))
        return self._batch(leaves, index.shape[0], extra)

    def slice(self, start: int, stop: int, *, raw: bool = False) -> TensorDict:
        """Contiguous rows ``[start, stop)`` as views (no copy unless dequantised)."""
        return self.batch_from_blocks([b[start:stop] for b in self.blocks], raw=raw)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.blocks)


def _zeros(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed block. On the CPU it comes from numpy, whose large allocations are advised
    onto transparent huge pages: random-row gathers then miss the TLB less (measured here:
    a 4096-row gather from a 104 MB block about 10% faster than from ``torch.zeros``)."""
    if device.type != "cpu":
        return torch.zeros(rows, width, dtype=dtype, device=device)
    return torch.from_numpy(
        np.zeros((rows, width), dtype=torch.empty((), dtype=dtype).numpy().dtype)
    )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def row_kernels() -> ModuleType | None:
    """:mod:`torchstore.data.rows.rowcopy` when writes may take its compiled kernels, else None.

    Kernels run outside ``torch.compile`` tracing while ``TORCHSTORE_KERNELS`` is not
    ``0``; numba is imported on the first call that takes them.
    """
    return _kernel_module("rowcopy")


def gather_kernels() -> ModuleType | None:
    """:mod:`torchstore.data.rows.rowgather` when gathers may take its compiled kernel, else
    None (the same switch as :func:`row_kernels`)."""
    return _kernel_module("rowgather")


def _kernel_module(name: str) -> ModuleType | None:
    if not _ROW_KERNELS or torch.compiler.is_compiling():
        return None
    module = _KERNEL_MODULES.get(name)
    if module is None:
        module = _KERNEL_MODULES[name] = importlib.import_module(f"torchstore.data.rows.{name}")
    return module


_KERNEL_MODULES: dict[str, ModuleType] = {}
_ROW_KERNELS = os.environ.get("TORCHSTORE_KERNELS", "1") != "0"


class PackedRows:
    """What a store view holding its rows in a :class:`PackedColumns` (``self.packed``)
    answers about them: the columns it holds and the device they live on."""

    packed: PackedColumns

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        """The columns held, in packing order."""
        return self.packed.columns

    @property
    def device(self) -> torch.device:
        """The device the rows live on."""
        return self.packed.device
