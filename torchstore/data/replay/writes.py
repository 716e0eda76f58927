"""The write paths of :class:`~torchstore.data.replay.ring.StoreReplay`: ``set`` and what it runs.

:class:`ReplayWrites` holds torchrl's ``set`` and its three routes: the graph-safe write
inside ``torch.compile`` (``_set_traced``), the append plans of a validated structure
(``_append_planned``, :mod:`torchstore.data.replay.append_plan`) and the general path
(``_write``): cursor normalisation, appends at the ring's cursor that extend the episode index,
rows written elsewhere (which rebuild it), in-place rewrites (``rb[idx] = v``) and the
``ndim=2`` time-row layout. What the written data is turned into comes from
:mod:`torchstore.data.replay.batches`, the checks of its leaves from
:mod:`torchstore.data.replay.ring_columns`, the cursor forms from
:mod:`torchstore.data.replay.index`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch.compiler import is_compiling

from torchstore.data.replay.append_plan import _OTHER_STRUCTURE, _WRITTEN, _AppendPlan
from torchstore.data.replay.batches import (
    _TENSOR_COLUMN,
    StackedRows,
    _as_batch,
    _flat,
    _named_leaves,
    _rows_from,
)
from torchstore.data.replay.compiled import _compile_disable
from torchstore.data.replay.index import (
    _flat_rows,
    _is_int_cursor,
    _is_ring_run,
    _ring_run,
    _torch_index,
    _wrap_int,
)
from torchstore.errors import ColumnError

__all__ = ["ReplayWrites"]


class ReplayWrites:
    """``set`` and its write paths, for :class:`StoreReplay`.

    A mixin of :class:`~torchstore.data.replay.ring.StoreReplay`, whose constructor initialises
    every attribute used here. It writes rows through ``_packed`` and fixes the layout of
    the first write (``_tensor_mode``, ``_treespec``, ``_row_batch``, ``_layout_known``); it
    reads the ring's geometry and episode index (``_episodes``, ``_streams``, ``_width``,
    ``time_capacity``, ``_segments_cache``), the sharing state (``_lock``, ``_shared``,
    ``_traced_writes``, ``fill_level``, ``cursor_tensor``) and the append plans
    (``_append_plans``, ``_trusted_signature``, ``_trusted_names``). It calls
    ``_init_streams``, ``_rebuild`` and ``_end_flags`` (:mod:`torchstore.data.replay.ring`),
    ``_infer`` and ``_validate`` (:mod:`torchstore.data.replay.ring_columns`), ``_follow`` and
    ``_sync_scalars`` (:mod:`torchstore.data.replay.shared`), and torchrl's ``device``,
    ``max_size``, ``ndim``, ``initialized``, ``_compilable``, ``_set_last_cursor``,
    ``_last_cursor``, ``_last_cursor_index_value`` and ``_bump_mutation_revision``.
    """

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """Write rows at ``cursor`` (int, int64 tensor, slice, range, numpy array or list).

        With ``set_cursor`` (torchrl's writers), rows written at the cursor extend the ring
        and the episode index is updated incrementally; any other target rows are written
        and the index is rebuilt. ``set_cursor=False`` (``rb[idx] = v``) rewrites rows in
        place and rebuilds the index only if an episode-end flag of a valid row changed.

        Under ``torch.compile`` (``fullgraph=True`` included) a ``compilable=True`` ring
        takes writes of TensorDicts whose leaves match its eager writes (see
        :meth:`_set_traced`).
        """
        if is_compiling():
            self._set_traced(cursor, data, set_cursor)
        else:  # not through _set_eager's compile guard: it costs a few us a call
            self._set_now(cursor, data, set_cursor)

    def _set_traced(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        """A write inside ``torch.compile``: graph-safe tensor ops only.

        The rows go in with one ``index_copy_`` per column and the length and cursor are
        kept in the device scalars (``fill_level``, ``cursor_tensor``); the episode index,
        host-side bookkeeping, is rebuilt from the end flags by the next eager call that
        reads it (``O(capacity)`` once, fresh episode ids). Needs ``compilable=True``,
        ``ndim=1``, an int64 tensor cursor, and every column, with the leaf names, dtypes
        and per-row shapes of the ring's eager writes (the first write, which sets the
        columns, is eager): a TensorDict, or a bare tensor on a ring of bare tensors.
        """
        signature = None
        if self._packed is None:
            leaves = None
        elif self._tensor_mode:  # a ring of bare tensors: its one column
            leaves = {_TENSOR_COLUMN: data} if isinstance(data, torch.Tensor) else None
        elif (
            isinstance(data, TensorDictBase)
            and self._treespec is None
            and self._stacked is None
            and tuple(data.batch_size[1:]) == self._row_batch
        ):
            leaves = _named_leaves(data)
        else:
            leaves = None
        if leaves is not None:
            signature = (1, tuple((k, v.dtype, v.shape[1:], v.device) for k, v in leaves.items()))
        if (
            not self._compilable
            or self.ndim != 1
            or not set_cursor
            or not isinstance(cursor, torch.Tensor)
            or cursor.ndim != 1
            or signature is None
            or signature != self._trusted_signature
            or set(self._trusted_names) != set(self._packed._specs)
        ):
            # Outside fullgraph the write runs eagerly (a graph break, as torchrl's get);
            # under fullgraph=True this message is the error.
            torch._dynamo.graph_break(
                "StoreReplay.set is graph-safe only for writes at the cursor of a "
                "StoreReplay(compilable=True, ndim=1) with an int64 tensor cursor and a "
                "TensorDict holding every column with the leaves of the ring's eager writes "
                "(names, dtypes, per-row shapes; the first write is eager), or a bare tensor "
                "like the eager writes of a ring of bare tensors; write this one eagerly"
            )
            self._set_eager(cursor, data, set_cursor)
            return
        cap = self.max_size
        index = cursor.to(self.device) % cap
        packed = self._packed
        rows = packed.pack_rows({name: leaves[name].to(self.device) for name in packed._specs})
        for block, words in zip(packed.blocks, rows, strict=True):
            block.index_copy_(0, index, words)
        last = index[-1]
        self.fill_level.copy_((self.fill_level + cursor.shape[0]).clamp_max(cap))
        self.cursor_tensor.copy_((last + 1) % cap)
        self._set_last_cursor(last)
        self._traced_writes = True
        self._bump_mutation_revision()

    @_compile_disable()
    def _set_eager(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        self._set_now(cursor, data, set_cursor)

    def _set_now(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        lock = self._lock
        if lock is None:
            self._write(cursor, data, set_cursor)
            return
        with lock:  # a shared ring: catch up, write and publish as one step
            self._write(cursor, data, set_cursor)

    def _write(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        if self._shared is not None or self._traced_writes:
            self._follow()
        plans = self._append_plans
        if plans and set_cursor and self._append_planned(plans, cursor, data):
            self._sync_scalars()
            self._bump_mutation_revision()
            return
        if self.ndim > 1:
            self._set_nd(cursor, data, set_cursor)
            self._sync_scalars()
            self._bump_mutation_revision()
            return
        rows, single = self._normalise_cursor(cursor)
        batch, tensor_input = _as_batch(data, single)
        self._check_layout(tensor_input, infer=None if self.initialized else batch)
        n = batch.batch_size[0]
        count = rows[1] if isinstance(rows, tuple) else rows.numel()
        if n != count:
            raise ValueError(f"the cursor addresses {count} rows but the data holds {n}")
        if n == 0:
            return
        values, ends = self._validate(batch, n)
        if set_cursor:
            self._set_last_cursor(
                (rows[0] + rows[1] - 1) % self.max_size if isinstance(rows, tuple) else rows
            )
            self._write_with_cursor(rows, values, ends, n)
        else:
            self._rewrite(rows, values, ends)
        self._sync_scalars()
        self._bump_mutation_revision()

    @_compile_disable()
    def _patch_rows(self, rows: torch.Tensor, data: TensorDictBase) -> None:
        """Rewrite some columns of the physical rows ``rows`` in place: the item assignment
        of a full read (:mod:`torchstore.data.replay.live_rows`; torchrl's ``rb[key] = v``
        and ``rb[i, j] = v``). ``data`` is ``[len(rows), *row batch dims]``; columns it
        leaves out keep their rows (on a ring of declared columns too), keys new to an
        inferred ring become columns, and the episode index is rebuilt if an end flag of a
        valid row changes."""
        with self._guard():
            if self._shared is not None or self._traced_writes:
                self._follow()
            batch, kind = _as_batch(data, False)
            self._check_layout(kind)
            n = batch.batch_size[0]
            if n != rows.numel():
                raise ValueError(f"{rows.numel()} rows are patched with data of {n}")
            if n:
                values, ends = self._validate(batch, n, partial=True)
                self._rewrite(rows, values, ends)
            self._sync_scalars()
        self._bump_mutation_revision()

    def _append_planned(self, plans: list[_AppendPlan], cursor: Any, data: Any) -> bool:
        """Append a TensorDict with a validated leaf structure at the ring's cursor: the
        cursor checked, the end flags read and the rows copied in one compiled pass (see
        :class:`_AppendPlan`). ``False``, having changed nothing, for any other write (the
        general path then takes it, errors included)."""
        if (
            type(data) is not TensorDict
            or type(cursor) is not torch.Tensor
            or not cursor.is_cpu
            or cursor.dtype is not torch.int64
            or cursor.ndim != 1
            or self._tensor_mode
            or self._treespec is not None
            or self._row_batch
        ):
            return False
        batch = data.batch_size
        dims = len(batch)
        if dims != self.ndim or (dims == 2 and batch[1] != self._width):
            return False
        episodes = self._episodes
        if not (episodes.is_full or episodes.cursor == episodes.rows):
            return False  # the index is not in append order: the general path rebuilds it
        first, steps = episodes.cursor, batch[0]
        if steps != cursor.numel() or cursor.is_neg():
            return False
        for plan in plans:
            if plan.dims == dims:
                status = plan.write(data, cursor, first, self)
                if status != _OTHER_STRUCTURE:
                    break
        else:
            return False
        if status != _WRITTEN:
            return False
        last = first + steps - 1
        if self._compilable:
            self._set_last_cursor(last)
        else:  # torchrl's _set_last_cursor of an int, without its type dispatch
            self._last_cursor = last
            shared = self._last_cursor_index_value
            with shared.get_lock():
                shared.value = last
        counts, stops = plan.counts, plan.stops
        if plan.dims == 1:
            episodes.append_stops(stops[0, : counts[0]], steps)
            return True
        for env, stream in enumerate(self._streams):
            stream.append_stops(stops[env, : counts[env]], steps)
        self._segments_cache = None
        return True

    def _set_nd(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        """ndim=2 writes: time-row cursors (torchrl's writers) or any torch index."""
        if not set_cursor and self.initialized:
            self._rewrite_nd(cursor, data)
            return
        single = _is_int_cursor(cursor)
        batch, tensor_input = _as_batch(data, single, dims=2)
        if not self.initialized:
            self._init_streams(int(batch.batch_size[1]))
        self._check_layout(tensor_input, infer=None if self.initialized else batch.reshape(-1))
        width = self._width
        if batch.batch_size[1] != width:
            raise ColumnError(
                f"ndim=2 rows must hold {width} envs along dim 1 (the first write's), got "
                f"batch shape {list(batch.batch_size)}"
            )
        rows, _ = self._normalise_cursor(cursor)
        steps = batch.batch_size[0]
        count = rows[1] if isinstance(rows, tuple) else rows.numel()
        if steps != count:
            raise ValueError(f"the cursor addresses {count} time rows but the data holds {steps}")
        if steps == 0:
            return
        # values keep their [steps, n_envs] lead: written into the ring without a flat copy
        values, ends = self._validate(batch, steps * width, dims=2)
        if not set_cursor:
            self._rewrite(_flat_rows(self._row_tensor(rows), width), _flat(values, 2), ends)
            return
        cap = self.time_capacity
        self._set_last_cursor((rows[0] + rows[1] - 1) % cap if isinstance(rows, tuple) else rows)
        first = rows[0] if isinstance(rows, tuple) else None
        if first is None and _is_ring_run(rows, cap):
            first = int(rows[0])
        if first is not None and self._episodes.accepts_append(first):
            self._append_time_rows(first, steps, values, ends)
            return
        index = self._row_tensor(rows)
        self._packed.write(_flat_rows(index, width).to(self.device), _flat(values, 2))
        self._rebuild(rows=min(self._episodes.rows + steps, cap), cursor=(int(index[-1]) + 1) % cap)

    def _rewrite_nd(self, cursor: Any, data: Any) -> None:
        """``rb[idx] = v`` on an ndim=2 ring: any torch index of the ``[time, env]`` grid."""
        grid = torch.arange(self.max_size, dtype=torch.int64).reshape(
            self.time_capacity, self._width
        )
        try:
            sel = grid[_torch_index(cursor)]
        except (IndexError, TypeError, ValueError) as exc:
            raise IndexError(f"bad index {cursor!r} for a [time, env] ring: {exc}") from None
        batch, kind = _as_batch(data, sel.ndim == 0, dims=max(sel.ndim, 1))
        if isinstance(kind, StackedRows):
            raise ColumnError(
                f"StoreReplay(ndim={self.ndim}) does not rewrite rows of lazily stacked "
                "TensorDicts whose entries differ (in keys or shapes) in place (rb[idx] = v); "
                "write them at the cursor (rb.extend), or use a StoreReplay(ndim=1)"
            )
        rows = sel.reshape(-1)
        if tuple(batch.batch_size) != tuple(sel.shape or (1,)):
            raise ValueError(
                f"the index addresses shape {list(sel.shape)} but the data has batch "
                f"shape {list(batch.batch_size)}"
            )
        values, ends = self._validate(batch.reshape(-1), rows.numel())
        self._rewrite(rows, values, ends)

    def _append_time_rows(
        self, first: int, steps: int, values: dict[str, torch.Tensor], ends: Any
    ) -> None:
        """Time rows written at the ring's cursor: one strided copy per column, and each env
        stream's episode index appended (only the last ``time_capacity`` rows survive)."""
        cap, width = self.time_capacity, self._width
        keep = min(steps, cap)
        start = (first + steps - keep) % cap
        values = _rows_from(values, steps - keep)
        head = min(keep, cap - start)
        if head == keep:
            self._packed.write(slice(start * width, (start + keep) * width), values)
        else:
            self._packed.write(
                slice(start * width, cap * width), {k: v[:head] for k, v in values.items()}
            )
            self._packed.write(
                slice(0, (keep - head) * width), {k: v[head:] for k, v in values.items()}
            )
        if ends is None:
            flags = np.zeros((steps, width), dtype=bool)
        else:
            flags = ends.to("cpu", torch.bool).reshape(steps, width).numpy()
        for env, stream in enumerate(self._streams):
            stream.append(flags[:, env])
        self._segments_cache = None

    def _check_layout(self, mode: Any, *, infer: TensorDictBase | None = None) -> None:
        """The first write sets what reads return (its structure); later ones must match.

        ``infer``: the first write's rows, whose columns the ring takes once the layout is
        set (the end columns of lazily stacked entries depend on it); a failure there leaves
        the layout unset.
        """
        if not self._layout_known:
            if isinstance(mode, StackedRows) and self._declared is not None:
                raise ColumnError(
                    "declared columns cannot describe a lazily stacked TensorDict whose "
                    "entries differ; leave columns= out (the ring keeps one column per entry "
                    "leaf) or pad the entries to one shape"
                )
            self._tensor_mode = mode is True
            self._stacked = mode if isinstance(mode, StackedRows) else None
            self._treespec = None if isinstance(mode, (bool, tuple, StackedRows)) else mode
            self._row_batch = (
                mode if isinstance(mode, tuple) else getattr(self._stacked, "row_batch", ())
            )
            self._layout_known = True
            if infer is not None:
                try:
                    self._infer(infer)
                except BaseException:
                    self._layout_known = False
                    self._stacked = None
                    raise
            return
        if infer is not None:
            self._infer(infer)
        first = True if self._tensor_mode else (self._stacked or self._treespec or self._row_batch)
        if first is mode or (not isinstance(mode, bool) and mode == first):
            return

        def what(m: Any) -> str:
            if m is True:
                return "bare tensors"
            if isinstance(m, StackedRows):
                return m.describe()
            if isinstance(m, tuple):
                return f"TensorDicts with row batch dims {list(m)}"
            return f"the pytree {m}"

        raise ColumnError(
            f"written data must have the first write's structure: expected {what(first)}, "
            f"got {what(mode)}"
        )

    def _write_with_cursor(self, rows, values, ends, n: int) -> None:
        cap = self.max_size
        first = rows[0] if isinstance(rows, tuple) else None
        if first is None and n and _is_ring_run(rows, cap):
            first = int(rows[0])
        if first is not None and self._episodes.accepts_append(first):
            keep = min(n, cap)
            start = (first + n - keep) % cap
            self._write_run(start, _rows_from(values, n - keep))
            self._episodes.append(ends if ends is not None else torch.zeros(n, dtype=torch.bool))
            return
        # Not an append at the ring's cursor (max-value writer, a user's set()): write,
        # then grow the length as torchrl's TensorStorage does and rebuild the index.
        index = self._row_tensor(rows)
        self._packed.write(index.to(self.device), values)
        last = int(index[-1])
        self._rebuild(rows=min(len(self) + n, cap), cursor=(last + 1) % cap)

    def _rewrite(self, rows, values, ends) -> None:
        index = self._row_tensor(rows)
        before = None
        if ends is not None and index.numel():
            valid = index.cpu() < len(self)
            before = (self._end_flags(index), valid)
        self._packed.write(index.to(self.device), values)
        if before is not None:
            old, valid = before
            if bool(((old != self._end_flags(index)) & valid).any()):
                self._rebuild(rows=self._episodes.rows, cursor=self._episodes.cursor)

    def _write_run(self, start: int, values: Mapping[str, torch.Tensor]) -> None:
        n = next(iter(values.values())).shape[0]
        head = min(n, self.max_size - start)
        if head == n:
            self._packed.write(slice(start, start + n), values)
            return
        self._packed.write(slice(start, start + head), {k: v[:head] for k, v in values.items()})
        if head < n:
            self._packed.write(slice(0, n - head), {k: v[head:] for k, v in values.items()})

    def _normalise_cursor(self, cursor: Any) -> tuple[tuple[int, int] | torch.Tensor, bool]:
        """``(first, n)`` for a contiguous run, or an int64 index tensor; and single-row."""
        cap = self.time_capacity
        run = _ring_run(cursor, cap)
        if run is not None:
            return run, False
        if isinstance(cursor, tuple) and len(cursor) == 1:
            cursor = cursor[0]
        if isinstance(cursor, (int, np.integer)) and not isinstance(cursor, bool):
            return (_wrap_int(int(cursor), cap, "cursor"), 1), True
        if (
            isinstance(cursor, torch.Tensor)
            and cursor.ndim == 0
            and not cursor.dtype.is_floating_point
        ):
            return (_wrap_int(int(cursor), cap, "cursor"), 1), True
        if isinstance(cursor, (slice, range)):
            r = range(*cursor.indices(cap)) if isinstance(cursor, slice) else cursor
            if r.step == 1 and len(r) and 0 <= r.start and r.stop <= cap:
                return (r.start, len(r)), False
            cursor = torch.as_tensor(list(r), dtype=torch.int64)
        if isinstance(cursor, tuple):
            raise IndexError(f"StoreReplay is 1-D; got a {len(cursor)}-element tuple cursor")
        index = torch.as_tensor(cursor)
        if index.dtype == torch.bool:
            index = torch.nonzero(index.reshape(-1)).reshape(-1)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.ndim != 1:
            raise IndexError(
                f"cursor must be 1-D integers, got {index.dtype} of shape {list(index.shape)}"
            )
        index = index.to(torch.int64)
        if index.numel() and (int(index.min()) < -cap or int(index.max()) >= cap):
            raise IndexError(
                f"cursor rows must lie in [0, {cap}), got {index.min()}..{index.max()}"
            )
        return index % cap, False

    def _row_tensor(self, rows) -> torch.Tensor:
        if isinstance(rows, tuple):
            first, n = rows
            return (first + torch.arange(n, dtype=torch.int64)) % self.time_capacity
        return rows
