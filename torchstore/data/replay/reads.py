"""The read paths of :class:`~torchstore.data.replay.ring.StoreReplay`: ``get`` and its gathers.

:class:`ReplayReads` holds torchrl's ``get``: a column key returns that column over the valid
rows; row indices (ints, slices, int64 tensors, bool masks, and with ``ndim=2`` torchrl's
``(time, env)`` forms) are checked against the valid rows and gathered with one
``index_select`` of the packed blocks, then shaped as the first write was (a TensorDict, a bare
tensor, a pytree, extra row batch dims, torchrl's ``index`` entry). A full CPU ring read
with a sampler's indices takes the compiled gather of
:class:`~torchstore.data.rows.packed.PackedColumns`.
A full read (``storage[:]``; ``[:, :]`` with ``ndim=2``) is views of the rows, and of a ring of
TensorDicts a :class:`~torchstore.data.replay.live_rows.LiveRows` whose item assignment writes
the ring (torchrl's ``rb[key] = v``). ``_from_blocks`` and ``_slice`` also serve the state
dict (:mod:`torchstore.data.replay.state`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict

from torchstore.data.columns import name_from_key
from torchstore.data.replay.batches import (
    _INDEX_KEY,
    _TENSOR_COLUMN,
    _leaf_keys,
    _unstack_rows,
)
from torchstore.data.replay.compiled import _compile_disable
from torchstore.data.replay.index import (
    _index_tensor,
    _is_cpu_rows,
    _is_key,
    _torch_index,
    _wrap_int,
)
from torchstore.data.replay.live_rows import live_rows

__all__ = ["ReplayReads"]


class ReplayReads:
    """``get`` and its gathers, for :class:`StoreReplay`.

    A mixin of :class:`~torchstore.data.replay.ring.StoreReplay`, whose constructor initialises
    every attribute used here; it changes none of them. It gathers from ``_packed``, counts
    the valid time rows in ``_episodes.rows`` and the envs in ``_width``, shapes what it
    returns by the first write's layout (``_tensor_mode``, ``_treespec``, ``_row_batch``,
    ``_returns_index``: :mod:`torchstore.data.replay.writes`,
    :mod:`torchstore.data.replay.ring_columns`), catches up first when ``_shared`` or
    ``_traced_writes`` say so (``_lock``, ``_follow``: :mod:`torchstore.data.replay.shared`),
    and reads torchrl's ``device``, ``max_size`` and ``ndim``.
    """

    @_compile_disable()
    def get(self, index: Any) -> Any:
        """Rows at ``index`` (int, int64 tensor, 1-tuple, slice, numpy array, list).

        Returns a TensorDict of batch size ``len(index)`` (an int gives one row), gathered
        with one ``index_select`` of the packed rows and dequantised on the storage device.
        Indices must lie in ``[-len, len)``. On a shared ring the rows are read holding its
        lock, so they and the length checked against are one process's complete write.
        """
        lock = self._lock
        if lock is None:
            return self._read(index)
        with lock:
            return self._read(index)

    def _read(self, index: Any) -> Any:
        if self._shared is not None or self._traced_writes:
            self._follow()
        if self._packed is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        if _is_key(index):
            return self._column(index)
        if self.ndim > 1:
            return self._get_nd(index)
        if type(index) is tuple and len(index) == 1:
            index = index[0]
        n = self._episodes.rows
        if n == self.max_size and _is_cpu_rows(index) and self._packed.on_cpu:
            # Fast path (a full CPU ring, a sampler's indices): index_select checks the
            # bounds itself; anything it refuses (negative indices included) goes the
            # checked way below.
            try:
                return self._gathered(index)
            except (IndexError, RuntimeError):
                pass
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            return self._get_row(int(index), n)
        if isinstance(index, slice):
            r = range(*index.indices(n))
            if r.step == 1:
                return self._read_run(r, n)
            index = torch.arange(r.start, r.stop, r.step, dtype=torch.int64, device=self.device)
        index = _index_tensor(index, n)
        if index.ndim == 0:
            return self._get_row(int(index), n)
        return self._gather_valid(index.to(self.device), n)

    def _read_run(self, r: range, n: int) -> Any:
        """Rows ``r`` (step 1) as views; every row, as a read that takes item assignment."""
        if r.start == 0 and r.stop == n:
            return self._live_read((n,))
        return self._slice(r.start, max(r.start, r.stop))

    def _get_row(self, index: int, n: int) -> Any:
        row = _wrap_int(index, n, "index", valid=True)
        out = self._slice(row, row + 1)
        if self._treespec is not None:
            return pytree.tree_map(lambda x: x[0], out)
        return out[0]

    def _gather_valid(self, index: torch.Tensor, n: int) -> Any:
        """Rows at an int64 ``index`` of any shape, checked against the ``n`` valid rows."""
        if index.numel():
            low, high = (int(x) for x in torch.aminmax(index))
            if high >= n or low < -n:
                bad = high if high >= n else low
                raise IndexError(
                    f"index {bad} is out of range for a StoreReplay holding {n} rows "
                    f"(capacity {self.max_size}); valid indices are [-{n}, {n})"
                )
            if low < 0:
                index = torch.where(index < 0, index + n, index)
        flat = index.reshape(-1) if index.ndim > 1 else index
        out = self._from_blocks(self._packed.gather_blocks(flat), flat)
        if index.ndim > 1:
            out = out.reshape(index.shape)
        return out

    def _column(self, key: str | tuple[str, ...]) -> torch.Tensor:
        """One column over the valid rows (``[len]``; ``[time rows, n_envs]`` with ndim=2),
        as ``LazyTensorStorage.get(key)`` returns it (torchrl's ``Sequence`` unit reads it)."""
        if self._tensor_mode or self._treespec is not None:
            kind = "bare tensors" if self._tensor_mode else "pytrees"
            raise KeyError(f"this StoreReplay holds {kind}, it has no column {key!r}")
        name = name_from_key(key)
        if name == _INDEX_KEY and self._returns_index and name not in self._packed._specs:
            rows = torch.arange(len(self), device=self.device)
            value = rows // self._width
        elif name not in self._packed._specs:
            raise KeyError(
                f"StoreReplay has no column {key!r}; columns: {list(self._packed._specs)}"
            )
        else:
            value = self._slice(0, len(self)).get(key)
        if self.ndim > 1:
            return value.reshape(self._episodes.rows, self._width, *value.shape[1:])
        return value

    def _get_nd(self, index: Any) -> Any:
        """ndim=2 reads over the valid ``[time rows, n_envs]``, with torch's index rules."""
        width = self._width
        steps = self._episodes.rows
        if _is_full_slice(index):
            return self._live_read((steps, width))
        if (
            type(index) is tuple
            and len(index) == 2
            and all(
                type(i) is torch.Tensor
                and i.ndim == 1
                and not i.dtype.is_floating_point
                and i.dtype != torch.bool
                for i in index
            )
            and index[0].shape == index[1].shape
        ):
            # A sampler's (time, env) coordinates: checked, then one gather.
            t, e = (i.to(torch.int64).to(self.device) for i in index)
            if t.numel():
                for what, v, size in (("time", t, steps), ("env", e, width)):
                    low, high = (int(x) for x in torch.aminmax(v))
                    if high >= size or low < -size:
                        bad = high if high >= size else low
                        raise IndexError(
                            f"{what} index {bad} is out of range for a StoreReplay holding "
                            f"[{steps}, {width}] (time rows, envs)"
                        )
                t, e = t % max(steps, 1), e % width
            flat = t * width + e
            return self._from_blocks(self._packed.gather_blocks(flat), flat)
        grid = torch.arange(steps * width, dtype=torch.int64).reshape(steps, width)
        try:
            sel = grid[_torch_index(index)]
        except (IndexError, TypeError, ValueError) as exc:
            raise IndexError(
                f"bad index for a StoreReplay holding [{steps}, {width}] (time rows, envs): {exc}"
            ) from None
        flat = sel.reshape(-1).to(self.device)
        if self._stacked is not None:
            entries = self._packed.batch_from_blocks(self._packed.gather_blocks(flat))
            return _unstack_rows(entries, self._stacked, sel.shape)
        out = self._from_blocks(self._packed.gather_blocks(flat), flat)
        if self._tensor_mode or self._treespec is not None:
            return pytree.tree_map(lambda x: x.reshape(*sel.shape, *x.shape[1:]), out)
        return out.reshape(*sel.shape, *self._row_batch)

    def _live_read(self, lead: tuple[int, ...]) -> Any:
        """Every valid row, as views of the ring's rows shaped ``[*lead, *row batch dims]``;
        a TensorDict of them takes item assignment back into the ring
        (:mod:`torchstore.data.replay.live_rows`), as torchrl's ``rb[key] = v`` needs."""
        if self._stacked is not None:
            # a lazy stack takes no write-through: locked, so a key assigned to it raises
            # rather than being lost (in-place writes of its views change the rows, as
            # torchrl's do)
            rows = [b[: math.prod(lead)] for b in self._packed.blocks]
            return _unstack_rows(self._packed.batch_from_blocks(rows), self._stacked, lead).lock_()
        out = self._slice(0, math.prod(lead))
        if len(lead) > 1:

            def shaped(x: torch.Tensor) -> torch.Tensor:
                return x.reshape(*lead, *x.shape[1:])

            if self._tensor_mode or self._treespec is not None:
                return pytree.tree_map(shaped, out)
            out = out.reshape(*lead, *self._row_batch)
        if type(out) is not TensorDict:  # bare tensors, pytrees: views, as torchrl's
            return out
        return live_rows(out, self, lead)

    def _from_blocks(self, blocks: list[torch.Tensor], index: Any) -> Any:
        if self._tensor_mode:
            return self._packed.leaf(blocks, _TENSOR_COLUMN)
        if self._treespec is not None:
            td = self._packed.batch_from_blocks(blocks)
            leaves = [td.get(key) for key in _leaf_keys(self._packed.columns)]
            return pytree.tree_unflatten(leaves, self._treespec)
        if self._stacked is not None:  # entry columns, rebuilt as torchrl's lazy stack
            return _unstack_rows(self._packed.batch_from_blocks(blocks), self._stacked)
        if not self._returns_index:
            out = self._packed.batch_from_blocks(blocks)
        else:
            index = self._row_index(index() if callable(index) else index)
            out = self._packed.batch_from_blocks(blocks, extra={_INDEX_KEY: index})
        if self._row_batch:
            n = out.batch_size[0]
            if self._returns_index:
                index = out.pop(_INDEX_KEY)
            out.batch_size = torch.Size([n, *self._row_batch])
            if self._returns_index:
                out.set(_INDEX_KEY, index.reshape(n, *[1] * len(self._row_batch)).expand(out.shape))
        return out

    def _gathered(self, index: torch.Tensor) -> Any:
        """The rows at a 1-D index of rows, as :meth:`get` returns them; plain TensorDict
        rows through the compiled cut of :meth:`PackedColumns.gather`."""
        if self._tensor_mode or self._treespec is not None or self._row_batch:
            return self._from_blocks(self._packed.gather_blocks(index), index)
        extra = {_INDEX_KEY: self._row_index(index)} if self._returns_index else None
        return self._packed.gather(index, extra=extra)

    def _row_index(self, index: torch.Tensor) -> torch.Tensor:
        """The ``index`` leaf of rows at flat positions ``index``: torchrl's writer stores
        the time row."""
        return index // self._width if self._width > 1 else index

    def _slice(self, start: int, stop: int) -> Any:
        blocks = [b[start:stop] for b in self._packed.blocks]
        return self._from_blocks(blocks, lambda: torch.arange(start, stop, device=self.device))


def _is_full_slice(index: Any) -> bool:
    """``[:]``, ``[:, :]`` or ``[...]``: every valid row of an ``ndim=2`` ring."""
    if type(index) is not tuple:
        index = (index,)
    return (
        0 < len(index) <= 2
        and all(i is Ellipsis or (type(i) is slice and i == slice(None)) for i in index)
        and sum(i is Ellipsis for i in index) <= 1
    )
