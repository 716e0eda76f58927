"""Cursors and read indices of :class:`~torchstore.data.replay.ring.StoreReplay`, as plain values.

Module functions, no ring state: they tell a contiguous run of rows (what torchrl's writers
pass) from any other cursor, check an index against a size, and turn the index forms torchrl
and users hand ``set`` and ``get`` (ints, tensors, numpy arrays, lists, ranges, bool masks,
``(time, env)`` tuples) into int64 tensors. The write paths
(:mod:`torchstore.data.replay.writes`) and the read paths
(:mod:`torchstore.data.replay.reads`) use them; ``_flat_rows`` also maps the time rows of an
``ndim=2`` ring to its flat rows for the episode index rebuild (:mod:`torchstore.data.replay.ring`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torchstore.data.rows.packed import row_kernels


def _wrap_int(value: int, size: int, what: str, *, valid: bool = False) -> int:
    if not -size <= value < size:
        span = "valid rows" if valid else "capacity"
        raise IndexError(f"{what} {value} is out of range for {size} {span}; use [-{size}, {size})")
    return value % size


def _ring_run(cursor: Any, cap: int) -> tuple[int, int] | None:
    """``(first, n)`` when ``cursor`` is a CPU int64 tensor ``first + arange(n)`` that does not
    wrap (what torchrl's writers pass, checked in numpy: no torch op), else ``None``."""
    if (
        type(cursor) is not torch.Tensor
        or cursor.dtype != torch.int64
        or cursor.ndim != 1
        or cursor.device.type != "cpu"
        or cursor.requires_grad
    ):
        return None
    rows = cursor.numpy()
    n = rows.shape[0]
    kernels = row_kernels()
    if kernels is not None:  # one pass, no temporaries: a few times cheaper than numpy's
        first = kernels.run_start(rows, cap)
        return None if first < 0 else (first, n)
    if n == 0:
        return None
    first = int(rows[0])
    if first < 0 or first + n > cap or int(rows[-1]) != first + n - 1:
        return None
    if n > 1 and not np.array_equal(rows[1:] - rows[:-1], _ones(n - 1)):
        return None
    return first, n


_ONES = np.ones(0, dtype=np.int64)


def _ones(n: int) -> np.ndarray:
    """``n`` int64 ones (a view of a cached array)."""
    global _ONES
    if _ONES.shape[0] < n:
        _ONES = np.ones(max(n, 2 * _ONES.shape[0]), dtype=np.int64)
    return _ONES[:n]


def _is_ring_run(index: torch.Tensor, cap: int) -> bool:
    """Whether ``index`` is ``(first + arange(n)) % cap`` (what torchrl's writers pass)."""
    first = int(index[0])
    expected = (first + torch.arange(index.numel(), dtype=torch.int64, device=index.device)) % cap
    return bool(torch.equal(index, expected))


def _is_cpu_rows(index: Any) -> bool:
    """A 1-D int64 CPU tensor (what samplers hand ``get``)."""
    return (
        type(index) is torch.Tensor
        and index.dtype == torch.int64
        and index.ndim == 1
        and index.is_cpu
    )


def _index_tensor(index: Any, n: int) -> torch.Tensor:
    """A read index of a 1-D ring as an int64 tensor (bool masks become their rows)."""
    if isinstance(index, tuple):
        raise IndexError(f"StoreReplay is 1-D; got a {len(index)}-element tuple index")
    if not isinstance(index, torch.Tensor):
        index = torch.as_tensor(np.asarray(index))
    if index.dtype == torch.bool:
        if index.shape != (n,):
            raise IndexError(f"a boolean index must have shape [{n}], got {list(index.shape)}")
        index = torch.nonzero(index).reshape(-1)
    if index.dtype != torch.int64:
        if index.dtype.is_floating_point or index.dtype.is_complex:
            raise IndexError(f"index must hold integers, got {index.dtype}")
        index = index.to(torch.int64)
    return index


def _is_key(index: Any) -> bool:
    """A column key (``"obs"``, ``("next", "done")``), as opposed to a row index."""
    if isinstance(index, str):
        return True
    return type(index) is tuple and len(index) > 0 and all(isinstance(i, str) for i in index)


def _is_int_cursor(cursor: Any) -> bool:
    if isinstance(cursor, (int, np.integer)) and not isinstance(cursor, bool):
        return True
    return (
        isinstance(cursor, torch.Tensor) and cursor.ndim == 0 and not cursor.dtype.is_floating_point
    )


def _flat_rows(time_rows: torch.Tensor, width: int) -> torch.Tensor:
    """Flat rows of every env at ``time_rows`` (time-major: ``t * width + e``)."""
    if width == 1:
        return time_rows
    env = torch.arange(width, dtype=torch.int64, device=time_rows.device)
    return (time_rows.reshape(-1, 1) * width + env).reshape(-1)


def _torch_index(index: Any) -> Any:
    """An index torch tensors accept (numpy arrays and lists become tensors)."""
    if isinstance(index, tuple):
        return tuple(_torch_index(i) for i in index)
    if isinstance(index, (np.ndarray, list)):
        return torch.as_tensor(np.asarray(index))
    if isinstance(index, range):
        return torch.as_tensor(list(index), dtype=torch.int64)
    return index
