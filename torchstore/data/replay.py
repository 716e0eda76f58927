"""``StoreReplay``: the replay ring over declared columns, as a torchrl ``Storage``.

It is a drop-in for torchrl's ``LazyTensorStorage`` (``StoreReplay(max_size, device=...)``
infers the columns from the first write) and the storage torchstore's samplers read:
rows live in :class:`~torchstore.data.packed.PackedColumns` (every column of a row side
by side in one block, so a gather is one ``index_select``), an explicit episode index
(:class:`~torchstore.data.ring_episodes.RingEpisodes`) is kept as rows are written, and
the fill level and cursor are mirrored in device scalars for graph-safe samplers.

Why a ``TensorStorage`` subclass: ``ReplayBuffer`` only accepts a storage without an
explicit ``collate_fn`` if it is one, and ``SliceSampler``, ``ConsumingSampler`` and
``PrioritizedSliceSampler`` check for it too. Every member that reads torchrl's own
``_storage`` TensorDict is overridden here; ``_storage`` stays ``None`` and the packed
blocks are the data. Checkpoints go through :class:`StoreReplayCheckpointer`, which
writes a trajectory store file.

Layout rules, written down once:

* ``"index"``, the int64 entry torchrl's ``TensorDictRoundRobinWriter`` adds to every
  write, is not stored unless declared as a column: it always equals the physical row, so
  once a write has carried it, ``get`` returns it as the gathered row indices.
* Episode ends come from ``next/done``, ``next/truncated`` and ``next/terminated`` when
  any of them is a column (torchrl's nested layout, where the root ``done`` is the state
  *before* the step), else from the flat ``done``, ``truncated`` and ``terminated``;
  flags present are OR-ed. With none of them the ring holds one open episode.
* ``ndim`` is 1 or 2. With ``ndim=1`` extra batch dims of written TensorDicts become
  per-row shape. With ``ndim=2`` (torchrl's multi-env layout) written data is
  ``[T, n_envs, ...]`` after torchrl's transpose (``rb.extend`` of ``[n_envs, T]``
  batches does it), the capacity is rounded up to a multiple of ``n_envs`` on the first
  write (as torchrl does), cursors address time rows, ``len`` counts elements
  (``time rows * n_envs``), ``shape`` is ``[time rows, n_envs]`` and ``get`` takes
  torchrl's index forms (``(time, env)`` tuples, time rows, slices). Rows are stored
  time-major (flat row ``t * n_envs + e``) and each env stream keeps its own episode
  index, so windows never cross an env stream.
* Writes outside the append order (torchrl's max-value writer, a ``set`` at another row)
  are correct but rebuild the episode index in ``O(capacity)`` and give the surviving
  episodes fresh ids; ``rb[idx] = v`` rebuilds only when it changes an end flag.

Columns inferred from the first write grow as torchrl's do: a key first written later
becomes a column whose earlier rows hold its fill value (zeros; ``False`` for bool), and a
write may leave columns out (those keep what their rows held; ``rb.update_if_present``
patches columns this way). Declared columns (``columns=``) are a schema every write must
match exactly.

Checkpoints: the default :class:`StoreReplayCheckpointer` writes a trajectory store file;
torchrl's ``TensorStorageCheckpointer`` family (flat, nested, H5; their hooks included) runs
on a ``LazyTensorStorage`` copy of the ring, so its folders load into either storage
(:mod:`torchstore.data.replay_torchrl`). Sharing: pickled into a ``spawn`` child (torchrl's
``ReplayBuffer(shared=True)``), an initialised ring moves its blocks and position to shared
memory with a process-shared lock that every write (catch up, write, publish) and read
holds; a process that sees another's write rebuilds its episode index from the end flags
(fresh ids). torchrl's ``ReplayBuffer(shared=True)`` serialises its own ``extend``,
``add`` and ``sample`` across processes; the ring's lock covers the rest (direct storage
calls, ``rb[idx]``, ``len(rb)``). ``torch.compile``: ``set`` of a ``compilable=True`` ring
is graph-safe after its first eager write (see :meth:`StoreReplay._set_traced`); other
compiled writes break the graph (under ``fullgraph=True`` the break names what is
graph-safe). ``get`` is opaque to the compiler, as torchrl's is; graph-safe sampling reads
``packed``, ``fill_level`` and ``cursor_tensor`` directly.

Not supported, each refused with a clear error: sharing an empty or a ``compilable`` ring,
growing columns once shared, and, with ``ndim=2``, the trajectory store checkpoint file
(``dumps``/``loads`` with the default checkpointer; ``state_dict`` and torchrl's
checkpointers work), ``flatten()`` and prioritized windows. A tensorclass is stored, and
returned, as its TensorDict.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import re
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from pathlib import Path
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
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from torchstore.data.columns import ColumnSpec, name_from_key, validate_columns
from torchstore.data.packed import PackedColumns, row_kernels
from torchstore.data.replay_checkpoint import (
    REPLAY_FILE,
    dump_replay,
    load_replay,
    replay_from_store,
)
from torchstore.data.replay_torchrl import (
    dump_with_torchrl,
    is_torchrl_checkpointer,
    load_with_torchrl,
)
from torchstore.data.ring_episodes import RingEpisodes, age_rows
from torchstore.errors import ColumnError, UnsupportedError

__all__ = ["StoreReplay", "StoreReplayCheckpointer", "REPLAY_FILE", "END_COLUMNS"]

#: Column names that mark episode ends, nested layout first.
END_COLUMNS: tuple[tuple[str, ...], ...] = (
    ("next/done", "next/truncated", "next/terminated"),
    ("done", "truncated", "terminated"),
)
_INDEX_KEY = "index"
#: state_dict key of what torchrl's keys cannot hold (columns, episode index, cursor)
_STATE_KEY = "torchstore_replay"
_TENSOR_COLUMN = "data"
#: dynamo's frame callback getter (``None`` outside any compiled region), where torch has it
_frame_callback = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None), "get_eval_frame_callback", None
)


def _compile_disable() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch.compiler.disable()`` for a method that ``torch.compile`` must not trace, at
    no cost when nothing is compiling.

    The library wrapper enters dynamo's frame machinery on every call: about 1.2 us warm
    and 50 us with cold caches, which is what a training step leaves between two
    ``rb.sample()`` calls (``len`` and ``get`` run on every sample). Here a call made while
    no compiled region is running (no frame callback installed, the usual eager loop) runs
    the method itself; a traced call, or one from the eager part of a compiled region
    (where frames the method calls would otherwise be compiled), reaches the disabled
    version, as before.
    """

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        disabled = torch.compiler.disable(method)
        if _frame_callback is None:  # a torch without the probe: the library wrapper
            return disabled

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if is_compiling() or _frame_callback() is not None:
                return disabled(*args, **kwargs)
            return method(*args, **kwargs)

        return call

    return decorate


