"""``StoreReplay``: the replay ring over declared columns, as a torchrl ``Storage``.

It is a drop-in for torchrl's ``LazyTensorStorage`` (``StoreReplay(max_size, device=...)``
infers the columns from the first write) and the storage torchstore's samplers read:
rows live in :class:`~torchstore.data.rows.packed.PackedColumns` (every column of a row side
by side in one block, so a gather is one ``index_select``), an explicit episode index
(:class:`~torchstore.data.replay.ring_episodes.RingEpisodes`) is kept as rows are written, and
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
* A ``LazyStackedTensorDict`` whose entries differ in keys or leaf shapes (stacked past
  the rows) is kept as torchrl keeps it: one column per entry leaf (``j/obs``),
  read back as the lazy stack; entries that differ only in dtypes are densified (dtypes
  promoted), as torchrl does. A list of rows is stacked as torchrl's ``set`` stacks it
  (TensorDicts keep their batch dims).
* A full read of a ring of TensorDicts (``storage[:]``, ``rb[:]``) is a
  :class:`~torchstore.data.replay.live_rows.LiveRows`: its item assignment writes the ring
  too, which is how torchrl's ``rb[key] = v`` and ``rb[i, j] = v`` reach the storage (a
  write the ring's columns refuse raises; a full read of lazily stacked rows is locked,
  so a key assigned to it raises; with ``ndim=2`` its rows are not rewritten in place).
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
(:mod:`torchstore.data.replay.torchrl_checkpointers`). Sharing: pickled into a ``spawn`` child
(torchrl's ``ReplayBuffer(shared=True)``), an initialised ring moves its blocks and position to
shared memory with a process-shared lock that every write (catch up, write, publish) and read
holds; a process that sees another's write rebuilds its episode index from the end flags
(fresh ids). torchrl's ``ReplayBuffer(shared=True)`` serialises its own ``extend``,
``add`` and ``sample`` across processes; the ring's lock covers the rest (direct storage
calls, ``rb[idx]``, ``len(rb)``). ``torch.compile``: ``set`` of a ``compilable=True`` ring
is graph-safe after its first eager write (see :meth:`StoreReplay._set_traced`); other
compiled writes break the graph (under ``fullgraph=True`` the break names what is
graph-safe; a bare tensor on a ring of bare tensors is). ``get`` is opaque to the
compiler, as torchrl's is; graph-safe sampling reads ``packed``, ``fill_level`` and
``cursor_tensor`` directly.

Not supported, each refused with a clear error: sharing an empty or a ``compilable`` ring,
growing columns once shared, and, with ``ndim=2``, the trajectory store checkpoint file
(``dumps``/``loads`` with the default checkpointer; ``state_dict`` and torchrl's
checkpointers work), ``flatten()`` and prioritized windows. A tensorclass is stored, and
returned, as its TensorDict.

Where the code is: this module holds the class (constructor, public properties, torchrl's
sizes, the episode index upkeep, checkpoint selection) and :class:`StoreReplayCheckpointer`;
``StoreReplay`` inherits the rest from one mixin per concern:

* :mod:`torchstore.data.replay.writes`: ``set`` (traced, planned and general writes, ``ndim=2``);
* :mod:`torchstore.data.replay.ring_columns`: allocation, write validation, late columns, patches;
* :mod:`torchstore.data.replay.reads`: ``get`` and its gathers (full reads:
  :mod:`torchstore.data.replay.live_rows`);
* :mod:`torchstore.data.replay.shared`: device scalars, shared memory, the lock, pickling;
* :mod:`torchstore.data.replay.state`: ``state_dict``/``load_state_dict``, ``ring_state``.

Module functions without ring state sit beside them: :mod:`torchstore.data.replay.batches`
(written data as TensorDict batches), :mod:`torchstore.data.replay.index` (cursors and read
indices), :mod:`torchstore.data.replay.append_plan` (the compiled append fast path) and
:mod:`torchstore.data.replay.compiled` (the compile guard). Files are written by
:mod:`torchstore.data.replay.checkpoint` and :mod:`torchstore.data.replay.torchrl_checkpointers`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
from torchrl.data.replay_buffers.storages import TensorStorage

from torchstore.data.columns import ColumnSpec, validate_columns

# re-exported: the append plan was defined here, and is still reached through this module
from torchstore.data.replay.append_plan import _WRITTEN as _WRITTEN
from torchstore.data.replay.append_plan import _AppendPlan as _AppendPlan
from torchstore.data.replay.checkpoint import (
    REPLAY_FILE,
    dump_replay,
    load_replay,
    replay_from_store,
)
from torchstore.data.replay.compiled import _compile_disable
from torchstore.data.replay.index import _flat_rows
from torchstore.data.replay.reads import ReplayReads
from torchstore.data.replay.ring_columns import END_COLUMNS, ReplayColumns
from torchstore.data.replay.ring_episodes import RingEpisodes, age_rows
from torchstore.data.replay.shared import ReplayShared
from torchstore.data.replay.state import ReplayState
from torchstore.data.replay.torchrl_checkpointers import (
    dump_with_torchrl,
    is_torchrl_checkpointer,
    load_with_torchrl,
)
from torchstore.data.replay.writes import ReplayWrites
from torchstore.data.rows.packed import PackedColumns
from torchstore.errors import ColumnError, UnsupportedError

__all__ = ["StoreReplay", "StoreReplayCheckpointer", "REPLAY_FILE", "END_COLUMNS"]


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


class StoreReplay(
    ReplayWrites, ReplayColumns, ReplayReads, ReplayShared, ReplayState, TensorStorage
):
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
        # rows written as a lazy stack whose entries differ: its StackedRows, else None
        self._stacked: Any = None
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

    def _refuse_multi_env(self, what: str) -> None:
        if self.ndim != 1:
            raise UnsupportedError(
                f"StoreReplay(ndim={self.ndim}).{what} is not supported: it holds one "
                "episode stream per env"
            )

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

    # ----------------------------------------------------------------- episode index
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

    def _empty(self) -> None:
        with self._guard():
            for stream in self._streams:
                stream.reset()
            self._segments_cache = None
            self._sync_scalars()
        self._bump_mutation_revision()

    # ----------------------------------------------------------------- checkpoints
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
        """Write this storage's checkpoint folder (torchrl's ``Storage.dumps``).

        ``rb.dumps(path)`` writes the storage, then the sampler and writer, one after the
        other: a kill between them leaves new rows beside old priorities. To checkpoint a
        whole buffer as one step, use :func:`torchstore.data.dump_buffer`.
        """
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
