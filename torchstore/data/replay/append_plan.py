"""Append plans: the compiled fast path of :class:`~torchstore.data.replay.ring.StoreReplay`'s
appends.

Once a write's leaf structure has been validated (``_validate`` in
:mod:`torchstore.data.replay.ring_columns` keeps a plan for it), repeats of that structure at the
ring's cursor skip the general write path: :class:`_AppendPlan` checks the TensorDict against
the structure, and the row kernel (:func:`torchstore.data.rows.rowcopy.append_rows`) checks the
cursor, copies every column into the packed block and reports the rows that end an episode, in
one pass. ``_append_planned`` (:mod:`torchstore.data.replay.writes`) runs the plans and
updates the episode index. A plan reads the ring's ``_packed``, ``_end_names``, ``_width``
and ``max_size``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchstore.data.replay.batches import _INDEX_KEY
from torchstore.data.rows.packed import row_kernels


class _AppendPlan:
    """How a write with a validated leaf structure is appended in one compiled pass.

    Made from the trusted leaf signature (see ``StoreReplay._validate``) of a CPU ring
    whose columns sit in one packed block, with the row kernels on: the keys of the
    TensorDict, nested as written, and for each leaf its dtype, per-row shape and device,
    which a later write must match exactly (so only a validated structure reaches the
    kernel), where its column's bytes sit in a block row, and the address table and
    end-row buffers the kernel (:func:`torchstore.data.rows.rowcopy.append_rows`) reuses from
    write to write. A leaf the kernel cannot read as bytes (strided within a row, a
    negative view, one needing grad) sends the write to the general path.
    """

    __slots__ = (
        "signature",
        "dims",
        "nodes",
        "table",
        "words",
        "end_rows",
        "counts",
        "stops",
        "lead",
        "kernel",
    )

    def __init__(
        self, signature: tuple, nodes: list, places: list, end_rows: list, envs: int
    ) -> None:
        self.signature = signature
        self.dims = signature[0]
        self.nodes = nodes
        self.table = np.zeros((len(places), 5), dtype=np.int64)
        self.table[:, 3:] = places
        self.words = memoryview(self.table.reshape(-1))
        self.end_rows = np.array(end_rows, dtype=np.int64)
        self.counts = np.zeros(envs, dtype=np.int64)
        self.stops = np.zeros((envs, 0), dtype=np.int64)
        self.lead: tuple[int, ...] = ()  # the written chunk's leading dims
        self.kernel = row_kernels().append_rows

    @staticmethod
    def make(replay: Any, dims: int, signature: tuple) -> _AppendPlan | None:
        packed = replay._packed
        if (
            packed is None
            or row_kernels() is None
            or len(packed.blocks) != 1
            or packed.device.type != "cpu"
            or not packed.blocks[0].is_contiguous()
        ):
            return None
        columns = packed._byte_columns
        entries: list[tuple[tuple[str, ...], tuple]] = []
        places: list[tuple[int, int]] = []  # each column's byte offset and width in a row
        end_rows: list[int] = []
        for entry in signature:
            if type(entry) is str or entry[3].type != "cpu":
                return None
            name, dtype, shape, _ = entry
            column = columns.get(name)
            if column is None:
                if name != _INDEX_KEY:
                    return None
                leaf = (dtype, tuple(shape), -1, (), 0)
            else:
                if name in replay._end_names:
                    end_rows.append(len(places))
                leaf = (dtype, tuple(shape), len(places), column.inner_strides, column.itemsize)
                places.append((column.offset, column.width))
            entries.append((tuple(name.split("/")), leaf))
        if not places:
            return None
        return _AppendPlan((dims, signature), _plan_nodes(entries), places, end_rows, replay._width)

    def write(self, data: TensorDict, cursor: torch.Tensor, first: int, replay: Any) -> int:
        """Copy ``data``'s rows at time row ``first`` when it matches the plan and the
        ``cursor`` (CPU int64 ``[steps]``) is the run from ``first``; fill :attr:`counts`
        and :attr:`stops` (the end rows of each env stream). :data:`_WRITTEN`, else
        :data:`_OTHER_STRUCTURE` (``data`` does not match) or :data:`_REFUSED` (the
        kernel's checks), having written nothing."""
        steps = cursor.numel()
        envs = replay._width
        self.lead = (steps,) if self.dims == 1 else (steps, envs)
        if not self._fill(data._tensordict, self.nodes):
            return _OTHER_STRUCTURE
        if self.stops.shape[1] < steps:
            self.stops = np.zeros((envs, steps), dtype=np.int64)
        packed = replay._packed
        status = self.kernel(
            packed.blocks[0].data_ptr(),
            replay.max_size // envs,
            packed.row_bytes,
            cursor.data_ptr(),
            cursor.stride()[0] * 8,
            steps,
            first,
            envs,
            self.table,
            self.end_rows,
            self.counts,
            self.stops,
        )
        return _WRITTEN if status == 0 else _REFUSED

    def _fill(self, items: dict, nodes: list) -> bool:
        """Check a TensorDict level against the plan; set each column's address and strides."""
        if len(items) != len(nodes):
            return False
        for (key, node), (name, value) in zip(nodes, items.items()):
            if key != name:
                return False
            if type(node) is list:
                if type(value) is not TensorDict or not self._fill(value._tensordict, node):
                    return False
            elif not self._leaf(node, value):
                return False
        return True

    def _leaf(self, node: tuple, value: Any) -> bool:
        dtype, shape, row, inner, itemsize = node
        if (
            type(value) is not torch.Tensor
            or value.dtype is not dtype
            or not value.is_cpu
            or not value.shape == self.lead + shape  # (!= on a torch.Size costs 3x more)
        ):
            return False
        if row < 0:
            return True
        if value.layout is not torch.strided or value.requires_grad or value.is_neg():
            return False
        strides = value.stride()
        dims = self.dims
        if strides[dims:] != inner:
            return False
        words, base = self.words, row * 5
        words[base] = value.data_ptr()
        words[base + 1] = strides[0] * itemsize
        words[base + 2] = strides[1] * itemsize if dims == 2 else 0
        return True


#: what ``_AppendPlan.write`` answers
_WRITTEN, _OTHER_STRUCTURE, _REFUSED = range(3)
#: append plans a ring keeps (the newest validated structures)
_PLANS = 4


def _plan_nodes(entries: list[tuple[tuple[str, ...], Any]]) -> list:
    """Leaves listed in a TensorDict walk's order (key path, leaf) as nested
    ``(key, leaf or list of nodes)`` nodes, one list per TensorDict level."""
    nodes: list = []
    i = 0
    while i < len(entries):
        parts, leaf = entries[i]
        if len(parts) == 1:
            nodes.append((parts[0], leaf))
            i += 1
            continue
        j = i
        while j < len(entries) and len(entries[j][0]) > 1 and entries[j][0][0] == parts[0]:
            j += 1
        nodes.append((parts[0], _plan_nodes([(p[1:], leaf) for p, leaf in entries[i:j]])))
        i = j
    return nodes