class StoreReplayCheckpointer(StorageCheckpointerBase):
    """torchrl checkpointer of a :class:`StoreReplay`: a trajectory store file per dump.

    torchrl's save/load hooks transform its own ``_storage`` TensorDict, which this file
    does not hold, so registering one is refused; set one of torchrl's checkpointers
    (``storage.checkpointer = TensorStorageCheckpointer()``) to run hooks.
    """

    def register_save_hook(self, hook: Any) -> None:
        raise TypeError(
            "StoreReplayCheckpointer takes no save hooks (torchrl's hooks transform its own "
            "_storage TensorDict); set storage.checkpointer = TensorStorageCheckpointer() "
            "(torchrl's folder format) to run them"
        )

    def register_load_hook(self, hook: Any) -> None:
        raise TypeError(
            "StoreReplayCheckpointer takes no load hooks (torchrl's hooks transform its own "
            "_storage TensorDict); set storage.checkpointer = TensorStorageCheckpointer() "
            "(torchrl's folder format) to run them"
        )

    def dumps(self, storage: StoreReplay, path: str | os.PathLike) -> None:
        storage._dump(Path(path))

    def loads(self, storage: StoreReplay, path: str | os.PathLike) -> None:
        storage._load(Path(path))


class StoreReplay(TensorStorage):
    """Ring-buffer replay storage over declared columns; a torchrl ``Storage``.

    Args:
        capacity: rows in the ring (torchrl's ``max_size``).
        columns: the columns (``ColumnSpec`` list or mapping name -> spec kwargs); inferred
            from the first write (dtype and per-row shape of every leaf) when omitted.
        device: where the rows live and batches land (``"auto"``: the first write's).
        ndim: 1, or 2 for torchrl's ``[T, n_envs]`` multi-env layout (the last batch dim
            of an extended ``[n_envs, T]`` batch is time).
        compilable: torchrl's flag (tensor counters instead of shared ones).

    Examples:
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=StoreReplay(1000), batch_size=32)
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> index = rb.extend(TensorDict({"obs": torch.zeros(10, 3), "done": done}, [10]))
        >>> rb.sample()["obs"].shape
        torch.Size([32, 3])
    """

    _default_checkpointer = StoreReplayCheckpointer
    # rb.update_if_present patches column views (see _conditional_patch_leaf).
    supports_conditional_update = True

    def __init__(
        self,
        capacity: int,
        *,
        columns: Sequence[ColumnSpec] | Mapping[str, Any] | None = None,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        compilable: bool = False,
    ):
        if isinstance(ndim, bool) or ndim not in (1, 2):
            raise ValueError(
                f"StoreReplay ndim ({ndim!r}) must be 1 or 2; flatten batches with more env "
                "dims to [T, n_envs] (or to rows) before extending"
            )
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, (int, np.integer))
            or capacity < 1
        ):
            raise ValueError(f"StoreReplay capacity ({capacity!r}) must be a positive int")
        self._episodes = RingEpisodes(int(capacity))
        self._streams = [self._episodes]
        # shared with spawned processes: int64 [rows, cursor, revision] (see _share), and
        # the lock every process holds to change or read them with the rows
        self._shared: torch.Tensor | None = None
        self._lock: Any = None
        self._shared_np: np.ndarray | None = None
        self._seen_revision = 0
        # rows were written inside torch.compile: the episode index is behind (see _follow)
        self._traced_writes = False
        self._width = 1
        super().__init__(
            storage=None, max_size=int(capacity), device=device, ndim=ndim, compilable=compilable
        )
        self._declared = None if columns is None else validate_columns(columns)
        self._packed: PackedColumns | None = None
        self._end_names: tuple[str, ...] = ()
        self._tensor_mode = False
        # pytree data (tuples, lists, plain dicts): the structure of one row, else None
        self._treespec: Any = None
        # batch dims of TensorDict rows past the storage's (torchrl keeps them as batch dims)
        self._row_batch: tuple[int, ...] = ()
        self._layout_known = False
        self._returns_index = False
        self._segments_cache: tuple[int, tuple[torch.Tensor, ...]] | None = None
        # the leaf signature of the last write that needed no conversion (see _validate)
        self._trusted_signature: tuple | None = None
        self._trusted_names: tuple[str, ...] = ()
        # how repeats of the last validated structures are appended in one compiled pass
        # (a few: a buffer's writes carry torchrl's "index", direct set calls may not)
        self._append_plans: list[_AppendPlan] = []
        # numpy views of the CPU device scalars [fill_level, cursor_tensor] (see _sync_scalars)
        self._scalar_views: tuple[Any, ...] | None = None
        scalar_device = "cpu" if self.device == "auto" else self.device
        self.fill_level = torch.zeros((), dtype=torch.int64, device=scalar_device)
        self.cursor_tensor = torch.zeros((), dtype=torch.int64, device=scalar_device)
        if self._declared is not None and self.device != "auto" and ndim == 1:
            self._allocate(self._declared)

    # ----------------------------------------------------------------- public state
    @property
    def capacity(self) -> int:
        return self.max_size

    @property
    def cursor(self) -> int:
        """Physical (flat) row the next ring write goes to (``time row * n_envs`` when ndim=2)."""
        if self._shared is not None or self._traced_writes:
            with self._guard():
                self._follow()
                return self._episodes.cursor * self._width
        return self._episodes.cursor * self._width

    @property
    def n_envs(self) -> int:
        """Env streams per time row (1 with ``ndim=1``; known after the first write with 2)."""
        return self._width

    @property
    def time_capacity(self) -> int:
        """Time rows in the ring (``capacity // n_envs``; the capacity with ``ndim=1``)."""
        return self.max_size // self._width

    @property
    def columns(self) -> tuple[ColumnSpec, ...] | None:
        """The columns (``None`` until the first write when they are inferred)."""
        return None if self._packed is None else self._packed.columns

    @property
    def packed(self) -> PackedColumns:
        """The resident blocks (for samplers that gather into preallocated buffers)."""
        if self._packed is None:
            raise RuntimeError("StoreReplay holds no columns yet: write rows or declare columns")
        return self._packed

    @property
    def next_episode_id(self) -> int:
        if self._width == 1:
            return self._episodes.next_episode_id
        return max(s.next_episode_id for s in self._streams) * self._width

    def episode_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start, length, episode_id)``: int64 ``[n]`` on the device, oldest first.

        One entry per surviving (part of an) episode, the one being written included. The
        rows of segment ``i`` are ``(start[i] + arange(length[i])) % capacity``; no segment
        crosses an episode end or the ring's wrap point (the cursor).

        With ``ndim=2`` the segments of every env stream are listed, stream by stream:
        ``start`` is then a *time* row of stream :meth:`segment_streams` ``[i]`` (its rows
        are ``((start[i] + arange(length[i])) % time_capacity, env)``) and episode ids are
        ``stream_id * n_envs + env``, unique over the ring.
        """
        return self._segment_table()[1]

    def segment_streams(self) -> torch.Tensor:
        """The env stream of each :meth:`episode_segments` entry (all 0 with ``ndim=1``)."""
        return self._segment_table()[2]

    def _segment_table(self) -> tuple[Any, ...]:
        if self._shared is None and not self._traced_writes:
            return self._segment_columns()
        with self._guard():
            self._follow()
            return self._segment_columns()

    def _segment_columns(self) -> tuple[Any, ...]:
        version = tuple(s.version for s in self._streams)
        cached = self._segments_cache
        if cached is None or cached[0] != version:
            width = self._width
            parts = []
            for env, stream in enumerate(self._streams):
                start, length, ids = stream.segments()
                parts.append(
                    torch.stack([start, length, ids * width + env, torch.full_like(ids, env)])
                )
            table = torch.cat(parts, 1)
            device = torch.device("cpu") if self.device == "auto" else self.device
            columns = table.to(device).unbind(0)
            cached = (version, columns[:3], columns[3])
            self._segments_cache = cached
        return cached

    def align_writer(self, target: Any) -> None:
        """Point a buffer's (or writer's) round-robin cursor at this ring's cursor.

        A fresh writer starts at row 0; after :meth:`from_store` or ``loads`` on a ring
        that is not full, call this so new rows append after the restored ones.
        """
        writer = getattr(target, "_writer", target)
        writer._cursor = self._episodes.cursor

    # ----------------------------------------------------------------- ring state
    def ring_state(self) -> dict[str, Any]:
        """The ring's position and the layout of written data, as plain values (``ndim=1``).

        What a checkpoint keeps beside the rows (oldest first) and the episode lengths:
        ``rows``, ``cursor``, ``open`` (the newest episode is still being written),
        ``next_episode_id``, ``episode_ids`` (one per :meth:`episode_segments` entry),
        ``last_cursor_index``, ``tensor_mode``, ``returns_index``, ``treespec``
        (serialised) and ``row_batch``. :meth:`restore_ring` takes it back.
        """
        self._refuse_multi_env("ring_state()")
        index = self._episodes
        return {
            "rows": index.rows,
            "cursor": index.cursor,
            "open": index.is_open,
            "next_episode_id": index.next_episode_id,
            "episode_ids": index.segments()[2].tolist(),
            "last_cursor_index": self._last_cursor_index,
            "tensor_mode": self._tensor_mode,
            "returns_index": self._returns_index,
            "treespec": None if self._treespec is None else pytree.treespec_dumps(self._treespec),
            "row_batch": list(self._row_batch),
        }

    def restore_ring(self, lengths: torch.Tensor, state: Mapping[str, Any]) -> None:
        """Set the position and episode index of rows already in :attr:`packed` (``ndim=1``).

        ``state`` is as :meth:`ring_state` returns it; ``lengths`` are the lengths of the
        episodes ``state["episode_ids"]`` names, oldest first. The layout keys
        (``tensor_mode`` and those after it) are optional: without them the layout stays
        what the columns give.
        """
        self._refuse_multi_env("restore_ring()")
        with self._guard():
            self._restore_ring(lengths, state)
        self._bump_mutation_revision()

    def _restore_ring(self, lengths: torch.Tensor, state: Mapping[str, Any]) -> None:
        self._episodes.load(
            lengths,
            torch.as_tensor(state["episode_ids"], dtype=torch.int64),
            rows=int(state["rows"]),
            cursor=int(state["cursor"]),
            is_open=bool(state["open"]),
            next_episode_id=int(state["next_episode_id"]),
        )
        if "tensor_mode" in state:
            self._tensor_mode = bool(state["tensor_mode"])
            self._returns_index = bool(state.get("returns_index", False))
            spec = state.get("treespec")
            self._treespec = None if spec is None else pytree.treespec_loads(spec)
            self._row_batch = tuple(int(d) for d in state.get("row_batch", ()))
            self._layout_known = True
        last = state.get("last_cursor_index")
        self._set_last_cursor(-1 if last is None else int(last))
        self._sync_scalars()

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

    def _refuse_multi_env(self, what: str) -> None:
        if self.ndim != 1:
            raise UnsupportedError(
                f"StoreReplay(ndim={self.ndim}).{what} is not supported: it holds one "
                "episode stream per env"
            )

    @property
    def checkpointer(self) -> StorageCheckpointerBase:
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, value: StorageCheckpointerBase | None) -> None:
        # StoreReplayCheckpointer (a trajectory store file), or one of torchrl's
        # TensorStorage checkpointers, run on a LazyTensorStorage copy (replay_torchrl).
        if value is None:
            value = StoreReplayCheckpointer()
        elif not isinstance(value, StoreReplayCheckpointer) and not is_torchrl_checkpointer(value):
            raise UnsupportedError(
                f"StoreReplay checkpoints with StoreReplayCheckpointer (its own HDF5 file) or "
                f"torchrl's TensorStorageCheckpointer family, got {type(value).__name__}; drop "
                "the buffer's checkpointer= argument to use StoreReplayCheckpointer"
            )
        self._checkpointer = value

    def dumps(self, path: str | os.PathLike) -> None:
        with self._guard():  # a shared ring: no process writes while the dump reads
            if isinstance(self._checkpointer, StoreReplayCheckpointer):
                self._checkpointer.dumps(self, path)
            else:
                dump_with_torchrl(self, self._checkpointer, path)

    def loads(self, path: str | os.PathLike) -> None:
        with self._guard():
            if isinstance(self._checkpointer, StoreReplayCheckpointer):
                self._checkpointer.loads(self, path)
            else:
                load_with_torchrl(self, self._checkpointer, path)
            self._sync_scalars()
        self._bump_mutation_revision()

    # ----------------------------------------------------------------- torchrl sizes
    @_compile_disable()
    def __len__(self) -> int:
        if self._shared is not None or self._traced_writes:
            with self._guard():
                self._follow()
                return self._episodes.rows * self._width
        return self._episodes.rows * self._width

    @property
    def _len(self) -> int:
        if self._shared is not None or self._traced_writes:
            with self._guard():
                self._follow()
                return self._episodes.rows * self._width
        return self._episodes.rows * self._width

    @_len.setter
    def _len(self, value: int) -> None:
        # torchrl's writer.write_at (ConsumingSampler) assigns the length directly.
        value = int(value)
        index = getattr(self, "_episodes", None)
        if index is None or value == index.rows * self._width:
            return
        if not 0 <= value <= self.max_size or value % self._width:
            raise ValueError(
                f"length ({value}) must be in [0, {self.max_size}] and a multiple of "
                f"n_envs ({self._width})"
            )
        with self._guard():
            self._rebuild(rows=value // self._width, cursor=index.cursor)
            self._sync_scalars()

    def _max_size_along_dim0(self, *, single_data: Any = None, batched_data: Any = None) -> int:
        # torchrl's writers ask on every write: the time rows, once the ring knows them
        if self.ndim == 1:
            return self.max_size
        if self.initialized:
            return self.time_capacity
        return super()._max_size_along_dim0(single_data=single_data, batched_data=batched_data)

    @property
    def _total_shape(self) -> torch.Size | None:
        if not self.initialized:
            return None
        if self.ndim == 1:
            return torch.Size([self.max_size])
        return torch.Size([self.time_capacity, self._width])

    def _init_streams(self, n_envs: int) -> None:
        """ndim=2, first write: one episode index per env; capacity rounded up as torchrl."""
        if n_envs < 1:
            raise ColumnError(f"ndim=2 rows need at least one env (got {n_envs} along dim 1)")
        time_capacity = -(self.max_size // -n_envs)
        self.max_size = time_capacity * n_envs
        self._width = n_envs
        self._streams = [RingEpisodes(time_capacity) for _ in range(n_envs)]
        self._episodes = self._streams[0]
        self._segments_cache = None

    def flatten(self) -> StoreReplay:
        if self.ndim == 1:
            return self
        raise UnsupportedError(
            "StoreReplay(ndim=2).flatten() is not supported: build a StoreReplay(ndim=1) and "
            "extend it with storage[:].reshape(-1)"
        )

    # ----------------------------------------------------------------- allocation
    def _allocate(self, columns: Sequence[ColumnSpec], packed: PackedColumns | None = None) -> None:
        columns = validate_columns(columns)
        if self._declared is not None and self._packed is None:
            _check_same_columns(self._declared, columns, what="declared")
        if packed is None:
            packed = PackedColumns(columns, self.max_size, self.device)
        self._packed = packed
        names = {c.name for c in columns}
        self._end_names = ()
        for group in END_COLUMNS:
            present = tuple(n for n in group if n in names)
            if present:
                self._end_names = present
                break
        self.fill_level = self.fill_level.to(self.device)
        self.cursor_tensor = self.cursor_tensor.to(self.device)
        self._segments_cache = None
        self._trusted_signature = None
        self._append_plans = []
        self._scalar_views = None
        self.initialized = True

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

    # ----------------------------------------------------------------- writes
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
        columns, is eager).
        """
        signature = None
        if isinstance(data, TensorDictBase) and self._packed is not None:
            leaves = _named_leaves(data)
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
                "(names, dtypes, per-row shapes; the first write is eager); write this one "
                "eagerly"
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
        if not self.initialized:
            self._infer(batch)
        self._check_layout(tensor_input)
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
            self._infer(batch.reshape(-1))
        self._check_layout(tensor_input)
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
        batch, _ = _as_batch(data, sel.ndim == 0, dims=max(sel.ndim, 1))
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

    def _check_layout(self, mode: Any) -> None:
        """The first write sets what reads return (its structure); later ones must match."""
        if not self._layout_known:
            self._tensor_mode = mode is True
            self._treespec = None if isinstance(mode, (bool, tuple)) else mode
            self._row_batch = mode if isinstance(mode, tuple) else ()
            self._layout_known = True
            return
        first = True if self._tensor_mode else (self._treespec or self._row_batch)
        if first is mode or (not isinstance(mode, bool) and mode == first):
            return

        def what(m: Any) -> str:
            if m is True:
                return "bare tensors"
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

    def _validate(
        self, batch: TensorDictBase, n: int, dims: int = 1
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The written columns' values in their storage dtype, and the rows' end flags.

        ``batch`` has ``dims`` leading row dims (``n`` rows in all); the values keep them.
        A write whose leaves have the names, dtypes, per-row shapes and devices of the last
        write that needed no conversion is trusted without re-checking the schema.
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
        values = self._check_leaves(flat, n)
        if all(values[name] is flat.get(name) for name in values) and len(values) == len(leaves) - (
            _INDEX_KEY in leaves and _INDEX_KEY not in values
        ):
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

    def _check_leaves(self, leaves: dict[str, Any], n: int) -> dict[str, torch.Tensor]:
        """Full schema check of one write; adds the columns an inferred ring grows by."""
        specs = self._packed._specs
        if _INDEX_KEY in leaves and _INDEX_KEY not in specs:
            leaves = {k: v for k, v in leaves.items() if k != _INDEX_KEY}
            self._returns_index = True
        missing = [name for name in specs if name not in leaves]
        extra = [name for name in leaves if name not in specs]
        self._check_key_sets(specs, leaves, missing, extra)
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
        strict = self._declared is not None or self._tensor_mode or self._treespec is not None
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
        if spec is None or self._tensor_mode or self._treespec is not None:
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

    def _end_flags(self, index: torch.Tensor) -> torch.Tensor:
        """End flags of physical rows ``index`` (CPU bool)."""
        index = index.to(self.device)
        flags = torch.zeros(index.numel(), dtype=torch.bool, device=self.device)
        for name in self._end_names:
            flags |= (
                self._packed.view(name).index_select(0, index).reshape(index.numel(), -1).any(-1)
            )
        return flags.cpu()

    def _rebuild(self, *, rows: int, cursor: int) -> None:
        if self.ndim > 1:
            width = self._width
            ages = age_rows(rows, cursor, self.time_capacity)
            if self._end_names and self._packed is not None:
                flags = self._end_flags(_flat_rows(ages, width)).reshape(rows, width)
            else:
                flags = torch.zeros(rows, width, dtype=torch.bool)
            for env, stream in enumerate(self._streams):
                stream.rebuild(flags[:, env], rows=rows, cursor=cursor)
            self._segments_cache = None
            return
        if self._end_names and self._packed is not None:
            ends = self._end_flags(age_rows(rows, cursor, self.max_size))
        else:
            ends = torch.zeros(rows, dtype=torch.bool)
        self._episodes.rebuild(ends, rows=rows, cursor=cursor)

    def _sync_scalars(self) -> None:
        """After every change of the ring: the device scalars, and the shared position.

        A shared ring calls it holding the lock. The cursor moves before the fill level:
        a sampler that reads the two scalars while a write lands (outside a lock) sees at
        worst the new cursor with the old fill level, a window of written rows only.
        """
        views = self._scalar_views
        if views is None or views[0] is not self.fill_level or views[1] is not self.cursor_tensor:
            views = self._scalar_views = _scalar_views(self.fill_level, self.cursor_tensor)
        if views[2] is None:
            self.cursor_tensor.fill_(self._episodes.cursor * self._width)
            self.fill_level.fill_(self._episodes.rows * self._width)
        else:  # CPU scalars: through numpy views, a fraction of two fill_ calls
            views[3][()] = self._episodes.cursor * self._width
            views[2][()] = self._episodes.rows * self._width
        if self._shared is not None:
            shared = self._shared_np
            shared[0], shared[1] = self._episodes.rows, self._episodes.cursor
            shared[2] += 1
            self._seen_revision = int(shared[2])

    # ----------------------------------------------------------------- sharing
    def _share(self) -> None:
        """Put the rows and the ring position in shared memory (pickled for a spawned process).

        The episode index stays per process: one that sees another's write (the shared
        revision moved) rebuilds it from the end flags, giving the episodes fresh ids.
        """
        if self._shared is not None:
            return
        if self._compilable:
            raise UnsupportedError(
                "a StoreReplay(compilable=True) cannot be shared between processes (as "
                "torchrl's compilable storages); build it with compilable=False to share it"
            )
        if not self.initialized or self._packed is None:
            raise UnsupportedError(
                "StoreReplay is shared with spawned processes once it holds columns: write "
                "rows (or declare columns=) before sharing (torchrl's shared_init, a lazy "
                "first write by a child, is not supported)"
            )
        if self._packed.device.type == "cpu":
            # the device scalars too: samplers read fill_level without calling len()
            for tensor in (*self._packed.blocks, self.fill_level, self.cursor_tensor):
                tensor.share_memory_()
        self._scalar_views = None  # share_memory_ moved the scalars: views of the old memory
        self._shared = torch.zeros(3, dtype=torch.int64).share_memory_()
        self._shared_np = self._shared.numpy()
        # spawn's context: a lock torchrl's spawned processes can take (pickled with the ring)
        self._lock = multiprocessing.get_context("spawn").RLock()
        self._sync_scalars()

    def _guard(self) -> Any:
        """The shared ring's lock, held to change or read the rows with their position."""
        return self._lock if self._lock is not None else contextlib.nullcontext()

    def _follow(self) -> None:
        """Catch the host-side index up with writes made inside ``torch.compile`` (their
        position is in the device scalars) and by other processes (a shared ring)."""
        if self._traced_writes:
            self._traced_writes = False
            rows = int(self.fill_level) // self._width
            cursor = int(self.cursor_tensor) // self._width
            self._rebuild(rows=rows, cursor=cursor)
            self._segments_cache = None
        if self._shared is not None:
            self._follow_shared()

    def _follow_shared(self) -> None:
        """Adopt another process's writes: its position, then a rebuilt episode index."""
        shared = self._shared_np
        if int(shared[2]) == self._seen_revision:
            return
        self._seen_revision = int(shared[2])
        rows, cursor = int(shared[0]), int(shared[1])
        self._rebuild(rows=rows, cursor=cursor)
        self._segments_cache = None
        self.fill_level.fill_(rows * self._width)
        self.cursor_tensor.fill_(cursor * self._width)
        last = (cursor - 1) % self.time_capacity if rows else -1
        self._set_last_cursor(last)

    def _empty(self) -> None:
        with self._guard():
            for stream in self._streams:
                stream.reset()
            self._segments_cache = None
            self._sync_scalars()
        self._bump_mutation_revision()

    # ----------------------------------------------------------------- reads
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
                return self._slice(r.start, max(r.start, r.stop))
            index = torch.arange(r.start, r.stop, r.step, dtype=torch.int64, device=self.device)
        index = _index_tensor(index, n)
        if index.ndim == 0:
            return self._get_row(int(index), n)
        return self._gather_valid(index.to(self.device), n)

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
        out = self._from_blocks(self._packed.gather_blocks(flat), flat)
        if self._tensor_mode or self._treespec is not None:
            return pytree.tree_map(lambda x: x.reshape(*sel.shape, *x.shape[1:]), out)
        return out.reshape(*sel.shape, *self._row_batch)

    def _from_blocks(self, blocks: list[torch.Tensor], index: Any) -> Any:
        if self._tensor_mode:
            return self._packed.leaf(blocks, _TENSOR_COLUMN)
        if self._treespec is not None:
            td = self._packed.batch_from_blocks(blocks)
            leaves = [td.get(key) for key in _leaf_keys(self._packed.columns)]
            return pytree.tree_unflatten(leaves, self._treespec)
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

    # ----------------------------------------------------------------- state dict
    def state_dict(self) -> dict[str, Any]:
        """The ring as torchrl's ``LazyTensorStorage`` state (which it loads) plus our own.

        ``_storage``, ``initialized`` and ``_len`` are torchrl's keys with torchrl's
        contents (every slot of the ring, in its physical layout: ``[capacity]`` or
        ``[time rows, n_envs]``), so ``LazyTensorStorage.load_state_dict`` takes it;
        ``"torchstore_replay"`` adds the columns, the episode index and the cursor (and the
        raw blocks for pytree data and quantised columns, which torchrl cannot hold).
        """
        packed = self._packed
        own: dict[str, Any] = {
            "initialized": self.initialized,
            "columns": None if packed is None else [c.to_dict() for c in packed.columns],
            "capacity": self.max_size,
            "tensor_mode": self._tensor_mode,
            "returns_index": self._returns_index,
            "last_cursor_index": self._last_cursor_index,
            "ndim": self.ndim,
            "n_envs": self._width,
            "treespec": None if self._treespec is None else pytree.treespec_dumps(self._treespec),
            "row_batch": list(self._row_batch),
            "streams": [s.state_dict() for s in self._streams],
        }
        state: dict[str, Any] = {_STATE_KEY: own}
        if packed is None:
            state.update(_storage={}, initialized=False, _len=0)
            return state
        if self._treespec is not None or any(c.storage_dtype != c.dtype for c in packed.columns):
            own["blocks"] = [b.clone() for b in packed.blocks]
        if self._treespec is None:
            state.update(_storage=self._torchrl_storage(), initialized=True, _len=len(self))
        return state

    def _torchrl_storage(self) -> Any:
        """Every slot as torchrl's ``_storage`` holds it (a copy): tensor or TD state dict."""
        cap = self.max_size
        out = self._from_blocks(
            [b[0:cap] for b in self._packed.blocks],
            lambda: torch.arange(cap, device=self.device),
        )
        if self.ndim > 1:
            shape = (self.time_capacity, self._width)
            out = (
                out.reshape(*shape, *out.shape[1:])
                if self._tensor_mode
                else out.unflatten(0, shape)
            )
        if self._tensor_mode:
            return out.clone()
        return out.clone().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`, or from torchrl's ``LazyTensorStorage`` state.

        Copies (the caller's tensors are not kept). A torchrl state holds no cursor: a full
        ring is taken to have wrapped exactly (the next write goes to row 0), and the
        episode index is rebuilt from the end columns.

        Raises:
            ValueError: if the state is neither, or its capacity, ``ndim`` or env count
                differ from this ring's.
        """
        with self._guard():
            self._load_state(state_dict)
            self._sync_scalars()
        self._bump_mutation_revision()

    def _load_state(self, state_dict: Mapping[str, Any]) -> None:
        if _STATE_KEY in state_dict:
            self._load_own(state_dict[_STATE_KEY], state_dict)
        elif "columns" in state_dict:  # the layout written before torchrl's keys were kept
            self._load_own(state_dict, state_dict, blocks=state_dict["_storage"].get("blocks"))
        elif "_storage" in state_dict and "initialized" in state_dict:
            self._load_torchrl(state_dict)
        else:
            raise ValueError(
                "not a StoreReplay or torchrl TensorStorage state dict: expected the keys "
                f"'{_STATE_KEY}' or '_storage' and 'initialized', got {sorted(state_dict)}"
            )

    def _check_geometry(self, ndim: int, capacity: int, n_envs: int, initialized: bool) -> None:
        if ndim != self.ndim:
            raise ValueError(f"state holds a ring of ndim={ndim}, this one has ndim={self.ndim}")
        if ndim > 1 and initialized:
            if not self.initialized and self._width == 1:
                if -(self.max_size // -n_envs) * n_envs != capacity:
                    raise ValueError(
                        f"state holds a ring of capacity {capacity}, this one has "
                        f"{self.max_size} (rounded up to a multiple of {n_envs} envs: "
                        f"{-(self.max_size // -n_envs) * n_envs})"
                    )
                self._init_streams(n_envs)
            elif n_envs != self._width:
                raise ValueError(f"state holds {n_envs} env streams, this ring has {self._width}")
        if capacity != self.max_size:
            raise ValueError(
                f"state holds a ring of capacity {capacity}, this one has {self.max_size}"
            )

    def _load_own(
        self, own: Mapping[str, Any], state: Mapping[str, Any], blocks: Any = None
    ) -> None:
        initialized = bool(own["initialized"])
        self._check_geometry(
            int(own.get("ndim", 1)),
            int(own.get("capacity", self.max_size)),
            int(own.get("n_envs", 1)),
            initialized,
        )
        if not initialized:
            for stream in self._streams:
                stream.reset()
            self._segments_cache = None
        else:
            columns = [ColumnSpec.from_dict(c) for c in own["columns"]]
            self._adopt_columns(columns)
            self._tensor_mode = bool(own.get("tensor_mode", False))
            spec = own.get("treespec")
            self._treespec = None if spec is None else pytree.treespec_loads(spec)
            self._row_batch = tuple(int(d) for d in own.get("row_batch", ()))
            self._layout_known = True
            self._returns_index = bool(own.get("returns_index", False))
            blocks = own.get("blocks", blocks)
            if blocks is not None:
                for block, saved in zip(self._packed.blocks, blocks, strict=True):
                    if block.shape != saved.shape or block.dtype != saved.dtype:
                        raise ValueError(
                            f"saved block {saved.dtype}{list(saved.shape)} does not match "
                            f"{block.dtype}{list(block.shape)}"
                        )
                    block.copy_(saved)
            else:
                rows = _torchrl_rows(state["_storage"], self.ndim, self.max_size)
                values, _ = self._validate(rows, self.max_size)
                self._packed.write(slice(None), values)
            streams = own.get("streams") or [own["episodes"]]
            for stream, saved in zip(self._streams, streams, strict=True):
                stream.load_state_dict(saved)
            self._segments_cache = None
        last = own.get("last_cursor_index")
        self._set_last_cursor(-1 if last is None else int(last))

    def _load_torchrl(self, state: Mapping[str, Any]) -> None:
        """Load torchrl's ``TensorStorage`` state: its valid slots become the ring's rows."""
        data = state["_storage"]
        if isinstance(data, Mapping):
            data = TensorDict().load_state_dict(data, strict=False)
            if data.batch_dims < self.ndim:
                data.auto_batch_size_(self.ndim)
        elif not isinstance(data, torch.Tensor):
            raise ValueError(
                f"torchrl state '_storage' holds {type(data).__name__}; a StoreReplay loads "
                "tensors and TensorDict state dicts"
            )
        for stream in self._streams:
            stream.reset()
        self._segments_cache = None
        if not state["initialized"]:
            return
        n_envs = int(data.shape[1]) if self.ndim > 1 else 1
        self._check_geometry(self.ndim, int(data.shape[0]) * n_envs, n_envs, True)
        steps = int(state["_len"]) // n_envs
        if steps:
            self.set(torch.arange(steps), data[:steps])
        self._set_last_cursor(steps - 1 if steps else -1)

    def _adopt_columns(self, columns: Sequence[ColumnSpec]) -> None:
        columns = validate_columns(columns)
        if self._packed is not None:
            _check_same_columns(self._packed.columns, columns, what="this replay's")
            return
        if self.device == "auto":
            self.device = torch.device("cpu")
        self._allocate(columns)

    # ----------------------------------------------------------------- checkpoints
    def _dump(self, path: Path) -> None:
        dump_replay(self, path)

    def _load(self, path: Path) -> None:
        load_replay(self, path)

    @classmethod
    def from_store(
        cls,
        store: Any,
        capacity: int | None = None,
        *,
        device: torch.device | str = "cpu",
        compilable: bool = False,
        columns: Sequence[str] | None = None,
    ) -> StoreReplay:
        """A ring prefilled from a trajectory store (offline-to-online).

        Columns come from the store (all, or the names in ``columns``); its episodes become
        the ring's (ids are the store's episode numbers). When ``capacity`` is smaller than
        the store, the newest rows are kept (the oldest kept episode may be partial). From a
        replay checkpoint (``dumps``) the episode ids and the open episode are kept
        (``loads`` restores the exact ring). Rows are laid out oldest first from row 0;
        call :meth:`align_writer` before extending a ring that is not full.
        """
        return replay_from_store(
            cls, store, capacity, device=device, compilable=compilable, columns=columns
        )

    # ----------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:
            self._share()  # the blocks and the position go to shared memory, then pickle
            state = Storage.__getstate__(self)  # the lock goes with the ring
        else:
            state = Storage.__getstate__(self)
            state.pop("_lock", None)  # a copy (pickle, deepcopy): its own lock, made below
        state.pop("_shared_np", None)
        # process-local: views of this process's memory, rebuilt on the first write
        state.pop("_append_plans", None)
        state.pop("_scalar_views", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        Storage.__setstate__(self, state)
        shared = state.get("_shared")
        self._shared_np = None if shared is None else shared.numpy()
        self._append_plans = []
        self._scalar_views = None
        if getattr(self, "_lock", None) is None:
            self._lock = None if shared is None else multiprocessing.get_context("spawn").RLock()

    def __repr__(self) -> str:
        cols = (
            "inferred on first write"
            if self.columns is None
            else ", ".join(f"{c.name}: {c.describe()}" for c in self.columns)
        )
        return (
            f"StoreReplay(capacity={self.max_size}, len={len(self)}, cursor={self.cursor}, "
            f"device={self.device}, episodes={self._episodes.num_segments}, columns=[{cols}])"
        )


# --------------------------------------------------------------------- helpers
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


def _scalar_views(fill_level: torch.Tensor, cursor: torch.Tensor) -> tuple[Any, ...]:
    """``(fill_level, cursor, fill numpy view, cursor numpy view)``; the views are ``None``
    unless both are plain CPU tensors."""
    if all(
        type(t) is torch.Tensor and t.is_cpu and not t.requires_grad for t in (fill_level, cursor)
    ):
        return fill_level, cursor, fill_level.numpy(), cursor.numpy()
    return fill_level, cursor, None, None


class _AppendPlan:
    """How a write with a validated leaf structure is appended in one compiled pass.

    Made from the trusted leaf signature (see ``StoreReplay._validate``) of a CPU ring
    whose columns sit in one packed block, with the row kernels on: the keys of the
    TensorDict, nested as written, and for each leaf its dtype, per-row shape and device,
    which a later write must match exactly (so only a validated structure reaches the
    kernel), where its column's bytes sit in a block row, and the address table and
    end-row buffers the kernel (:func:`torchstore.data.rowcopy.append_rows`) reuses from
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
        # rowcopy.append_rows's compiled kernel itself (its wrapper costs a call a write)
        self.kernel = row_kernels()._append_rows

    @staticmethod
    def make(replay: StoreReplay, dims: int, signature: tuple) -> _AppendPlan | None:
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

    def write(self, data: TensorDict, cursor: torch.Tensor, first: int, replay: StoreReplay) -> int:
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


def _is_ring_run(index: torch.Tensor, cap: int) -> bool:
    """Whether ``index`` is ``(first + arange(n)) % cap`` (what torchrl's writers pass)."""
    first = int(index[0])
    expected = (first + torch.arange(index.numel(), dtype=torch.int64, device=index.device)) % cap
    return bool(torch.equal(index, expected))


def _torchrl_rows(data: Any, ndim: int, capacity: int) -> TensorDictBase:
    """torchrl's ``_storage`` (a tensor or a TensorDict state dict) as ``[capacity]`` rows."""
    if isinstance(data, torch.Tensor):
        return TensorDict({_TENSOR_COLUMN: data.reshape(capacity, *data.shape[ndim:])}, [capacity])
    td = TensorDict().load_state_dict(data, strict=False)
    if td.batch_dims < ndim:
        td.auto_batch_size_(ndim)
    td = td.flatten(0, ndim - 1) if ndim > 1 else td
    if td.batch_dims > 1:
        td = td.copy()
        td.batch_size = td.batch_size[:1]
    return td


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


def _flat(values: Mapping[str, Any], dims: int) -> dict[str, Any]:
    """Every value with its ``dims`` leading dims flattened to rows (a copy if strided)."""
    return {
        k: v.flatten(0, dims - 1) if isinstance(v, torch.Tensor) else v for k, v in values.items()
    }


def _rows_from(values: dict[str, torch.Tensor], first: int) -> dict[str, torch.Tensor]:
    """Every column's rows from ``first`` on (the same dict when ``first`` is 0)."""
    return values if first == 0 else {k: v[first:] for k, v in values.items()}


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
    """A list of rows (torchrl's ``set`` accepts one) as one stacked batch."""
    if not data:
        raise ValueError("cannot write an empty list of rows")
    if all(isinstance(x, torch.Tensor) for x in data):
        return torch.stack(data)
    return torch.stack([_as_batch(x, True)[0][0] for x in data])


def _tensor_batch(data: torch.Tensor, single: bool, dims: int) -> TensorDictBase:
    if single:
        data = data.unsqueeze(0)
    if data.ndim < dims:
        raise ColumnError(
            f"written rows need {dims} leading batch dimension(s), got a tensor of shape "
            f"{list(data.shape)}"
        )
    return TensorDict({_TENSOR_COLUMN: data}, batch_size=data.shape[:dims])


def _tensordict_batch(data: Any, single: bool, dims: int) -> tuple[TensorDictBase, tuple[int, ...]]:
    if isinstance(data, LazyStackedTensorDict):
        try:
            data = data.contiguous()
        except RuntimeError as exc:
            raise ColumnError(
                f"a lazily stacked TensorDict whose entries differ in shape cannot be stored "
                f"as columns (densify or pad it first): {exc}"
            ) from None
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
