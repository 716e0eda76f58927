"""Behaviour cloning: observation histories and action chunks (ACT, diffusion policy).

Each sample is a step ``t`` drawn by the sampling core's policy over all rows of the
training episodes (uniform by default; ``sampler="prioritized"`` by priority, with
``"priority_weight"`` in the batch and :meth:`~StoreDataModule.update_priority`; ``ere``
restricts draws to the newest ``c_k`` training rows), with

- the observation history: the ``n_obs_steps`` steps ``t - n_obs_steps + 1 .. t``;
- the action chunk: the ``action_horizon`` steps ``t .. t + action_horizon - 1``;

both from ``t``'s episode. Steps before the episode's first row repeat the first row, steps
after its last row repeat the last row, and the masks mark which steps are real.

Per-column frames, as LeRobot selects them: ``delta_timestamps`` (seconds per column, at the
store's recorded fps, e.g. ``{"observation.images.top": [-0.1, 0.0], "action": [i / 30 for
i in range(50)]}``) or the same in frames, ``frame_offsets`` (``{"action": range(50),
"observation.images.top": [-1, 0]}``: any offsets, strided, a frame from a second ago).
Each listed column takes its own offsets from ``t`` (a column not listed keeps its role's
table above); an offset outside the episode takes its first or last row and is marked in
the column's pad mask, named as LeRobot names it::

    ("obs", *column_key(k))     [B, len(offsets[k]), *shape]
    ("action", *column_key(k))  [B, len(offsets[k]), *shape]
    "<k>_is_pad"                [B, len(offsets[k])]  bool, True where padded

in place of ``obs_mask`` and ``action_mask`` (the rest as below). A batch reads only the
frames it returns: each column is gathered at its own offsets (see
:mod:`torchstore.lightning.frame_selection`), so a 50-step action chunk beside one camera
frame costs about what a single step does.

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
come from all committed rows of the store and are cached in a cache folder, never beside
the data (``$TORCHSTORE_CACHE/stats``; see :mod:`torchstore.lightning.normalizer`).
``datamodule.normalizer`` maps a policy's outputs back:
``normalizer.unnormalize("action", chunk)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from torchstore.data.store.store import TrajectoryStore
from torchstore.lightning.augment import apply_augments
from torchstore.lightning.base import Output, SamplerKind, StoreDataModule, check_int, choice
from torchstore.lightning.frame_selection import FrameSelection, resolve_frame_offsets
from torchstore.lightning.normalizer import Normalization, Normalizer, load_or_compute_stats
from torchstore.samplers.ere import ERE
from torchstore.samplers.frame_offsets import DEFAULT_TOLERANCE_S
from torchstore.samplers.windows import RowSet, offset_rows

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
        frame_offsets: per column of ``obs_keys``/``action_keys``, its own frame offsets
            from ``t`` (a list or ``range`` of ints); batches then carry ``<name>_is_pad``
            masks (module docstring). Columns not listed keep ``n_obs_steps`` /
            ``action_horizon``.
        delta_timestamps: the same in seconds, as LeRobot takes them; converted at ``fps``.
        fps: the frame rate ``delta_timestamps`` are read at; ``None`` (the default): the
            rate the store records (a LeRobot import's ``metadata["lerobot"]["fps"]``).
        tolerance_s: how far (seconds) a ``delta_timestamps`` offset may lie from a frame
            (LeRobot's default, 1e-4); further is an error naming the key and value.
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
        stats_cache: cache statistics in the cache folder (``$TORCHSTORE_CACHE/stats``,
            else ``~/.cache/torchstore/stats``); ``False`` keeps them in memory only.
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
        resize: camera columns kept at training resolution, cropped and resized once as
            their frames are decoded (so a budget holds more rows): ``[H, W]`` for every
            camera column read, ``{"height": H, "width": W, "crop": [top, left, h, w],
            "interpolation": "area"}``, or ``{column: either}`` (see
            :class:`~torchstore.io.frames.resize.FrameResize`).
        augment: training batches' camera columns augmented on the device before they are
            normalised: a callable or a list of them for every camera column, or
            ``{column: callable or list}``; each takes frames ``[..., C, H, W]`` and returns
            them (a torchvision v2 transform works; :mod:`torchstore.lightning.augment` has
            per-sample ``RandomShift`` and ``ColorJitter``). Validation batches are not
            augmented.
        decode_device: where video frames are decoded: ``"cpu"`` (the default) or ``"cuda"``
            (the GPU's video decoder, NVDEC; where there is none, the CPU after one warning;
            see :mod:`torchstore.io.frames.decode_device`).

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
        frame_offsets: Mapping[str, Sequence[int]] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        fps: float | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
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
        resize: Any = None,
        augment: Any = None,
        decode_device: str = "cpu",
    ):
        self.obs_keys = _names(obs_keys, "obs_keys")
        self.action_keys = _names(action_keys, "action_keys")
        self.n_obs_steps = check_int("n_obs_steps", n_obs_steps, 1)
        self.action_horizon = check_int("action_horizon", action_horizon, 1)
        self._asked_offsets = (frame_offsets, delta_timestamps, fps, tolerance_s)
        self.normalize = bool(normalize)
        self.normalization = choice(Normalization, normalization, "normalization")
        self.stats_cache = bool(stats_cache)
        self._normalizer: Normalizer | None = None
        super().__init__(store, **self._shared_options(locals()))

    def _required_columns(self) -> list[str]:
        return self.obs_keys + self.action_keys

    def _check_options(self, store: TrajectoryStore) -> None:
        frame_offsets, delta_timestamps, fps, tolerance_s = self._asked_offsets
        #: the per-column frame offsets asked for (``delta_timestamps`` in frames), or None
        self.frame_offsets = resolve_frame_offsets(
            frame_offsets=frame_offsets,
            delta_timestamps=delta_timestamps,
            fps=fps,
            tolerance_s=tolerance_s,
            metadata=store.manifest.metadata,
            source=self.store_path,
        )
        #: every column's frames (:class:`~torchstore.lightning.frame_selection.FrameSelection`)
        self.frames = FrameSelection(
            self.obs_keys,
            self.action_keys,
            n_obs_steps=self.n_obs_steps,
            action_horizon=self.action_horizon,
            frame_offsets=self.frame_offsets,
        )

    # ------------------------------------------------------------ setup
    def _load(self, store: TrajectoryStore, device: torch.device) -> None:
        self.obs_resident = store.resident(
            self.obs_keys, device=device, resize=self._resize_of(self.obs_keys)
        )
        self.action_resident = store.resident(
            self.action_keys,
            device=device,
            resize=self._resize_of(self.action_keys),
            decode_device=self.decode_device,
        )
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

    def _resize_of(self, keys: list[str]) -> dict | None:
        return {k: r for k, r in self.resize.items() if k in keys} or None

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
    def _train_batch(self) -> TensorDict | dict:
        # augmented as each camera leaf is gathered, before it is normalised
        return self._draw_train(self._augment_generator())

    def _draw_train(self, generator: torch.Generator | None = None) -> TensorDict | dict:
        leaf = None if generator is None else self._augmenting(generator)
        if self.window is not None:
            at, row, seg, weight = self.window.draw_rows(self.philox, self.batch_size)
            window = self.window
            return self._windows(
                row, seg, window.rows, weight, at=at, packed=window.packed, leaf=leaf
            )
        row, seg, weight = self._draw_rows(self.batch_size, segments=True)
        return self._windows(row, seg, self.train_rows, weight, leaf=leaf)

    def _augmenting(self, generator: torch.Generator):
        """The leaf hook of a training batch: its camera columns augmented, then every
        floating column normalised."""

        def leaf(name: str, value: torch.Tensor) -> torch.Tensor:
            fns = self.augments.get(name)
            if fns is not None:
                value = apply_augments(fns, value, generator)
            return value if self._normalizer is None else self._normalize(name, value)

        return leaf

    def _make_val(self, i: int) -> TensorDict | dict:
        row, seg = self.val_rows.locate(self._val_numbers(i))
        weight = None
        if self.priorities is not None:
            weight = torch.ones(row.shape, dtype=torch.float32, device=self.device)
        if self.window is None:
            return self._windows(row, seg, self.val_rows, weight)
        rows = self.val_rows
        first, length = rows.start[seg], rows.length[seg]
        span = torch.tensor(self.frames.span, dtype=torch.int64, device=row.device)
        index, _ = offset_rows(row, first, length, span)  # the lowest and highest rows
        packed, _ = self._val_packed(index, self.window.packed)
        lo = int(index.min())
        return self._windows(row, seg, rows, weight, at=row - lo, packed=packed, first=first - lo)

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
        leaf: Any = None,
    ) -> TensorDict | dict:
        """The frames of store rows ``t``; with ``packed``, gathered around positions ``at``
        of it (``first``: the episodes' first positions, else ``rows``'); ``leaf(name,
        value)`` applied to each column's frames (default: normalisation)."""
        first = rows.start[seg] if first is None else first
        if packed is None:
            resident = {"obs": self.obs_resident.packed, "action": self.action_resident.packed}
            packed_of = resident.__getitem__
        else:
            packed_of = lambda role: packed  # noqa: E731 - one packed block for both roles
        leaves = self.frames.gather(
            packed_of,
            t if at is None else at,
            first,
            rows.length[seg],
            leaf or (self._normalize if self._normalizer is not None else None),
        )
        leaves["index"] = t
        leaves["episode"] = rows.episode[seg]
        if weight is not None:
            leaves["priority_weight"] = weight
        return self._finish(leaves, t.shape[0])

    def _normalize(self, name: str, leaf: torch.Tensor) -> torch.Tensor:
        norm = self._normalizer
        return norm.normalize(name, leaf) if name in norm.stats else leaf

    def __repr__(self) -> str:
        offsets = f"frame_offsets={self.frame_offsets}, " if self.frame_offsets else ""
        return (
            f"DemonstrationDataModule({str(self.store_path)!r}, batch_size={self.batch_size}, "
            f"obs_keys={self.obs_keys}, action_keys={self.action_keys}, "
            f"n_obs_steps={self.n_obs_steps}, action_horizon={self.action_horizon}, {offsets}"
            f"sampler={self.sampler.value!r}, resident={self.resident!r}, "
            f"train_episodes={len(self.split.train)}, val_episodes={len(self.split.val)})"
        )
