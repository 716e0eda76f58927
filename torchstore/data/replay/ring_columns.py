"""The column layout of :class:`~torchstore.data.replay.ring.StoreReplay`: allocation, the checks
of written leaves, columns added late, and torchrl's conditional patches.

:class:`ReplayColumns` allocates the packed rows for declared or inferred columns, checks each
write's leaves against them (and trusts a repeat of the last structure that needed no
conversion, keeping an append plan for it: :mod:`torchstore.data.replay.append_plan`), grows
an inferred ring by the keys first written later, reads the episode-end flags of written rows,
and hands torchrl's ``rb.update_if_present`` writable column views. The write paths
(:mod:`torchstore.data.replay.writes`) call ``_infer`` and ``_validate``; the state loaders
(:mod:`torchstore.data.replay.state`) call ``_adopt_columns``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from torchstore.data.columns import ColumnSpec, name_from_key, validate_columns
from torchstore.data.replay.append_plan import _PLANS, _AppendPlan
from torchstore.data.replay.batches import _INDEX_KEY, _flat, _named_leaves
from torchstore.data.rows.packed import PackedColumns
from torchstore.errors import ColumnError, UnsupportedError

__all__ = ["END_COLUMNS", "ReplayColumns"]

#: Column names that mark episode ends, nested layout first.
END_COLUMNS: tuple[tuple[str, ...], ...] = (
    ("next/done", "next/truncated", "next/terminated"),
    ("done", "truncated", "terminated"),
)


class ReplayColumns:
    """Column allocation, write validation and late columns of a :class:`StoreReplay`.

    A mixin of :class:`~torchstore.data.replay.ring.StoreReplay`, whose constructor initialises
    every attribute used here. It owns the column state: ``_declared`` (the ``columns=``
    schema or ``None``), ``_packed``, ``_end_names``, ``_returns_index``,
    ``_trusted_signature``, ``_trusted_names`` and ``_append_plans``; it resets the caches of
    the old layout (``_segments_cache``, ``_scalar_views``) when it allocates, and moves
    ``fill_level`` and ``cursor_tensor`` to the ring's device. It reads ``_tensor_mode`` and
    ``_treespec`` (the first write's layout: :mod:`torchstore.data.replay.writes`) and the
    ring's ``_episodes``, ``_width`` and ``time_capacity``, and calls ``_rebuild``
    (:mod:`torchstore.data.replay.ring`), ``_guard``, ``_follow`` and ``_sync_scalars`` with
    ``_shared`` (:mod:`torchstore.data.replay.shared`), and torchrl's ``device``,
    ``max_size``, ``ndim`` and ``initialized``.
    """

    def adopt_columns(self, columns: Sequence[ColumnSpec] | PackedColumns) -> None:
        """Allocate the rows for ``columns``, or check them against the columns held.

        A :class:`PackedColumns` of ``capacity`` rows becomes the ring's rows as it is (no
        copy; what it holds is the ring's contents once :meth:`restore_ring` says so).
        """
        if not isinstance(columns, PackedColumns):
            self._adopt_columns(columns)
            return
        if self._packed is not None or self.ndim != 1 or columns.capacity != self.max_size:
            raise ValueError(
                f"packed columns of {columns.capacity} rows cannot become the rows of {self!r}: "
                "a ring of ndim=1 takes packed columns of its capacity before it holds any"
            )
        if self.device == "auto":
            self.device = columns.device
        elif columns.device != self.device:
            raise ValueError(f"packed columns on {columns.device}, the ring is on {self.device}")
        self._allocate(columns.columns, columns)

    def _adopt_columns(self, columns: Sequence[ColumnSpec]) -> None:
        columns = validate_columns(columns)
        if self._packed is not None:
            _check_same_columns(self._packed.columns, columns, what="this replay's")
            return
        if self.device == "auto":
            self.device = torch.device("cpu")
        self._allocate(columns)

    def _allocate(self, columns: Sequence[ColumnSpec], packed: PackedColumns | None = None) -> None:
        columns = validate_columns(columns)
        if self._declared is not None and self._packed is None:
            _check_same_columns(self._declared, columns, what="declared")
        if packed is None:
            packed = PackedColumns(columns, self.max_size, self.device)
        self._packed = packed
        self._find_end_names()
        self.fill_level = self.fill_level.to(self.device)
        self.cursor_tensor = self.cursor_tensor.to(self.device)
        self._segments_cache = None
        self._trusted_signature = None
        self._append_plans = []
        self._scalar_views = None
        self.initialized = True

    def _find_end_names(self) -> None:
        """The end columns among the ring's columns (see :data:`END_COLUMNS`); with rows of
        lazily stacked entries, those of every entry (``j/next/done``), OR-ed."""
        names = {c.name for c in self._packed.columns}
        stacked = self._stacked
        prefixes = [""] if stacked is None else [f"{j}/" for j in range(stacked.entries)]
        self._end_names = ()
        for group in END_COLUMNS:
            present = tuple(p + n for p in prefixes for n in group if p + n in names)
            if present:
                self._end_names = present
                break

    def _infer(self, batch: TensorDictBase) -> None:
        if self.device == "auto":
            self.device = batch.device if batch.device is not None else torch.device("cpu")
        if self._declared is not None:
            self._allocate(self._declared)
            return
        specs = []
        for key, value in batch.items(include_nested=True, leaves_only=True):
            name = name_from_key(key)
            if name == _INDEX_KEY:
                continue
            if not isinstance(value, torch.Tensor):
                raise ColumnError(
                    f"column '{name}' holds {type(value).__name__}; only tensors can be stored"
                )
            specs.append(ColumnSpec(name, value.dtype, tuple(value.shape[1:])))
        self._allocate(specs)

    def _validate(
        self, batch: TensorDictBase, n: int, dims: int = 1, *, partial: bool = False
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The written columns' values in their storage dtype, and the rows' end flags.

        ``batch`` has ``dims`` leading row dims (``n`` rows in all); the values keep them.
        A write whose leaves have the names, dtypes, per-row shapes and devices of the last
        write that needed no conversion is trusted without re-checking the schema.
        ``partial``: a patch of some columns (see :meth:`_check_leaves`), never trusted (a
        ring of declared columns must still refuse appends that leave columns out).
        """
        leaves = _named_leaves(batch)
        signature = tuple(
            (name, v.dtype, v.shape[dims:], v.device) if isinstance(v, torch.Tensor) else name
            for name, v in leaves.items()
        )
        lead = tuple(batch.batch_size[:dims])
        if (dims, signature) == self._trusted_signature:
            values = {name: leaves[name] for name in self._trusted_names}
            return values, self._ends_of(values, lead)
        flat = leaves if dims == 1 else _flat(leaves, dims)
        values = self._check_leaves(flat, n, partial=partial)
        unconverted = all(values[name] is flat.get(name) for name in values)
        every_leaf = len(values) == len(leaves) - (
            _INDEX_KEY in leaves and _INDEX_KEY not in values
        )
        if unconverted and every_leaf and not partial:
            self._trusted_signature = (dims, signature)
            self._trusted_names = tuple(values)
            self._add_plan(dims, signature)
        if dims > 1:
            values = {k: v.reshape(*lead, *v.shape[1:]) for k, v in values.items()}
        return values, self._ends_of(values, lead)

    def _add_plan(self, dims: int, signature: tuple) -> None:
        """Keep an append plan for a validated leaf structure (the newest few)."""
        if any(plan.signature == (dims, signature) for plan in self._append_plans):
            return
        plan = _AppendPlan.make(self, dims, signature)
        if plan is not None:
            self._append_plans = [plan, *self._append_plans[: _PLANS - 1]]

    def _check_leaves(
        self, leaves: dict[str, Any], n: int, *, partial: bool = False
    ) -> dict[str, torch.Tensor]:
        """Full schema check of one write; adds the columns an inferred ring grows by.

        ``partial``: the write may leave out columns of any ring (a patch of some columns:
        ``rb[key] = v``), not only of an inferred one.
        """
        specs = self._packed._specs
        if _INDEX_KEY in leaves and _INDEX_KEY not in specs:
            leaves = {k: v for k, v in leaves.items() if k != _INDEX_KEY}
            self._returns_index = True
        missing = [name for name in specs if name not in leaves]
        extra = [name for name in leaves if name not in specs]
        self._check_key_sets(specs, leaves, [] if partial else missing, extra)
        values: dict[str, torch.Tensor] = {}
        for name, value in leaves.items():
            if not isinstance(value, torch.Tensor):
                raise ColumnError(
                    f"column '{name}' holds {type(value).__name__}; only tensors can be stored"
                )
            if name in specs:
                values[name] = specs[name].check_rows(value, rows=n)
        new_specs = [
            ColumnSpec(name, leaves[name].dtype, tuple(leaves[name].shape[1:])) for name in extra
        ]
        if new_specs:
            validate_columns([*self._packed.columns, *new_specs])
            for spec in new_specs:
                values[spec.name] = spec.check_rows(leaves[spec.name], rows=n)
            self._add_columns(new_specs)
        return values

    def _check_key_sets(
        self, specs: Mapping[str, ColumnSpec], leaves: Mapping[str, Any], missing, extra
    ) -> None:
        """Declared columns are a schema: every write holds exactly them. Inferred ones grow
        (a key first written later becomes a column, earlier rows holding its fill value)
        and take partial writes (columns left out keep what their rows held), as torchrl's
        LazyTensorStorage does."""
        strict = (
            self._declared is not None
            or self._tensor_mode
            or self._treespec is not None
            or self._stacked is not None
        )
        if missing and strict:
            raise ColumnError(
                f"column '{missing[0]}' is missing from the written rows "
                f"(declared {list(specs)}, got {list(leaves)})"
            )
        if extra and strict:
            raise ColumnError(
                f"column '{extra[0]}' is not a column of this replay (declared {list(specs)}); "
                "declare it or drop it before writing"
            )
        if len(missing) == len(specs) and not extra:
            raise ColumnError(
                f"the written rows hold none of this replay's columns ({list(specs)}), "
                f"got {list(leaves)}"
            )

    def _ends_of(
        self, values: Mapping[str, torch.Tensor], lead: tuple[int, ...]
    ) -> torch.Tensor | None:
        """Rows' end flags (shape ``lead``): the OR of the end columns written, or ``None``."""
        present = [name for name in self._end_names if name in values]
        if not present:
            return None
        first = values[present[0]]
        if len(present) == 1 and first.dtype == torch.bool and first.shape == lead:
            return first  # read only: a bool column of one flag per row is its own flags
        ends = torch.zeros(lead, dtype=torch.bool, device=first.device)
        for name in present:
            ends |= values[name].reshape(*lead, -1).any(-1)
        return ends

    def _conditional_patch_leaf(self, key: Any) -> torch.Tensor:
        """A column's rows as a writable view, for torchrl's ``rb.update_if_present``."""
        if self._packed is None:
            raise RuntimeError(
                "Conditional updates require an initialized storage. Write some data to the "
                "buffer before calling update_if_present."
            )
        name = name_from_key(key)
        spec = self._packed._specs.get(name)
        if spec is None or self._tensor_mode or self._treespec is not None or self._stacked:
            raise KeyError(
                f"Key {key} does not exist in the storage. Conditional patches can only "
                "target existing columns of a TensorDict ring."
            )
        if spec.storage_dtype != spec.dtype:
            raise ColumnError(
                f"column '{name}' is stored quantised ({spec.describe()}); update_if_present "
                "patches only columns stored in their own dtype"
            )
        view = self._packed.view(name)
        if self.ndim > 1:
            view = view.unflatten(0, (self.time_capacity, self._width))
        return view

    def _apply_conditional_patch(self, index: torch.Tensor, patch: Mapping[Any, Any]) -> None:
        with self._guard():
            if self._shared is not None:
                self._follow()
            super()._apply_conditional_patch(index, patch)
            if any(name_from_key(key) in self._end_names for key in patch):
                self._rebuild(rows=self._episodes.rows, cursor=self._episodes.cursor)
                self._sync_scalars()  # other processes rebuild their index too

    def _add_columns(self, specs: Sequence[ColumnSpec]) -> None:
        """Grow the row layout by ``specs``; every existing row holds their fill value.

        The packed blocks are reallocated (the old rows copied over), so buffers made for
        the old layout (``packed.gather_blocks(out=...)``) must be remade.
        """
        if self._shared is not None:
            raise UnsupportedError(
                f"a StoreReplay shared with other processes cannot grow columns (got "
                f"{[s.name for s in specs]}): write every key before sharing, or declare columns="
            )
        old = self._packed
        ends_before = self._end_names
        self._packed = None
        self._allocate([*old.columns, *specs])
        for column in old.columns:
            self._packed.write(slice(None), {column.name: old.view(column.name)})
        if self._end_names != ends_before:  # an end column arrived: earlier rows end nowhere
            self._rebuild(rows=self._episodes.rows, cursor=self._episodes.cursor)


def _check_same_columns(
    expected: Sequence[ColumnSpec], got: Sequence[ColumnSpec], *, what: str
) -> None:
    if tuple(expected) != tuple(got):
        want = {c.name: c.describe() for c in expected}
        have = {c.name: c.describe() for c in got}
        diff = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
        name = diff[0] if diff else (expected[0].name if expected else "?")
        raise ColumnError(
            f"column '{name}' differs from {what} columns: expected {want.get(name, 'absent')}, "
            f"got {have.get(name, 'absent')}"
        )
