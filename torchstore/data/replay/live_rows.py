"""Full reads of a :class:`~torchstore.data.replay.ring.StoreReplay` that take item assignment
back into the ring, as torchrl's storages do.

torchrl's ``ReplayBuffer.__setitem__`` writes a key (``rb["a"] = v``) and an index of more
than one dim (``rb[0, 3:4] = v``) as ``rb[:][index] = value``: on a ``LazyTensorStorage``,
``rb[:]`` is the storage's own TensorDict (or views of it), so the assignment lands in the
storage. A ring's rows live in packed blocks and a read builds a new TensorDict, so a full
read of a ring of TensorDicts (``storage[:]``; ``storage[:, :]`` with ``ndim=2``) returns a
:class:`LiveRows`: a TensorDict whose item assignment is written into the ring first,
through the ring's own checks (column dtypes and shapes, declared columns, quantised columns,
the episode index), then into the read itself. A write the ring cannot take raises and
changes neither.

Only item assignment (``x[key] = v``, ``x[idx] = v``) writes through: ``set``, ``update``
and whatever is derived from the read (indexing, ``clone``, arithmetic: plain TensorDicts)
stay local, and the leaves are views of the ring's rows as torchrl's are (in-place tensor
ops on them change the rows, without the ring's bookkeeping). ``transpose`` stays live:
torchrl transposes an ``ndim=2`` read before assigning. A read taken before the ring last
changed refuses assignment, as its rows may be out of date.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.utils import _unravel_key_to_tuple

from torchstore.data.columns import _safe_cast, name_from_key
from torchstore.errors import ColumnError, UnsupportedError

__all__ = ["LiveRows", "live_rows"]


class _Origin:
    """The ring a full read came from, and what it was when read (shared by the read and
    its transposes: an assignment through either keeps both current)."""

    __slots__ = ("ring", "revision", "packed", "lead", "row_batch")

    def __init__(self, ring: Any, lead: tuple[int, ...], row_batch: tuple[int, ...]):
        self.ring = ring
        self.lead = lead  # the ring dims of the read: (rows,) or (time rows, envs)
        self.row_batch = row_batch
        self.mark()

    def mark(self) -> None:
        self.revision = self.ring._mutation_revision
        self.packed = self.ring._packed

    def is_current(self) -> bool:
        ring = self.ring
        return ring._mutation_revision == self.revision and ring._packed is self.packed


def live_rows(td: TensorDict, ring: Any, lead: tuple[int, ...]) -> LiveRows:
    """``td`` (a fresh TensorDict read of every valid row of ``ring``, shaped ``[*lead,
    *row batch dims]``) as a :class:`LiveRows`, without copying it."""
    td.__class__ = LiveRows
    td._live = (_Origin(ring, lead, tuple(td.batch_size[len(lead) :])), ())
    return td


class LiveRows(TensorDict):
    """A full read of a ring whose item assignment also writes the ring (see the module)."""

    @classmethod
    def _new_unsafe(cls, *args: Any, **kwargs: Any) -> TensorDict:
        # what tensordict derives from a read (indexing, clones, ops) is a plain TensorDict
        return TensorDict._new_unsafe(*args, **kwargs)

    def __setitem__(self, index: Any, value: Any) -> None:
        live = self.__dict__.get("_live")
        if live is not None:
            origin, swaps = live
            if not origin.is_current():
                raise UnsupportedError(
                    "this read of the ring's rows was taken before the ring's last write; "
                    "read storage[:] (rb[:]) again and assign to the new read"
                )
            rows, staged = self._stage(origin, swaps, index, value)
            origin.ring._patch_rows(rows, staged)
            if origin.ring._packed is origin.packed:
                origin.mark()  # else new columns moved the rows: this read's views are stale
        super().__setitem__(index, value)

    def _transpose(self, dim0: int, dim1: int) -> TensorDict:
        out = super()._transpose(dim0, dim1)
        live = self.__dict__.get("_live")
        if live is None or out is self:
            return out
        out.__class__ = LiveRows
        out._live = (live[0], (*live[1], (dim0, dim1)))
        return out

    def _stage(
        self, origin: _Origin, swaps: tuple, index: Any, value: Any
    ) -> tuple[torch.Tensor, TensorDictBase]:
        """The ring rows an assignment touches and their new values of the columns it
        writes (``[rows, *row batch dims]``), worked out on a copy of those columns."""
        keyed = isinstance(index, str) or (
            isinstance(index, tuple) and bool(_unravel_key_to_tuple(index))
        )
        if keyed:  # a whole column (or subtree) of every row
            staged = TensorDict(batch_size=self.batch_size, device=self.device)
            staged[index] = value
            rows = None
        else:
            if is_tensor_collection(value) or isinstance(value, dict):
                leaves = _leaves(value)
                staged = TensorDict.select(self, *leaves, strict=False).clone()
            else:  # a tensor or a number: every leaf
                leaves = dict.fromkeys(self.keys(include_nested=True, leaves_only=True), value)
                staged = self.clone()
            self._refuse_lossy_casts(leaves)
            staged[index] = value
            rows = self._touched_rows(origin, swaps, index)
        for dim0, dim1 in reversed(swaps):
            staged = staged.transpose(dim0, dim1)
        if len(origin.lead) > 1:  # [time rows, envs] read: the ring's flat rows
            staged = staged.reshape(math.prod(origin.lead), *origin.row_batch)
        if rows is None:
            rows = torch.arange(staged.batch_size[0], dtype=torch.int64)
        else:
            staged = staged[rows]
        return rows, staged

    def _refuse_lossy_casts(self, leaves: dict[Any, Any]) -> None:
        """Tensors assigned at an index are cast to the read's leaves: refuse the casts the
        ring refuses for its rows (a float into an int column), as a write of rows would."""
        for key, leaf in leaves.items():
            if not isinstance(leaf, torch.Tensor) or key not in self.keys(True, True):
                continue
            have = self.get(key).dtype
            if leaf.dtype != have and not _safe_cast(leaf.dtype, have):
                raise ColumnError(
                    f"column '{name_from_key(key)}' expects {str(have).removeprefix('torch.')}, "
                    f"got {str(leaf.dtype).removeprefix('torch.')}; casting would lose "
                    "information, so convert it explicitly"
                )

    @staticmethod
    def _touched_rows(origin: _Origin, swaps: tuple, index: Any) -> torch.Tensor | None:
        """The flat ring rows an index of the read addresses (``None``: every row)."""
        lead, row_batch = origin.lead, origin.row_batch
        grid = torch.arange(math.prod(lead), dtype=torch.int64)
        grid = grid.reshape(*lead, *[1] * len(row_batch)).expand(*lead, *row_batch)
        for dim0, dim1 in swaps:
            grid = grid.transpose(dim0, dim1)
        if isinstance(index, list):
            index = (index,)  # as tensordict reads a bare list
        try:
            return torch.unique(grid[index].reshape(-1))
        except (IndexError, TypeError, ValueError, RuntimeError):
            return None  # an index only tensordict reads: rewrite every row

    def __repr__(self) -> str:
        return repr(self.copy())

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickled (torch.save, a queue) as the plain TensorDict it reads as, not with the
        # ring; a clone, as torch.save refuses leaves that view one block as several dtypes
        return _unpickled, (self.clone(),)


def _unpickled(td: TensorDict) -> TensorDict:
    return td


def _leaves(value: Any) -> dict[Any, Any]:
    """The leaves of an assigned TensorDict or dict, by nested key."""
    if isinstance(value, dict):
        value = TensorDict(value, batch_size=[])
    return dict(value.items(include_nested=True, leaves_only=True))
