"""A window of a store too large for memory: one resident slab refilled by contiguous reads.

:class:`WindowedStore` holds ``rows`` consecutive rows, moved by hand (``refill(start)``).
The ``K``-block window refilled on a background thread by the sampling core's schedule
(what the DataModules' ``resident=`` budgets sample) is
``BlockWindow``, one layer up in the samplers package.

Pickled, a window is its recipe (the store's path, its size, columns, device and start): the
other side opens the store and reads the rows into memory of its own, so a child's
``refill`` never moves the parent's rows.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.file.reader import StoreReader
from torchstore.data.rows.packed import PackedColumns, PackedRows
from torchstore.errors import RowIndexError
from torchstore.validation import positive_int

__all__ = ["WindowedStore"]


class WindowedStore(PackedRows):
    """``rows`` consecutive store rows held in memory, movable with one contiguous read.

    Gathers take store row numbers inside the current window ``[start, stop)``.

    Examples:
        >>> win = TrajectoryStore("big.h5").window(1_000_000)
        >>> win.refill(2_000_000)
        >>> batch = win.gather(torch.randint(win.start, win.stop, (4096,)))
    """

    def __init__(
        self,
        store: StoreReader,
        rows: int,
        columns: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
    ):
        rows = positive_int("rows", rows)
        self.store = store
        specs = store.select_columns(columns)
        self.packed = PackedColumns(specs, rows, device)
        self.rows = int(rows)
        self.start = 0
        self.stop = 0
        self.refill(0)

    def __len__(self) -> int:
        return self.stop - self.start

    def refill(self, start: int) -> None:
        """Load rows ``[start, start + rows)`` (clipped to the store's end), one read per column."""
        total = self.store.num_rows
        if not 0 <= start <= max(total - 1, 0):
            raise RowIndexError(f"window start ({start}) must lie in [0, {total})")
        stop = min(start + self.rows, total)
        self.packed.write(
            slice(0, stop - start),
            {
                s.name: torch.from_numpy(self.store.read_column(s.name, start, stop))
                for s in self.columns
            },
        )
        self.start, self.stop = start, stop

    def gather(self, index: torch.Tensor, *, raw: bool = False) -> TensorDict:
        """Rows at store row numbers ``index``, all inside the window."""
        if index.numel() and (int(index.min()) < self.start or int(index.max()) >= self.stop):
            raise RowIndexError(
                f"rows must lie in the window [{self.start}, {self.stop}), got "
                f"[{int(index.min())}, {int(index.max())}]; refill() the window first"
            )
        return self.packed.gather(index - self.start, raw=raw)

    def __reduce__(self) -> tuple[Any, ...]:
        """The recipe, pickled here into bytes of its own (see the module docstring)."""
        columns = [spec.name for spec in self.columns]
        recipe = (self.store, self.rows, columns, str(self.device), self.start)
        return (_reopened, (pickle.dumps(recipe),))

    def __repr__(self) -> str:
        return (
            f"WindowedStore(rows [{self.start}, {self.stop}) of {self.store.num_rows}, "
            f"device={self.device})"
        )


def _reopened(recipe: bytes) -> WindowedStore:
    """A :class:`WindowedStore` made from its recipe, holding the rows it held."""
    store, rows, columns, device, start = pickle.loads(recipe)
    window = WindowedStore(store, rows, columns=columns, device=device)
    if start:
        window.refill(start)
    return window
