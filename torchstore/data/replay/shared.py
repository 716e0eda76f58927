"""Shared memory, the lock and pickling of :class:`~torchstore.data.replay.ring.StoreReplay`.

:class:`ReplayShared` keeps the ring's position where other readers see it: the device scalars
``fill_level`` and ``cursor_tensor`` (graph-safe samplers read them), and, once the ring is
pickled into a ``spawn`` child, an int64 ``[rows, cursor, revision]`` tensor in shared memory
beside the shared blocks, with a process-shared lock (``_guard``) every write and read holds.
The episode index stays per process: ``_follow`` rebuilds it after another process's writes
(the revision moved) and after writes made inside ``torch.compile`` (whose position only the
device scalars hold). ``__getstate__``/``__setstate__`` decide what a pickle carries: a spawn
pickle shares first and takes the lock along; any other copy (pickle, deepcopy) of a shared
ring gets a lock of its own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from torchrl.data.replay_buffers.storages import Storage

from torchstore.errors import UnsupportedError

__all__ = ["ReplayShared"]


class ReplayShared:
    """Shared position, lock, catch-up and pickling, for :class:`StoreReplay`.

    A mixin of :class:`~torchstore.data.replay.ring.StoreReplay`, whose constructor initialises
    every attribute used here. It owns ``_shared`` (the shared ``[rows, cursor, revision]``
    tensor, or ``None`` while the ring is private), ``_shared_np`` (its numpy view),
    ``_lock``, ``_seen_revision``, ``_traced_writes``, ``_scalar_views``, ``fill_level`` and
    ``cursor_tensor``; it drops the process-local ``_append_plans`` from a pickle and resets
    ``_segments_cache`` after catching up. It reads ``_packed``, the ring's ``_episodes``,
    ``_width`` and ``time_capacity``, calls ``_rebuild`` (:mod:`torchstore.data.replay.ring`), and
    uses torchrl's ``initialized``, ``_compilable`` and ``_set_last_cursor``.
    """

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


def _scalar_views(fill_level: torch.Tensor, cursor: torch.Tensor) -> tuple[Any, ...]:
    """``(fill_level, cursor, fill numpy view, cursor numpy view)``; the views are ``None``
    unless both are plain CPU tensors."""
    if all(
        type(t) is torch.Tensor and t.is_cpu and not t.requires_grad for t in (fill_level, cursor)
    ):
        return fill_level, cursor, fill_level.numpy(), cursor.numpy()
    return fill_level, cursor, None, None
