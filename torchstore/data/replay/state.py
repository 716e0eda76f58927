"""State of :class:`~torchstore.data.replay.ring.StoreReplay` as values: ``state_dict`` and the
ring position a checkpoint keeps.

:class:`ReplayState` writes and loads torchrl's ``state_dict`` (torchrl's
``LazyTensorStorage`` keys with torchrl's contents, plus ``"torchstore_replay"`` for what they
cannot hold), loads torchrl's own ``TensorStorage`` state, and gives the trajectory store
checkpoint (:mod:`torchstore.data.replay.checkpoint`) the ring's position and layout
(``ring_state``/``restore_ring``). Files are written by the checkpointers, which
:mod:`torchstore.data.replay.ring` selects; pickling is in :mod:`torchstore.data.replay.shared`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase

from torchstore.data.columns import ColumnSpec
from torchstore.data.replay.batches import _TENSOR_COLUMN, StackedRows

__all__ = ["ReplayState"]

#: state_dict key of what torchrl's keys cannot hold (columns, episode index, cursor)
_STATE_KEY = "torchstore_replay"


class ReplayState:
    """``state_dict``, ``load_state_dict``, ``ring_state`` and ``restore_ring``.

    A mixin of :class:`~torchstore.data.replay.ring.StoreReplay`, whose constructor initialises
    every attribute used here. Loading sets the layout of the first write (``_tensor_mode``,
    ``_treespec``, ``_row_batch``, ``_layout_known``, ``_returns_index``), the rows in
    ``_packed`` and the episode index (``_episodes``, ``_streams``, ``_segments_cache``); it
    reads ``_width`` and ``time_capacity``. It calls ``_init_streams`` and
    ``_refuse_multi_env`` (:mod:`torchstore.data.replay.ring`), ``_adopt_columns`` and
    ``_validate`` (:mod:`torchstore.data.replay.ring_columns`), ``_from_blocks``
    (:mod:`torchstore.data.replay.reads`), ``set`` (:mod:`torchstore.data.replay.writes`),
    ``_guard`` and ``_sync_scalars`` (:mod:`torchstore.data.replay.shared`), and torchrl's
    ``device``, ``max_size``, ``ndim``, ``initialized``, ``_last_cursor_index``,
    ``_set_last_cursor`` and ``_bump_mutation_revision``.
    """

    def ring_state(self) -> dict[str, Any]:
        """The ring's position and the layout of written data, as plain values (``ndim=1``).

        What a checkpoint keeps beside the rows (oldest first) and the episode lengths:
        ``rows``, ``cursor``, ``open`` (the newest episode is still being written),
        ``next_episode_id``, ``episode_ids`` (one per :meth:`episode_segments` entry),
        ``last_cursor_index``, ``tensor_mode``, ``returns_index``, ``treespec``
        (serialised), ``row_batch`` and ``stacked`` (lazily stacked entries, or ``None``).
        :meth:`restore_ring` takes it back.
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
            "stacked": None if self._stacked is None else self._stacked.to_dict(),
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
            self._stacked = StackedRows.from_dict(state.get("stacked"))
            self._layout_known = True
            self._find_end_names()
        last = state.get("last_cursor_index")
        self._set_last_cursor(-1 if last is None else int(last))
        self._sync_scalars()

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
            "stacked": None if self._stacked is None else self._stacked.to_dict(),
            "streams": [s.state_dict() for s in self._streams],
        }
        state: dict[str, Any] = {_STATE_KEY: own}
        if packed is None:
            state.update(_storage={}, initialized=False, _len=0)
            return state
        opaque = self._treespec is not None or self._stacked is not None
        if opaque or any(c.storage_dtype != c.dtype for c in packed.columns):
            own["blocks"] = [b.clone() for b in packed.blocks]
        if not opaque:  # torchrl's keys cannot hold pytrees, nor lazy stacks of ragged entries
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
            self._stacked = StackedRows.from_dict(own.get("stacked"))
            self._layout_known = True
            self._find_end_names()
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
