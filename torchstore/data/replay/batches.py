"""Written data as batches of columns: how :class:`~torchstore.data.replay.ring.StoreReplay` reads
what a user or torchrl hands ``set``.

Module functions, no ring state. :func:`_as_batch` turns a bare tensor, a numpy array, a list
of rows, a pytree (tuples, lists, plain dicts), a tensorclass or a TensorDict into one
TensorDict with the written rows' leading dims, and reports its kind (which fixes what reads
return: see ``_check_layout`` in :mod:`torchstore.data.replay.writes`).
:func:`_named_leaves` lists a TensorDict's leaves by column name (``("next", "obs")`` is
``next/obs``); the pytree helpers name one column per leaf. The write paths use them; the
column checks (:mod:`torchstore.data.replay.ring_columns`), the append plans
(:mod:`torchstore.data.replay.append_plan`), the reads and the state loaders also share
``_INDEX_KEY`` and ``_TENSOR_COLUMN`` from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
)
from torch.compiler import is_compiling

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError

#: torchrl's ``TensorDictRoundRobinWriter`` adds this int64 entry to every write; it is not
#: stored unless declared as a column (it always equals the physical row)
_INDEX_KEY = "index"
#: the one column of a ring written with bare tensors
_TENSOR_COLUMN = "data"


def _as_batch(data: Any, single: bool, dims: int = 1) -> tuple[TensorDictBase, Any]:
    """Written data as a TensorDict with ``dims`` leading row dims, and its kind.

    The kind is ``True`` for a bare tensor, the tree spec of a row for pytrees (tuples,
    lists inside trees, plain dicts), else (TensorDicts) the batch dims past ``dims``,
    which torchrl keeps as batch dims of what it returns.
    """
    if type(data) is TensorDict and not single and data.batch_dims == dims:
        return data, ()  # what writers hand set: none of the checks below apply
    if isinstance(data, list):
        data = _stack_rows(data)
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        return _tensor_batch(data, single, dims), True
    if is_tensorclass(data):
        data = data.to_tensordict()
    if _is_pytree(data):
        td, _ = _pytree_batch(data, single, dims)
        row = data if single else pytree.tree_map(lambda x: x[0], data)
        return td, pytree.tree_structure(row)
    return _tensordict_batch(data, single, dims)


def _stack_rows(data: list) -> Any:
    """A list of rows (torchrl's ``set`` accepts one) as one stacked batch, as torchrl's
    ``TensorStorage.set`` stacks it: tensor collections with ``torch.stack`` (their own batch
    dims kept), anything else leaf by leaf into the rows' common pytree."""
    if not data:
        raise ValueError("cannot write an empty list of rows")
    if all(is_tensor_collection(x) for x in data):
        try:
            return torch.stack(data)
        except (RuntimeError, ValueError) as exc:
            raise ColumnError(
                f"the listed TensorDict rows do not stack into one batch: {exc}"
            ) from None
    flat = [pytree.tree_flatten(x) for x in data]
    spec = flat[0][1]
    for i, (_, other) in enumerate(flat[1:], 1):
        if other != spec:
            raise ColumnError(
                f"listed row {i} has another structure than row 0 ({other} vs {spec}); every "
                "row of a list must hold the same leaves"
            )
    leaves = [
        torch.stack([torch.as_tensor(leaf) for leaf in column])
        for column in zip(*(leaves for leaves, _ in flat), strict=True)
    ]
    return pytree.tree_unflatten(leaves, spec)


def _tensor_batch(data: torch.Tensor, single: bool, dims: int) -> TensorDictBase:
    if single:
        data = data.unsqueeze(0)
    if data.ndim < dims:
        raise ColumnError(
            f"written rows need {dims} leading batch dimension(s), got a tensor of shape "
            f"{list(data.shape)}"
        )
    return TensorDict({_TENSOR_COLUMN: data}, batch_size=data.shape[:dims])


def _tensordict_batch(
    data: Any, single: bool, dims: int
) -> tuple[TensorDictBase, tuple[int, ...] | StackedRows]:
    if isinstance(data, LazyStackedTensorDict):
        if single:
            data = data.unsqueeze(0)
            single = False
        if _entries_differ(data):
            return _stacked_batch(data, dims)
        data = data.contiguous()
    if not is_tensor_collection(data):
        raise ColumnError(
            f"StoreReplay stores TensorDicts, mappings or tensors, got {type(data).__name__}"
        )
    if single:
        data = data.unsqueeze(0)
    if data.batch_dims < dims:
        raise ColumnError(
            f"written rows need {dims} leading batch dimension(s) shared by every column "
            f"(batch_size is {list(data.batch_size)})"
        )
    row_batch = tuple(data.batch_size[dims:])
    if data.batch_dims > dims:
        data = data.copy()
        data.batch_size = data.batch_size[:dims]
    return data, row_batch


@dataclass(frozen=True)
class StackedRows:
    """The layout of rows written as a ``LazyStackedTensorDict`` whose entries differ (in a
    leaf's shape, or in their keys), stacked along a batch dim of the rows.

    torchrl's ``LazyTensorStorage`` keeps such rows as a lazy stack of its entries; the ring
    keeps one column per entry leaf (entry ``j``'s ``obs`` is column ``j/obs``), every entry
    with its own fixed per-row shapes, and reads rebuild the lazy stack.

    Args:
        dim: the stack dim among a row's batch dims (0: the first dim past the ring's).
        row_batch: a row's batch dims (the stack dim included).
    """

    dim: int
    row_batch: tuple[int, ...]

    @property
    def entries(self) -> int:
        return self.row_batch[self.dim]

    @property
    def entry_batch(self) -> tuple[int, ...]:
        """An entry's batch dims past the ring's."""
        return self.row_batch[: self.dim] + self.row_batch[self.dim + 1 :]

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "row_batch": list(self.row_batch)}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any] | None) -> StackedRows | None:
        if value is None:
            return None
        return cls(int(value["dim"]), tuple(int(d) for d in value["row_batch"]))

    def describe(self) -> str:
        return (
            f"lazily stacked TensorDicts of {self.entries} differing entries (row batch dims "
            f"{list(self.row_batch)}, stacked at row dim {self.dim})"
        )


