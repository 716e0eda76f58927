"""Offline RL from a trajectory store: minibatches of rows for a Lightning ``Trainer``.

Each batch is one batched gather of rows from the store resident on the training device:
the row indices are drawn on the device from a Philox stream, and the gather is one
``index_select`` per dtype block of :class:`~torchstore.data.PackedColumns`. No per-row
``__getitem__``, no collate, no worker processes.

Batch layout (``B = batch_size``):

- ``layout="flat"``: one leaf per column under the column's key (``"obs"``,
  ``("next", "obs")``, ...), each ``[B, *shape]``;
- ``layout="torchrl"``: torchrl's key layout, so torchrl losses take a batch as it is.
  Columns are renamed by :data:`TORCHRL_KEYS` (only the columns the store has; any other
  column keeps its key)::

      obs        -> "observation"
      next/obs   -> ("next", "observation")
      reward     -> ("next", "reward")
      done       -> ("next", "done")
      truncated  -> ("next", "truncated")
      terminated -> ("next", "terminated")

  Scalar ``reward``/``done``/``truncated``/``terminated`` columns get torchrl's trailing
  feature dimension: ``[B, 1]`` (torchrl's value estimators require it). When the store
  has ``done`` and ``truncated`` but no ``terminated`` column, ``("next", "terminated")``
  is added as ``done & ~truncated`` (torchrl losses bootstrap on ``terminated``; ``done =
  terminated | truncated`` as in torchrl's collectors).

Every batch also holds ``"index"`` (int64 ``[B]``, the store rows, for
:meth:`OfflineDataModule.update_priority`), and with ``sampler="prioritized"``
``"priority_weight"`` (float32 ``[B]``, importance weights ``(p_i / p_min) ** -beta``;
all ones in validation batches).

Window mode (``window=T``): each batch is ``B`` windows of ``T`` consecutive rows of one
episode, drawn uniformly over all valid windows of the training episodes (the core's
:func:`~torchstore.samplers.windows.choose_windows`: an episode of ``L >= T`` rows holds
``L - T + 1`` windows; shorter ones hold none). Every leaf is then ``[B, T, *shape]``,
``"index"`` is ``[B, T]`` and ``"episode"`` ``[B]``. With ``ere`` the draws come from the
newest ``c_k`` windows. Validation iterates every window of the validation episodes in
order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.columns import column_key, set_nested
from torchstore.data.rows.packed import tensordict_of
from torchstore.data.store.store import TrajectoryStore
from torchstore.lightning.base import Output, SamplerKind, StoreDataModule, check_int, choice
from torchstore.samplers.draws import uniform_gathered, uniform_rows
from torchstore.samplers.ere import ERE
from torchstore.samplers.windows import choose_windows, window_counts

__all__ = ["OfflineDataModule", "SamplerKind", "Layout", "TORCHRL_KEYS"]


class Layout(StrEnum):
    """The key layout of a batch."""

    FLAT = "flat"
    TORCHRL = "torchrl"


#: Column name -> torchrl key, for ``layout="torchrl"``.
TORCHRL_KEYS: dict[str, str | tuple[str, ...]] = {
    "obs": "observation",
    "next/obs": ("next", "observation"),
    "reward": ("next", "reward"),
    "done": ("next", "done"),
    "truncated": ("next", "truncated"),
    "terminated": ("next", "terminated"),
}

_TORCHRL_SCALARS = ("reward", "done", "truncated", "terminated")


class OfflineDataModule(StoreDataModule):
    """Minibatches of store rows for offline RL (see the module docstring for the layout).

    Args:
        store: a store path or an open :class:`~torchstore.data.TrajectoryStore` (a store
            opened here is closed once its rows are resident).
        batch_size: rows per batch (>= 1).
        sampler: ``"uniform"`` over the training rows, or ``"prioritized"`` (proportional,
            priorities start at 1; call :meth:`update_priority` with a batch's ``"index"``).
        steps_per_epoch: batches per epoch (>= 1); ``train_dataloader()`` yields exactly
            this many. ``None`` (the default): one pass, training rows (or windows) //
            ``batch_size``, at least 1.
        columns: a sequence of column names to load (a nested one as ``"next/obs"`` or
            ``("next", "obs")``); all when ``None``.
        device: ``"auto"`` (the trainer's root device under a Trainer, else cuda when
            available, else cpu) or a device; the rows are made resident there once.
        val_episodes: whole episodes held out for validation, the store's **last** ones:
            a fraction in ``[0, 1)`` (rounded half up, at least one when positive) or an
            int count; or the name of one of the store's episode sets
            (``metadata["episode_sets"]``, e.g. robomimic's ``"valid"`` filter key) with
            ``resident="all"``. ``val_dataloader()`` iterates their rows in order.
        layout: ``"flat"`` or ``"torchrl"``.
        seed: key of the Philox stream; the DDP rank is its sub-stream.
        output: ``"tensordict"`` or ``"dict"`` (plain nested dicts of tensors).
        prioritized_alpha, prioritized_beta: the prioritized sampler's exponents.
        shard_episodes: under DDP, rank ``r`` samples only training episodes
            ``r, r + world_size, ...``; otherwise every rank samples all of them (from
            its own stream).
        ere: an :class:`~torchstore.samplers.ERE` schedule: draws come from the newest
            ``c_k`` training rows (windows in window mode), in store order; advance it with
            ``datamodule.ere.set_progress(k, K)``. Checkpointed with the stream.
        window: draw windows of this many consecutive rows of one episode (see the module
            docstring); ``None`` draws single rows. Uniform sampling only.
        resident: ``"all"`` (the default: every needed column resident on the device), or
            the budget of a store larger than memory, in rows (an int) or bytes
            (``"8GiB"``, ``"512MB"``): ``resident_blocks`` blocks of contiguous rows are
            sampled while a background thread reads the next one (see
            :class:`~torchstore.window.block_window.BlockWindow`; ``datamodule.window.stats``
            counts reads and waits). Validation episodes are read from disk batch by batch.
            Not with ``ere`` or ``shard_episodes`` (ranks read disjoint blocks already).
        resident_blocks: blocks sampled from at once with a budget (the budget holds them
            and one spare being refilled).
        resident_reuse: with a budget, draws per row per time its block is read (1: the
            store is read once per pass of draws; 4 reads it four times less often, every
            row keeping the same expected frequency, at the price of batches that share
            blocks for longer).
        resize: camera columns kept at training resolution, cropped and resized once as
            their frames are decoded: ``[H, W]`` for every camera column, or ``{column:
            [H, W]}`` (see :class:`~torchstore.io.frames.resize.FrameResize`).
        augment: training batches' camera columns augmented on the device: a callable or a
            list of them for every camera column, or ``{column: callable or list}``; each
            takes frames ``[..., C, H, W]`` (a torchvision v2 transform works;
            :mod:`torchstore.lightning.augment` has per-sample ``RandomShift`` and
            ``ColorJitter``). Validation batches are not augmented.
        decode_device: where video frames are decoded: ``"cpu"`` (the default) or ``"cuda"``
            (the GPU's video decoder, NVDEC; where there is none, the CPU after one warning;
            see :mod:`torchstore.io.frames.decode_device`).

    Raises:
        ColumnError: for a column the store does not have.
        ValueError: for a bad batch size, step count, split, seed, device, or an unknown
            sampler, layout or output.

    Examples:
        >>> dm = OfflineDataModule("demo.h5", batch_size=256, steps_per_epoch=100,
        ...                        layout="torchrl", val_episodes=0.1)
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch["next", "observation"].shape
        torch.Size([256, 3])
    """

    def __init__(
        self,
        store: str | os.PathLike | TrajectoryStore,
        *,
        batch_size: int,
        sampler: str | SamplerKind = "uniform",
        steps_per_epoch: int | None = None,
        columns: Sequence[str | tuple[str, ...]] | None = None,
        device: str | torch.device = "auto",
        val_episodes: float | int | str = 0.0,
        layout: str | Layout = "flat",
        seed: int = 0,
        output: str | Output = "tensordict",
        prioritized_alpha: float = 0.6,
        prioritized_beta: float = 0.4,
        shard_episodes: bool = False,
        ere: ERE | None = None,
        window: int | None = None,
        resident: int | str = "all",
        resident_blocks: int = 4,
        resident_reuse: float = 1.0,
        resize: Any = None,
        augment: Any = None,
        decode_device: str = "cpu",
    ):
        self.layout = choice(Layout, layout, "layout")
        self.window_length = None if window is None else check_int("window", window, 1)
        if self.window_length is not None and choice(SamplerKind, sampler, "sampler") is not (
            SamplerKind.UNIFORM
        ):
            raise ValueError(
                f"window ({window}) draws windows uniformly; use sampler='uniform', or "
                "SequenceWindowSampler(priority=...) over a StoreReplay for prioritized windows"
            )
        if isinstance(columns, str):
            columns = [columns]
        self.columns = (
            None if columns is None else [c if isinstance(c, str) else "/".join(c) for c in columns]
        )
        super().__init__(store, **self._shared_options(locals()))

    # ------------------------------------------------------------ boundary
    def _required_columns(self) -> list[str]:
        return list(self.columns or [])

    def _read_columns(self, store: TrajectoryStore) -> list[str]:
        return list(self.columns or [c.name for c in store.columns])

    def _check_options(self, store: TrajectoryStore) -> None:
        names = self._read_columns(store)
        self._plan = [
            (name, self._target(name), self._unsqueeze(name, store.column(name).shape))
            for name in names
        ]
        targets = [key if isinstance(key, tuple) else (key,) for _, key, _ in self._plan]
        if self._derive_terminated(names):
            targets.append(("next", "terminated"))
        for i, a in enumerate(targets):
            for b in targets[i + 1 :]:
                shorter = min(len(a), len(b))
                if a[:shorter] == b[:shorter]:
                    raise ValueError(
                        f"layout {self.layout.value!r} maps two columns onto key {a} / {b}; "
                        "select columns with columns=[...] or use layout='flat'"
                    )
        reserved = {("index",), ("priority_weight",), ("episode",)}
        clash = [t for t in targets if t[:1] in reserved]
        if clash:
            raise ValueError(
                f"column key {clash[0]} clashes with a key batches add ('index', "
                "'priority_weight', 'episode')"
            )
        self._names = names

    def _batch_key(self, name: str) -> str | tuple[str, ...]:
        return self._target(name)

    def _target(self, name: str) -> str | tuple[str, ...]:
        if self.layout is Layout.TORCHRL and name in TORCHRL_KEYS:
            return TORCHRL_KEYS[name]
        return column_key(name)

    def _unsqueeze(self, name: str, shape: tuple[int, ...]) -> bool:
        """torchrl keeps a trailing feature dim of 1 on per-step scalars."""
        return self.layout is Layout.TORCHRL and name in _TORCHRL_SCALARS and shape == ()

    def _derive_terminated(self, names: Sequence[str]) -> bool:
        return (
            self.layout is Layout.TORCHRL
            and "done" in names
            and "truncated" in names
            and "terminated" not in names
        )

    # ------------------------------------------------------------ setup
    def _load(self, store: TrajectoryStore, device: torch.device) -> None:
        self.resident_view = store.resident(
            self._names, device=device, resize=self.resize or None, decode_device=self.decode_device
        )
        self._derived = self._derive_terminated(self._names)

    def _window_columns(self) -> list[str]:
        return list(self._names)

    def _window_align(self) -> bool:
        return self.window_length is not None

    def _window_length(self) -> int | None:
        return self.window_length

    def _after_window(self, window: Any) -> None:
        self._derived = self._derive_terminated(self._names)

    @property
    def _packed(self) -> Any:
        return self.window.packed if self.window is not None else self.resident_view.packed

    def _after_load(self) -> None:
        #: uniform rows from the window, or from the resident view over contiguous training
        #: rows: the draw of _draw_plain_rows (the same stream positions and rows as the
        #: general path)
        self._plain_rows = (
            self.window_length is None
            and self.priorities is None
            and self.ere is None
            and (self.window is not None or self.train_rows.first_row is not None)
        )
        if self.window_length is None:
            return
        train = self.train_rows
        self._train_windows = int(window_counts(train.length, self.window_length).sum())
        if self._train_windows == 0:
            longest = int(train.length.max()) if len(train.length) else 0
            raise ValueError(
                f"window ({self.window_length}) is longer than every training episode (the longest "
                f"has {longest} rows); use a shorter window"
            )

    def _train_units(self) -> int:
        return len(self.train_rows) if self.window_length is None else self._train_windows

    def _val_units(self) -> int:
        if self.window_length is None:
            return len(self.val_rows)
        return int(window_counts(self.val_rows.length, self.window_length).sum())

    # ------------------------------------------------------------ batches
    def _draw_train(self) -> TensorDict | dict:
        if self._plain_rows:
            return self._draw_plain_rows()
        if self.window is not None:
            if self.window_length is None:
                packed, row, _, weight = self.window.draw_rows(
                    self.philox, self.batch_size, segments=False
                )
                return self._assemble(row, weight, at=packed)
            packed, rows, episode = self.window.draw_windows(self.philox, self.batch_size)
            return self._assemble(rows, None, episode=episode, at=packed)
        if self.window_length is None:
            index, _, weight = self._draw_rows(self.batch_size)
            return self._assemble(index, weight)
        total = self._train_windows
        count = total if self.ere is None else int(self.ere.recent_count(total))
        g = uniform_rows(self.philox, self.batch_size, count, start=total - count)
        return self._assemble_windows(self.train_rows, g)

    def _draw_plain_rows(self) -> TensorDict | dict:
        """:meth:`_assemble` of uniformly drawn rows, less its general cases: per batch a
        stream draw, one gather, one view per column and the container."""
        n = self.batch_size
        if self.window is not None:
            leaves, index = self._draw_window_rows(n)
        else:
            leaves, index = self._draw_resident_rows(n)
        if self._derived:
            nxt = leaves["next"]
            nxt["terminated"] = nxt["done"] & ~nxt["truncated"]
        leaves["index"] = index
        if self.output is Output.DICT:
            return leaves
        return tensordict_of(leaves, torch.Size([n]), self.device)

    def _draw_window_rows(self, n: int) -> tuple[dict, torch.Tensor]:
        """:meth:`_draw_resident_rows` from the window's active blocks."""
        window = self.window
        packed = window.packed
        plan = self._batch_plan(packed)
        sources = packed.block_arrays() if plan.cuts_arrays else None
        if sources is not None and len(sources) == 1:
            drawn = window.draw_plain_gathered(self.philox, n, sources[0])
            if drawn is not None:
                index, gathered = drawn
                return plan.leaves_of_arrays([gathered], n), index
        at, index = window.draw_plain(self.philox, n)  # packed positions to gather at
        return packed.gather_leaves(at, plan), index

    def _draw_resident_rows(self, n: int) -> tuple[dict, torch.Tensor]:
        """The leaves and store rows of ``n`` uniform rows of the resident training rows:
        on the CPU the draw and the gather are one compiled call."""
        rows, packed = self.train_rows, self.resident_view.packed
        plan = self._batch_plan(packed)
        sources = packed.block_arrays() if plan.cuts_arrays else None
        if sources is not None and len(sources) == 1:
            drawn = uniform_gathered(self.philox, n, rows.total, rows.first_row, sources[0])
            if drawn is not None:
                index, gathered = drawn
                return plan.leaves_of_arrays([gathered], n), index
        # a new tensor (not a view of the stream's block), so a caller editing the batch's
        # index does not reach the draws an exact resume replays
        index = self.philox.randint(n, rows.total, rows.first_row)
        return packed.gather_leaves(index, plan), index

    def _make_val(self, i: int) -> TensorDict | dict:
        if self.window_length is not None:
            return self._assemble_windows(self.val_rows, self._val_numbers(i))
        index = self.val_rows.rows(self._val_numbers(i))
        weight = None
        if self.priorities is not None:
            weight = torch.ones(index.shape, dtype=torch.float32, device=self.device)
        packed, at = self._val_packed(index, self._packed)
        return self._assemble(index, weight, at=at, packed=packed)

    def _assemble_windows(self, rows: Any, g: torch.Tensor) -> TensorDict | dict:
        w = choose_windows(
            rows.start, rows.length, rows.episode, g, capacity=self.num_rows, T=self.window_length
        )
        if self.window is None:
            return self._assemble(w.index, None, episode=w.episode_id)
        packed, at = self._val_packed(w.index, self._packed)
        return self._assemble(w.index, None, episode=w.episode_id, at=at, packed=packed)

    def _assemble(
        self,
        index: torch.Tensor,
        weight: torch.Tensor | None,
        *,
        episode: torch.Tensor | None = None,
        at: torch.Tensor | None = None,
        packed: Any = None,
    ) -> TensorDict | dict:
        """A batch of store rows ``index``, gathered at positions ``at`` of ``packed``
        (the resident view or the window, at ``index`` itself by default)."""
        packed = self._packed if packed is None else packed
        where = index if at is None else at
        blocks = packed.gather_blocks(where if where.ndim == 1 else where.reshape(-1))
        if episode is None and index.ndim == 1:
            # rows: every leaf a view of the gathered blocks, cut by the precomputed plan
            leaves = self._batch_plan(packed).leaves(blocks, index.shape[0])
            if self._derived:
                nxt = leaves["next"]
                nxt["terminated"] = nxt["done"] & ~nxt["truncated"]
        else:
            leaves = {}
            for name, key, unsqueeze in self._plan:
                leaf = packed.leaf(blocks, name)
                if index.ndim > 1:
                    leaf = leaf.unflatten(0, index.shape)
                set_nested(leaves, key, leaf.unsqueeze(-1) if unsqueeze else leaf)
            if self._derived:
                nxt = leaves["next"]
                set_nested(leaves, ("next", "terminated"), nxt["done"] & ~nxt["truncated"])
        leaves["index"] = index
        if weight is not None:
            leaves["priority_weight"] = weight
        if episode is not None:
            leaves["episode"] = episode
        return self._finish(leaves, index.shape[0])

    def _batch_plan(self, packed: Any) -> Any:
        """The :class:`~torchstore.data.rows.packed.BatchPlan` of this layout over ``packed``
        (kept for the last ``packed`` asked for: the resident view's is asked every batch)."""
        cached = self.__dict__.get("_row_plan")
        if cached is not None and cached[0] is packed:
            return cached[1]
        keys = {name: key for name, key, _ in self._plan}
        unsqueeze = [name for name, _, flag in self._plan if flag]
        plan = packed.batch_plan(self._names, keys=keys, unsqueeze=unsqueeze)
        self._row_plan = (packed, plan)
        return plan

    def __repr__(self) -> str:
        return (
            f"OfflineDataModule({str(self.store_path)!r}, batch_size={self.batch_size}, "
            f"sampler={self.sampler.value!r}, layout={self.layout.value!r}, "
            f"window={self.window_length}, resident={self.resident!r}, "
            f"train_episodes={len(self.split.train)}, val_episodes={len(self.split.val)})"
        )
