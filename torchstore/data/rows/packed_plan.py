"""Cutting a gathered batch out of packed blocks: the leaves' views and their TensorDict.

:class:`~torchstore.data.rows.packed.PackedColumns` (:mod:`torchstore.data.rows.packed`, which
re-exports every public name here) lays rows out and gathers them into blocks; a
:class:`BatchPlan` turns gathered blocks into the nested leaves of a batch, worked out once
per column set, and :func:`tensordict_of` wraps the leaves in a TensorDict without the
per-call work of ``TensorDict._new_unsafe``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchstore.data.columns import ColumnSpec, numpy_dtype
from torchstore.errors import ColumnError

__all__ = ["BatchPlan", "tensordict_of"]


@dataclass(frozen=True, slots=True)
class _Recipe:
    """How one column's leaf is cut out of a gathered block (precomputed once)."""

    key: str | tuple[str, ...]
    block: int
    offset: int
    shape: tuple[int, ...]
    inner_strides: tuple[int, ...]
    spec: ColumnSpec
    #: strides of the leaf in the storage-dtype view of a contiguous block
    strides: tuple[int, ...]


class BatchPlan:
    """How a batch's leaves are cut out of gathered blocks, worked out once per column set.

    Per batch, each dtype of each block is viewed once and each leaf is one ``as_strided``
    with precomputed strides (a slice of the blocks, or a caller's buffer, takes the general
    cut); the nested containers are made in the column order. What is left per batch is
    one ``as_strided`` per column (about 2 us each, most of the cost) and the container:
    ``batch_from_blocks`` of a 6-column row with an index measured about 20 us where the
    per-call cut with ``TensorDict._new_unsafe`` took about 30 us (one thread, loaded cores).
    """

    def __init__(
        self,
        packed: Any,
        names: tuple[str, ...],
        keys: Mapping[str, str | tuple[str, ...]],
        unsqueeze: frozenset[str],
        raw: bool,
    ):
        #: per leaf: (containers to attach first, container, key, view slot, tail shape,
        #: strides, offset, recipe, decode, unsqueeze)
        self._ops: list[tuple] = []
        #: nested containers (0 is the top level); each is attached to its parent just before
        #: its first leaf, so the keys keep the columns' order
        self._count = 1
        #: (block, dtype) of each view slot
        self._views: list[tuple[int, torch.dtype]] = []
        where: dict[tuple[str, ...], int] = {(): 0}
        for name in names:
            recipe = packed._recipes[name]
            key = keys.get(name, recipe.key)
            path = (key,) if type(key) is str else tuple(key)
            attach = []
            for depth in range(1, len(path)):
                if path[:depth] not in where:
                    where[path[:depth]] = self._count
                    attach.append((where[path[: depth - 1]], path[depth - 1], self._count))
                    self._count += 1
            pair = (recipe.block, recipe.spec.storage_dtype)
            if pair not in self._views:
                self._views.append(pair)
            shape, strides = recipe.shape, recipe.strides
            if name in unsqueeze:
                if shape:
                    raise ValueError(f"column {name!r} is not a scalar; it takes no unsqueeze")
                shape, strides = (1,), (*strides, 1)
            decode = None if raw or recipe.spec.quantize is None else recipe.spec.quantize.decode
            self._ops.append(
                (
                    tuple(attach),
                    where[path[:-1]],
                    path[-1],
                    self._views.index(pair),
                    shape,
                    strides,
                    recipe.offset,
                    recipe,
                    decode,
                    name in unsqueeze,
                )
            )

    @cached_property
    def _cut_arrays(self) -> Callable[[list[np.ndarray], int], dict] | None:
        """The body of :meth:`leaves_of_arrays` for this plan as one Python function,
        compiled on first use (None when a storage dtype has no numpy twin): its shapes,
        strides and offsets written in as constants, a statement per leaf and no loop. The
        same cut as a loop over the leaves' recipes costs about 1.3 us more per
        leaf (a pendulum row's six leaves in 11 us against 19 us, one thread), and for a
        small batch that is a fifth of the whole draw (as ``dataclasses`` and
        ``namedtuple`` write their methods)."""
        env: dict[str, Any] = {"ndarray": np.ndarray, "from_numpy": torch.from_numpy}
        lines = ["def cut(arrays, n):", "    c0 = {}"]
        for i, (attach, where, key, v, shape, strides, offset, recipe, decode, _) in enumerate(
            self._ops
        ):
            storage = recipe.spec.storage_dtype
            try:
                env[f"dtype{i}"] = numpy_dtype(storage)
            except ColumnError:
                return None
            for parent, name, child in attach:
                lines.append(f"    c{child} = {{}}")
                lines.append(f"    c{parent}[{name!r}] = c{child}")
            size = storage.itemsize
            full_shape = ", ".join(["n", *(str(d) for d in shape)])
            byte_strides = ", ".join(str(stride * size) for stride in strides)
            block = self._views[v][0]
            leaf = (
                f"from_numpy(ndarray(({full_shape},), dtype{i}, arrays[{block}], "
                f"{offset * size}, ({byte_strides},)))"
            )
            if decode is not None:
                env[f"decode{i}"], env[f"to{i}"] = decode, recipe.spec.dtype
                leaf = f"decode{i}({leaf}, to{i})"
            lines.append(f"    c{where}[{key!r}] = {leaf}")
        lines.append("    return c0")
        exec("\n".join(lines), env)  # noqa: S102 - our own text: numbers and repr'd keys
        return env["cut"]

    def leaves(self, blocks: list[torch.Tensor], n: int, *, fresh: bool = False) -> dict:
        """The nested dict of leaves (views into ``blocks``, decoded as planned).

        ``fresh``: the blocks are what :meth:`PackedColumns.gather_blocks` returned without
        ``out`` (contiguous from offset 0), so their layout is not checked."""
        views = []
        plain = []
        for b, dtype in self._views:
            block = blocks[b]
            views.append(block if block.dtype == dtype else block.view(dtype))
            plain.append(fresh or (block.storage_offset() == 0 and block.is_contiguous()))
        containers: list[dict] = [{} for _ in range(self._count)]
        as_strided = torch.as_strided
        size = (n,)
        for attach, where, key, v, shape, strides, offset, recipe, decode, unsqueeze in self._ops:
            for parent, name, child in attach:
                containers[parent][name] = containers[child]
            if plain[v]:
                leaf = as_strided(views[v], size + shape, strides, offset)
            else:
                leaf = _cut(views[v], recipe)
                if unsqueeze:
                    leaf = leaf.unsqueeze(-1)
            if decode is not None:
                leaf = decode(leaf, recipe.spec.dtype)
            containers[where][key] = leaf
        return containers[0]

    def __getstate__(self) -> dict:
        # a compiled function does not pickle: a copy compiles its own
        state = dict(self.__dict__)
        state.pop("_cut_arrays", None)
        return state

    @property
    def cuts_arrays(self) -> bool:
        """Whether :meth:`leaves_of_arrays` can cut this plan's leaves."""
        return self._cut_arrays is not None

    def leaves_of_arrays(self, arrays: list[np.ndarray], n: int) -> dict:
        """:meth:`leaves` of blocks gathered as C-contiguous numpy arrays (``n`` rows each):
        each leaf one numpy view and one ``torch.from_numpy``, about half of what a torch
        ``as_strided`` costs (measured: the six leaves of a pendulum row 11 us against
        24 us, one thread)."""
        return self._cut_arrays(arrays, n)