def _entries_differ(data: LazyStackedTensorDict) -> bool:
    """Whether the entries of a lazy stack differ in keys or leaf shapes (so that densifying
    it would fail or drop keys). Entries that differ only in dtypes are densified, their
    dtypes promoted, as torchrl's ``LazyTensorStorage`` stores them."""
    entries = data.tensordicts
    first = {k: v.shape for k, v in _entry_leaves(entries[0])}
    return any({k: v.shape for k, v in _entry_leaves(e)} != first for e in entries[1:])


def _entry_leaves(entry: TensorDictBase) -> list[tuple[Any, Any]]:
    return list(entry.items(include_nested=True, leaves_only=True))


def _stacked_batch(data: LazyStackedTensorDict, dims: int) -> tuple[TensorDict, StackedRows]:
    """A lazy stack with differing entries as a TensorDict of ``dims`` row dims holding
    entry ``j`` under key ``"j"`` (see :class:`StackedRows`)."""
    if data.stack_dim < dims:
        raise ColumnError(
            f"a lazily stacked TensorDict whose entries differ (in keys or shapes) is "
            f"stacked along the rows (stack_dim={data.stack_dim}): every row of a ring holds "
            "the same leaves (torchrl's storages refuse it too); pad the entries to one shape "
            "or stack them along a dim past the rows"
        )
    layout = StackedRows(data.stack_dim - dims, tuple(data.batch_size[dims:]))
    lead = data.batch_size[:dims]
    entries = {}
    for j, entry in enumerate(data.tensordicts):
        if not is_tensor_collection(entry) or isinstance(entry, LazyStackedTensorDict):
            raise ColumnError(
                f"entry {j} of a lazily stacked TensorDict is a {type(entry).__name__}; "
                "StoreReplay stores lazy stacks of TensorDicts"
            )
        if next(iter(_entry_leaves(entry)), None) is None:
            raise ColumnError(
                f"entry {j} of a lazily stacked TensorDict holds no tensors; every entry needs "
                "at least one leaf to be stored"
            )
        entry = entry.to_tensordict() if type(entry) is not TensorDict else entry.copy()
        entry.batch_size = lead
        entries[str(j)] = entry
    return TensorDict(entries, batch_size=lead), layout


def _unstack_rows(
    td: TensorDictBase, layout: StackedRows, lead: Sequence[int] | None = None
) -> LazyStackedTensorDict:
    """Rows of entry columns (``[n]``, entry ``j`` under ``"j"``) as torchrl's lazy stack,
    its row dims ``lead`` (``[n]``, or ``[time rows, envs]`` of an ``ndim=2`` read)."""
    n = td.batch_size[0]
    lead = (n,) if lead is None else tuple(lead)
    entries = []
    for j in range(layout.entries):
        entry = td.get(str(j))
        entry.batch_size = torch.Size([n, *layout.entry_batch])
        if lead != (n,):
            entry = entry.reshape(*lead, *layout.entry_batch)
        entries.append(entry)
    return LazyStackedTensorDict(*entries, stack_dim=len(lead) + layout.dim)


