"""Behaviour cloning: observation histories and action chunks (ACT, diffusion policy).

Each sample is a step ``t`` drawn by the sampling core's policy over all rows of the
training episodes (uniform by default; ``sampler="prioritized"`` by priority, with
``"priority_weight"`` in the batch and :meth:`~StoreDataModule.update_priority`; ``ere``
restricts draws to the newest ``c_k`` training rows), with

- the observation history: the ``n_obs_steps`` steps ``t - n_obs_steps + 1 .. t``;
- the action chunk: the ``action_horizon`` steps ``t .. t + action_horizon - 1``;

both from ``t``'s episode. Steps before the episode's first row repeat the first row, steps
after its last row repeat the last row, and the masks mark which steps are real.

Batch layout (a TensorDict of batch size ``[B]``; ``output="dict"`` gives the same tree as
nested dicts)::

    ("obs", *column_key(k))     [B, n_obs_steps, *shape]     for k in obs_keys
    ("action", *column_key(k))  [B, action_horizon, *shape]  for k in action_keys
    "obs_mask"                  [B, n_obs_steps]  bool, False where padded
    "action_mask"               [B, action_horizon]  bool, False where padded
    "index"                     [B] int64, the store row of step t
    "episode"                   [B] int64, its episode
    "priority_weight"           [B] float32, with sampler="prioritized" only

so with the pendulum demo, ``batch["obs", "obs"]`` is ``[B, n_obs_steps, 3]`` and
``batch["action", "action"]`` is ``[B, action_horizon, 1]``. A nested column such as
``next/obs`` sits at ``("obs", "next", "obs")``.

The key a user asks for is a store column's name; the key it comes back under is its
role (``"obs"`` or ``"action"``) followed by that name's parts, whatever the name is. A
robomimic import names its columns ``obs/<key>``, so ``obs_keys=["obs/robot0_eef_pos"]``
gives ``batch["obs", "obs", "robot0_eef_pos"]``, and ``batch["obs"]`` holds the store's
paths as they are (``column_key`` of each name). The role is not folded into a name that
starts with it: ``"obs/state"`` and ``"state"`` are two columns, which must not meet at
one key, and ``"action"`` stays at ``("action", "action")``.

Normalisation (``normalize=True``): every floating obs and action column is normalised on
the device, ``(x - mean) / std`` by default or onto ``[-1, 1]`` with
``normalization="min_max"`` (integer and bool columns are left as they are). Statistics
come from all committed rows of the store and are cached in ``<store>.stats.json`` (see
:mod:`torchstore.lightning.normalizer`). ``datamodule.normalizer`` maps a policy's
outputs back: ``normalizer.unnormalize("action", chunk)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.columns import column_key, set_nested
from torchstore.data.rows.packed import PackedColumns
from torchstore.data.store.store import TrajectoryStore
from torchstore.lightning.base import Output, SamplerKind, StoreDataModule, check_int, choice
from torchstore.lightning.normalizer import Normalization, Normalizer, load_or_compute_stats
from torchstore.samplers.ere import ERE
from torchstore.samplers.windows import RowSet, context_windows

__all__ = ["DemonstrationDataModule"]


def _names(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"{what} ({value!r}) must be a non-empty list of column names")
    names = [v if isinstance(v, str) else "/".join(v) for v in value]
    if len(set(names)) != len(names):
        raise ValueError(f"{what} ({names}) must not repeat a column")
    return names


class DemonstrationDataModule(StoreDataModule):
    """Observation histories and action chunks for behaviour cloning (layout: module docstring).

    Args:
        store: a store path or an open :class:`~torchstore.data.TrajectoryStore`.
        batch_size: samples per batch (>= 1).
        obs_keys: observation column names (``"obs"``, ``"pixels"``, ``"next/obs"``, ...).
        action_keys: action column names.
        n_obs_steps: length of the observation history ending at ``t`` (>= 1); 1 (the
            default) is the current observation only.
        action_horizon: length of the action chunk starting at ``t`` (>= 1); 1 (the
            default) is the action at ``t`` only: plain behaviour cloning.
        steps_per_epoch: batches per epoch; ``None`` (the default): training rows //
            batch_size (at least 1).
        device: ``"auto"`` (the trainer's root device, else cuda when available, else
            cpu) or a device.
        val_episodes: whole episodes held out, the store's last ones: a fraction in
            ``[0, 1)`` (rounded half up, at least one when positive) or an int count; or
            the name of one of the store's episode sets (``metadata["episode_sets"]``,
            e.g. ``"valid"``, robomimic's filter key) with ``resident="all"``.
            ``val_dataloader()`` takes every row of them as ``t``, in order.
        seed: key of the Philox stream; the DDP rank is its sub-stream.
        normalize: normalise floating obs and action columns (``normalizer`` is ``None``
            when ``False``).
        normalization: ``"mean_std"`` or ``"min_max"``.
        stats_cache: cache statistics in ``<store>.stats.json``; ``False`` keeps them in
            memory only.
        shard_episodes: under DDP, rank ``r`` samples only training episodes
            ``r, r + world_size, ...``.
        output: ``"tensordict"`` or ``"dict"``.
        sampler: ``"uniform"`` or ``"prioritized"`` (over the rows ``t``; priorities start
            at 1; call ``update_priority`` with a batch's ``"index"``).
        prioritized_alpha, prioritized_beta: the prioritized sampler's exponents.
        ere: an :class:`~torchstore.samplers.ERE` schedule: ``t`` comes from the newest
            ``c_k`` training rows.
        resident, resident_blocks, resident_reuse: what is resident on the device, as for
            :class:`~torchstore.lightning.OfflineDataModule`: every needed column
            (``"all"``, the default) or, for a store larger than memory, a budget in rows
            or bytes (``"8GiB"``) sampled block by block while the next block is read.

    Raises:
        ColumnError: for a column the store does not have.
        ValueError: for bad sizes, a split leaving no training episode, or unknown options.

    Examples:
        >>> dm = DemonstrationDataModule("demo.h5", batch_size=64, obs_keys=["obs"],
        ...     action_keys=["action"], n_obs_steps=2, action_horizon=16)
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch["obs", "obs"].shape, batch["action", "action"].shape, batch["action_mask"].shape
        (torch.Size([64, 2, 3]), torch.Size([64, 16, 1]), torch.Size([64, 16]))
    """

    def __init__(
        self,
        store: str | os.PathLike | TrajectoryStore,
        *,
        batch_size: int,
        obs_keys: Sequence[str | tuple[str, ...]],
        action_keys: Sequence[str | tuple[str, ...]],
        n_obs_steps: int = 1,
        action_horizon: int = 1,
        steps_per_epoch: int | None = None,
        device: str | torch.device = "auto",
        val_episodes: float | int | str = 0.0,
        seed: int = 0,
        normalize: bool = True,
        normalization: str | Normalization = "mean_std",
        stats_cache: bool = True,
        shard_episodes: bool = False,
        output: str | Output = "tensordict",
        sampler: str | SamplerKind = "uniform",
        prioritized_alpha: float = 0.6,
        prioritized_beta: float = 0.4,
        ere: ERE | None = None,
        resident: int | str = "all",
        resident_blocks: int = 4,
        resident_reuse: float = 1.0,
    ):
        self.obs_keys = _names(obs_keys, "obs_keys")
        self.action_keys = _names(action_keys, "action_keys")
        self.n_obs_steps = check_int("n_obs_steps", n_obs_steps, 1)
        self.action_horizon = check_int("action_horizon", action_horizon, 1)
        self.normalize = bool(normalize)
        self.normalization = choice(Normalization, normalization, "normalization")
        self.stats_cache = bool(stats_cache)
        self._normalizer: Normalizer | None = None
        super().__init__(store, **self._shared_options(locals()))

    def _required_columns(self) -> list[str]:
        return self.obs_keys + self.action_keys

    # ------------------------------------------------------------ setup
    def _load(self, store: TrajectoryStore, device: torch.device) -> None:
        self.obs_resident = store.resident(self.obs_keys, device=device)
        self.action_resident = store.resident(self.action_keys, device=device)
        if not self.normalize:
            return
        floating = {s.name for s in store.columns if s.dtype.is_floating_point}
        stats = load_or_compute_stats(
            store,
            self.obs_resident,
            [k for k in self.obs_keys if k in floating],
            cache=self.stats_cache,
        )
        rest = [k for k in self.action_keys if k in floating and k not in stats]
        stats.update(
            load_or_compute_stats(store, self.action_resident, rest, cache=self.stats_cache)
        )
        self._normalizer = Normalizer(stats, self.normalization).to(device)

    def _window_columns(self) -> list[str]:
        return list(dict.fromkeys(self.obs_keys + self.action_keys))

    def _window_align(self) -> bool:
        return True  # histories and chunks stay inside a resident episode

    def _after_window(self, window: Any) -> None:
        if not self.normalize:
            return
        floating = {s.name for s in window.packed.columns if s.dtype.is_floating_point}
        names = [k for k in self._window_columns() if k in floating]
        # statistics over all committed rows, read from disk in chunks (or the cache)
        stats = load_or_compute_stats(
            window.store, window.disk_columns(), names, cache=self.stats_cache
        )
        self._normalizer = Normalizer(stats, self.normalization).to(window.device)

    @property
    def normalizer(self) -> Normalizer | None:
        """The :class:`Normalizer` batches were normalised with (``None`` without normalisation)."""
        self._ensure_ready()
        return self._normalizer

    # ------------------------------------------------------------ batches
    def _draw_train(self) -> TensorDict | dict:
        if self.window is not None:
            at, row, seg, weight = self.window.draw_rows(self.philox, self.batch_size)
            window = self.window
            return self._windows(row, seg, window.rows, weight, at=at, packed=window.packed)
        row, seg, weight = self._draw_rows(self.batch_size, segments=True)
        return self._windows(row, seg, self.train_rows, weight)

    def _make_val(self, i: int) -> TensorDict | dict:
        row, seg = self.val_rows.locate(self._val_numbers(i))
        weight = None
        if self.priorities is not None:
            weight = torch.ones(row.shape, dtype=torch.float32, device=self.device)
        if self.window is None:
            return self._windows(row, seg, self.val_rows, weight)
        rows = self.val_rows
        first, length = rows.start[seg], rows.length[seg]
        index, _ = self._context(row, first, length)
        packed, _ = self._val_packed(index, self.window.packed)
        lo = int(index.min())
        return self._windows(row, seg, rows, weight, at=row - lo, packed=packed, first=first - lo)

    def _context(
        self, t: torch.Tensor, first: torch.Tensor, length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return context_windows(
            t, first, length, before=self.n_obs_steps - 1, after=self.action_horizon - 1
        )

    def _windows(
        self,
        t: torch.Tensor,
        seg: torch.Tensor,
        rows: RowSet,
        weight: torch.Tensor | None,
        *,
        at: torch.Tensor | None = None,
        packed: Any = None,
        first: torch.Tensor | None = None,
    ) -> TensorDict | dict:
        """Histories and chunks of store rows ``t``; with ``packed``, gathered around
        positions ``at`` of it (``first``: the episodes' first positions, else ``rows``')."""
        n_obs = self.n_obs_steps
        first = rows.start[seg] if first is None else first
        index, mask = self._context(t if at is None else at, first, rows.length[seg])
        obs_packed = self.obs_resident.packed if packed is None else packed
        action_packed = self.action_resident.packed if packed is None else packed
        leaves = {
            "obs": self._group(obs_packed, index[:, :n_obs], self.obs_keys),
            "action": self._group(action_packed, index[:, n_obs - 1 :], self.action_keys),
            "obs_mask": mask[:, :n_obs],
            "action_mask": mask[:, n_obs - 1 :],
            "index": t,
            "episode": rows.episode[seg],
        }
        if weight is not None:
            leaves["priority_weight"] = weight
        return self._finish(leaves, t.shape[0])

    def _group(self, packed: PackedColumns, rows: torch.Tensor, names: list[str]) -> dict:
        blocks = packed.gather_blocks(rows.reshape(-1))
        tree: dict = {}
        norm = self._normalizer
        for name in names:
            leaf = packed.leaf(blocks, name).unflatten(0, rows.shape)
            if norm is not None and name in norm.stats:
                leaf = norm.normalize(name, leaf)
            set_nested(tree, column_key(name), leaf)
        return tree

    def __repr__(self) -> str:
        return (
            f"DemonstrationDataModule({str(self.store_path)!r}, batch_size={self.batch_size}, "
            f"obs_keys={self.obs_keys}, action_keys={self.action_keys}, "
            f"n_obs_steps={self.n_obs_steps}, action_horizon={self.action_horizon}, "
            f"sampler={self.sampler.value!r}, resident={self.resident!r}, "
            f"train_episodes={len(self.split.train)}, val_episodes={len(self.split.val)})"
        )