def _plain_tensordict(leaves: dict, batch_size: torch.Size, device: torch.device | None) -> Any:
    """``TensorDict._new_unsafe(leaves, batch_size, device)``, made without its per-call
    work (device normalisation, an MPS probe per TensorDict): the instance state it sets."""
    td = _new_object(TensorDict)
    for key, value in leaves.items():
        if type(value) is dict:
            leaves[key] = _plain_tensordict(value, batch_size, device)
    td.__dict__.update(
        _device=device, _tensordict=leaves, _batch_size=batch_size, _td_dim_names=None
    )
    return td


def _unsafe_tensordict(leaves: dict, batch_size: torch.Size, device: torch.device | None) -> Any:
    return TensorDict._new_unsafe(leaves, batch_size=batch_size, device=device)


def _state(td: Any) -> dict:
    """A TensorDict's instance state, nested, less the lazily cached probes."""
    return {
        k: (
            {kk: _state(vv) if isinstance(vv, TensorDict) else vv for kk, vv in v.items()}
            if k == "_tensordict"
            else v
        )
        for k, v in vars(td).items()
        if not (k.startswith("_has_") and k.endswith("_val"))
    }


def _plain_matches() -> bool:
    """Whether the direct construction gives the instance state ``_new_unsafe`` gives (it
    does for the tensordict releases this package supports; else the slower call is used)."""
    leaf = torch.zeros(2)
    size = torch.Size([2])
    device = torch.device("cpu")
    try:
        plain = _plain_tensordict({"a": leaf, "b": {"c": leaf}}, size, device)
        reference = _unsafe_tensordict({"a": leaf, "b": {"c": leaf}}, size, device)
        return _state(plain) == _state(reference) and plain["b", "c"] is leaf
    except Exception:  # noqa: BLE001 - any surprise means: use the library's constructor
        return False


_new_object = object.__new__
#: ``tensordict_of(leaves, batch_size, device)``: the TensorDict of a nested dict of leaves
#: (nested dicts are replaced by TensorDicts in place), as ``TensorDict._new_unsafe`` makes
#: it, in about 1 us instead of 5-9 us
tensordict_of = _plain_tensordict if _plain_matches() else _unsafe_tensordict


def _cut(typed: torch.Tensor, recipe: _Recipe) -> torch.Tensor:
    """The ``[rows, *shape]`` view of one column in the dtype view of a block."""
    row_stride, col_stride = typed.stride()
    return torch.as_strided(
        typed,
        (typed.shape[0], *recipe.shape),
        (row_stride, *(s * col_stride for s in recipe.inner_strides)),
        typed.storage_offset() + recipe.offset * col_stride,
    )