def _is_pytree(data: Any) -> bool:
    """Data torchrl stores as a pytree (its ``LazyTensorStorage`` returns the same type)."""
    if is_tensor_collection(data):
        return False
    return isinstance(data, (tuple, Mapping))


def _pytree_batch(data: Any, single: bool, dims: int) -> tuple[TensorDictBase, Any]:
    """A pytree as a TensorDict of its leaves (one column each) and the row's tree spec."""
    flat, spec = pytree.tree_flatten_with_path(data)
    if not flat:
        raise ColumnError("written pytree holds no tensors")
    paths = [p for p, _ in flat]
    names = _leaf_names(paths)
    leaves = {}
    for path, (name, (_, leaf)) in zip(paths, zip(names, flat, strict=True), strict=True):
        where = pytree.keystr(path) or "the root"
        if isinstance(leaf, np.ndarray):
            leaf = torch.from_numpy(leaf)
        if not isinstance(leaf, torch.Tensor):
            raise ColumnError(
                f"pytree leaf {where} holds {type(leaf).__name__}; only tensors can be stored "
                "(every leaf becomes a column)"
            )
        if single:
            leaf = leaf.unsqueeze(0)
        if leaf.ndim < dims:
            raise ColumnError(
                f"pytree leaf {where} has shape {list(leaf.shape)}; every leaf needs the "
                f"{dims} leading batch dimension(s) of the written rows"
            )
        leaves[tuple(name.split("/"))] = leaf
    first = next(iter(leaves.values())).shape[:dims]
    for path, leaf in zip(paths, leaves.values(), strict=True):
        if leaf.shape[:dims] != first:
            raise ColumnError(
                f"pytree leaf {pytree.keystr(path)} has leading shape {list(leaf.shape[:dims])}, "
                f"the first leaf {list(first)}; every leaf must share the written rows' dims"
            )
    td = TensorDict(batch_size=first)
    for key, leaf in leaves.items():
        td.set(key, leaf)
    return td, spec


_COLUMN_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def _leaf_keys(columns: Sequence[ColumnSpec]) -> list[tuple[str, ...]]:
    """The TensorDict keys of a pytree's leaf columns, in leaf order."""
    return [tuple(c.name.split("/")) for c in columns]


def _leaf_names(paths: list[tuple[Any, ...]]) -> list[str]:
    """Column names of pytree leaves: their key paths when all are valid and distinct."""
    names = []
    for path in paths:
        parts = []
        for entry in path:
            key = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", None)))
            parts.append(str(key))
        names.append("/".join(parts) if parts else "leaf")
    ok = all(all(_COLUMN_PART.match(p) for p in n.split("/")) for n in names)
    if ok and len(set(names)) == len(names):
        prefixes = {n.rsplit("/", 1)[0] for n in names if "/" in n}
        if not prefixes & set(names):  # a leaf cannot also be a group
            return names
    return [f"leaf{i}" for i in range(len(names))]


def _named_leaves(batch: TensorDictBase) -> dict[str, Any]:
    """The leaves of a written TensorDict by column name (``("next", "obs")``: ``next/obs``).

    A plain ``TensorDict`` (what writers hand ``set``) is walked through its own mapping,
    several times cheaper than ``items(include_nested=True, leaves_only=True)``.
    """
    if type(batch) is TensorDict and not is_compiling():
        leaves: dict[str, Any] = {}
        _walk_leaves(batch, "", leaves)
        return leaves
    return {
        key if type(key) is str else "/".join(key): value
        for key, value in batch.items(include_nested=True, leaves_only=True)
    }


def _walk_leaves(td: TensorDict, prefix: str, out: dict[str, Any]) -> None:
    for key, value in td._tensordict.items():
        if type(value) is TensorDict:
            _walk_leaves(value, prefix + key + "/", out)
        elif is_tensor_collection(value):  # another kind of node: tensordict's own walk
            for sub, leaf in value.items(include_nested=True, leaves_only=True):
                sub = sub if type(sub) is str else "/".join(sub)
                out[prefix + key + "/" + sub] = leaf
        else:
            out[prefix + key] = value


def _flat(values: Mapping[str, Any], dims: int) -> dict[str, Any]:
    """Every value with its ``dims`` leading dims flattened to rows (a copy if strided)."""
    return {
        k: v.flatten(0, dims - 1) if isinstance(v, torch.Tensor) else v for k, v in values.items()
    }


def _rows_from(values: dict[str, torch.Tensor], first: int) -> dict[str, torch.Tensor]:
    """Every column's rows from ``first`` on (the same dict when ``first`` is 0)."""
    return values if first == 0 else {k: v[first:] for k, v in values.items()}
