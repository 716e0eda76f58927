"""Length-T windows inside episodes as a torchrl ``Sampler``.

The unit of sampling for Dreamer-style world models, MuZero-style search and action
chunking. Episode boundaries come from the storage's explicit episode index
(``storage.episode_segments()``, kept on write), never from scanning done flags, so a
sample costs the same at 10^3 and 10^8 rows. See :mod:`torchstore.samplers.windows` for the
distribution (uniform over all valid windows) and the padding rule.

Shape contract with torchrl. ``rb.sample(batch_size)`` must get a flat 1-D index, so the
sampler returns ``num_windows * length`` rows, window by window: rows ``[i * length, (i+1) *
length)`` are window ``i`` in time order. Reshape the batch with
``td.reshape(num_windows, length)`` (or ``batch.view(num_windows, length, ...)``). The
``info`` entries, ``[B]`` each, land in the sampled TensorDict with
``TensorDictReplayBuffer``:

- ``"episode_id"``: the episode of the row;
- ``"window_id"``: which window of the batch (0 .. num_windows - 1) the row belongs to, so
  two windows from one episode stay distinguishable;
- ``"window_step"``: the step within the window (0 .. length - 1);
- ``"mask"``: ``False`` on padded steps (all ``True`` unless ``pad=True``).

:meth:`SequenceWindowSampler.sample_windows` returns the ``[num_windows, length]`` index
directly for callers that gather rows themselves.

LeRobot's frame selection: ``SequenceWindowSampler(offsets=[-10, -1, 0, 1, 2])`` takes, for
an anchor row drawn uniformly over every row of the episodes (as ``LeRobotDataset`` draws its
frames), the rows ``anchor + offsets`` (any offsets: strides, history) clamped to the
anchor's episode, with ``mask`` ``False`` where an offset left it (LeRobot's ``_is_pad``,
inverted); windows then have ``len(offsets)`` rows. Per-column offsets need a gather per
column, which a torchrl storage does not do: :class:`~torchstore.lightning.
DemonstrationDataModule` takes those (``frame_offsets=`` / ``delta_timestamps=``).

Prioritized windows: pass ``priority=PrioritizedSampler(capacity, ...)``. A window's
priority is the priority of its **start row**, so windows are drawn with probability
proportional to ``(p_start + eps) ** alpha`` over all valid window starts (two levels: a
segment by its start rows' mass, then a start row inside it by a range-restricted sum-tree
descent). New rows get the running max priority on write (``mark_update``). Update with
``rb.update_priority(batch["index"], td_error)``: every row gets its own value, and the
windows starting at those rows follow; ``info["priority_weight"]`` holds
``(p_start / p_min) ** -beta`` with ``p_min`` over valid start rows, repeated over each
window. ``TensorDictReplayBuffer.update_tensordict_priority`` is a no-op with this sampler
(torchrl checks for its ``PrioritizedSampler`` class), and a storage filled before the
buffer was built holds priority 0 until updated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.errors import ArgumentError, EmptyStorageError, UnsupportedError
from torchstore.samplers.ere import ERE
from torchstore.samplers.frame_offsets import check_frame_offsets
from torchstore.samplers.prioritized import PrioritizedSampler
from torchstore.samplers.uniform import (
    _SamplerCommon,
    ring_geometry,
    storage_device,
    unravel_rows,
)
from torchstore.samplers.windows import (
    Windows,
    clip_segments,
    offset_windows,
    sample_windows,
    window_counts,
    windows_at,
)
from torchstore.validation import positive_int

__all__ = ["SequenceWindowSampler"]


def _n_envs(storage: Any) -> int:
    """Env streams per time row of a StoreReplay (1 for a 1-D storage)."""
    if getattr(storage, "ndim", 1) <= 1:
        return 1
    width = getattr(storage, "n_envs", None)
    if width is None:
        raise TypeError(
            f"SequenceWindowSampler over an N-d {type(storage).__name__} needs its per-stream "
            "episode index; use StoreReplay(ndim=2)"
        )
    return int(width)


class SequenceWindowSampler(_SamplerCommon, Sampler):
    """Windows of ``length`` consecutive rows that never cross an episode or the ring's wrap.

    Args:
        length: rows per window (>= 1); ``None`` with ``offsets``.
        num_windows: windows per batch; ``None`` derives it as ``batch_size // length``
            (``batch_size`` must then be a multiple of ``length``). When given,
            ``batch_size`` must equal ``num_windows * length``.
        pad: let episodes shorter than ``length`` give one window, padded by repeating
            their last row, with ``mask`` ``False`` on the padding.
        offsets: frame offsets from an anchor row (module docstring): every row of every
            episode is an anchor, and offsets leaving the episode are clamped and masked
            (``pad`` does not apply). ``length`` is then ``len(offsets)``.
        ere: an :class:`~torchstore.samplers.ERE` schedule: windows lie wholly inside the
            newest ``c_k`` rows.
        generator: a ``torch.Generator`` or an int seed (the buffer's generator wins).
        priority: a :class:`~torchstore.samplers.PrioritizedSampler` whose capacity equals
            the ring's: it holds the row priorities, ``alpha``, ``beta`` (and its schedule)
            and ``eps``, and windows are drawn by the priority of their start row. Its own
            ``ere`` and generator are not used.

    Raises:
        ValueError: if ``length < 1`` or ``num_windows < 1``, neither ``length`` nor
            ``offsets`` is given, or ``length`` is not ``len(offsets)``.
        TypeError: if ``priority`` is not a torchstore ``PrioritizedSampler``.

    Examples:
        >>> sampler = SequenceWindowSampler(8, num_windows=4)
        >>> # rb = TensorDictReplayBuffer(storage=store, sampler=sampler)
        >>> # batch = rb.sample(32).reshape(4, 8)
    """

    def __init__(
        self,
        length: int | None = None,
        *,
        num_windows: int | None = None,
        pad: bool = False,
        offsets: Sequence[int] | None = None,
        ere: ERE | None = None,
        generator: torch.Generator | int | None = None,
        priority: PrioritizedSampler | None = None,
        seed: int | None = None,
        stream: int = 0,
    ) -> None:
        if priority is not None and not isinstance(priority, PrioritizedSampler):
            raise TypeError(
                "priority must be a torchstore PrioritizedSampler or None, "
                f"got {type(priority).__name__}"
            )
        if offsets is not None:
            offsets = check_frame_offsets({"offsets": offsets}, what="SequenceWindowSampler")[
                "offsets"
            ]
            if length is not None and length != len(offsets):
                raise ArgumentError(
                    f"length ({length!r}) must be len(offsets) = {len(offsets)}, or None"
                )
            length = len(offsets)
        elif length is None:
            raise ArgumentError(
                "SequenceWindowSampler needs length= (consecutive rows) or offsets= "
                "(frame offsets from an anchor row)"
            )
        length = positive_int("length", length, hint=" (the window length)")
        #: frame offsets from the anchor row, or None for windows of consecutive rows
        self.offsets: tuple[int, ...] | None = offsets
        num_windows = positive_int("num_windows", num_windows, allow_none=True)
        self._init_common(generator, ere)
        self._init_stream(seed, stream)
        self.length = length
        self.num_windows = num_windows
        self.pad = bool(pad)
        self.priority = priority

    def _windows_for(self, batch_size: int) -> int:
        if self.num_windows is not None:
            if batch_size != self.num_windows * self.length:
                raise ValueError(
                    f"batch_size must equal num_windows * length = {self.num_windows} * "
                    f"{self.length} = {self.num_windows * self.length}, got {batch_size}"
                )
            return self.num_windows
        if batch_size % self.length:
            raise ValueError(
                f"batch_size must be a multiple of the window length {self.length}, "
                f"got {batch_size}"
            )
        return batch_size // self.length

    def _segments(self, storage: Any) -> tuple[Tensor, Tensor, Tensor, int]:
        """Segments in the ring's time rows (per env stream with ``ndim=2``), and the modulus."""
        if not hasattr(storage, "episode_segments"):
            raise TypeError(
                "SequenceWindowSampler needs a storage with an episode index "
                f"(episode_segments()), such as StoreReplay; got {type(storage).__name__}"
            )
        start, length, episode_id = storage.episode_segments()
        n, capacity, cursor = ring_geometry(storage)
        width = _n_envs(storage)
        if width > 1:  # every env stream shares the time cursor
            n, capacity, cursor = n // width, capacity // width, cursor // width
        if self._ere is not None and n > 0:
            count = -(int(self._ere.recent_count(n * width)) // -width)
            start, length = clip_segments(
                start, length, cursor=cursor, count=count, capacity=capacity
            )
        return start, length, episode_id, capacity

    def _draw_shape(self) -> tuple[int, bool]:
        """``(T, pad)`` of the windows drawn: anchor rows (``T`` 1) with offsets."""
        return (self.length, self.pad) if self.offsets is None else (1, False)

    def _sampleable_count(self, storage: Any, batch_size: int) -> int:
        if len(storage) == 0:
            return 0
        _, length, _, _ = self._segments(storage)
        T, pad = self._draw_shape()
        return int(window_counts(length, T, pad=pad).sum())

    @torch.compiler.disable
    def sample_windows(self, storage: Any, num_windows: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw ``num_windows`` windows as a ``[num_windows, length]`` index.

        Runs outside ``torch.compile`` graphs: the episode segments have a data-dependent
        count, so the draw is host bookkeeping that a graph would recompile for as the
        buffer fills (torchrl's samplers draw outside the graph the same way).

        Returns:
            ``(index, info)``: ``index`` ``[n, T]`` int64 physical rows on the storage's
            device (flat rows ``time * n_envs + env`` with ``ndim=2``: every window stays in
            one env stream); ``info`` with ``"episode_id"`` ``[n]``, ``"start_step"`` ``[n]``
            (offset of the window in the surviving part of its episode; with ``offsets``, of
            the anchor row) and ``"mask"`` ``[n, T]``.

        Raises:
            EmptyStorageError: if the storage is empty, or no episode (within the ERE range)
                holds ``length`` rows and ``pad`` is off.
            TypeError: if the storage has no ``episode_segments()``.
        """
        if len(storage) == 0:
            raise EmptyStorageError(
                "Cannot sample from an empty storage: SequenceWindowSampler needs an episode"
            )
        start, length, episode_id, capacity = self._segments(storage)
        width = _n_envs(storage)
        weight = None
        if self.priority is not None and width > 1:
            raise UnsupportedError(
                "prioritized windows over an ndim=2 StoreReplay are not supported; use "
                "SequenceWindowSampler without priority= or a StoreReplay(ndim=1)"
            )
        T, pad = self._draw_shape()
        if self.priority is None:
            windows = sample_windows(
                start,
                length,
                episode_id,
                capacity=capacity,
                T=T,
                n=num_windows,
                pad=pad,
                generator=self.generator,
                stream=None if self.philox is None else self._follow_stream(storage),
            )
        else:
            windows, weight = self._sample_prioritized(
                start, length, episode_id, capacity, num_windows
            )
        if self.offsets is not None:
            offsets = torch.tensor(self.offsets, dtype=torch.int64, device=start.device)
            windows = offset_windows(
                start,
                length,
                episode_id,
                windows.segment,
                windows.start_step,
                offsets,
                capacity=capacity,
            )
        device = storage_device(storage)
        index = windows.index
        if width > 1:
            env = storage.segment_streams().to(index.device)[windows.segment]
            index = index * width + env.unsqueeze(-1)
        info = {
            "episode_id": windows.episode_id.to(device),
            "start_step": windows.start_step.to(device),
            "mask": windows.mask.to(device),
        }
        if weight is not None:
            info["priority_weight"] = weight.to(device)
        return index.to(device), info

    def _sample_prioritized(
        self, start: Tensor, length: Tensor, episode_id: Tensor, capacity: int, n: int
    ) -> tuple[Windows, Tensor]:
        """Windows by start-row priority: a segment by its start rows' mass, then a row."""
        prio = self.priority
        if prio.capacity != capacity:
            raise ValueError(
                f"window priority sampler capacity ({prio.capacity}) must equal the storage "
                f"capacity ({capacity})"
            )
        tree = prio.tree
        device = tree.device
        T, pad = self._draw_shape()
        counts = window_counts(length, T, pad=pad).to(device)
        seg_start = start.to(device)
        seg_mass = tree.total(counts, start=seg_start)
        positive = (seg_mass > 0).nonzero()
        if positive.numel() == 0:
            longest = int(length.max()) if length.numel() else 0
            if int(counts.sum()) == 0:
                raise EmptyStorageError(
                    f"no episode holds a window of length T={T}: the longest "
                    f"episode has {longest} rows; pass pad=True or use a shorter window"
                )
            raise EmptyStorageError(
                "all window start rows have priority 0; give some row a positive priority"
            )
        if self.philox is not None:
            u = self.philox.uniform(2 * n).to(device).reshape(2, n).T
        else:
            u = torch.rand(
                n,
                2,
                dtype=torch.float64,
                generator=self.generator,
                device=self._draw_device(device),
            ).to(device)
        cum = seg_mass.cumsum(0)
        seg = torch.searchsorted(cum, u[:, 0] * cum[-1], right=True)
        seg = seg.clamp(max=int(positive.max()))  # rounding never lands on a massless segment
        row, value, _ = tree.sample(u[:, 1], counts[seg], start=seg_start[seg])
        offset = (row - seg_start[seg]) % capacity
        p_min = tree.min(counts, start=seg_start).min()
        weight = prio._weights(value, p_min)
        seg = seg.to(start.device)
        windows = windows_at(
            start,
            length,
            episode_id,
            seg,
            offset.to(start.device),
            capacity=capacity,
            T=T,
        )
        return windows, weight

    def sample(self, storage: Any, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw ``batch_size // length`` windows as a flat index of ``batch_size`` rows.

        Raises:
            ValueError: if ``batch_size`` does not fit ``length``/``num_windows``.
            EmptyStorageError: as :meth:`sample_windows`.
        """
        n = self._windows_for(batch_size)
        index, info = self.sample_windows(storage, n)
        T = self.length
        device = index.device
        flat_info = {
            "episode_id": info["episode_id"].repeat_interleave(T),
            "window_id": torch.arange(n, device=device).repeat_interleave(T),
            "window_step": torch.arange(T, device=device).repeat(n),
            "mask": info["mask"].reshape(-1),
        }
        if "priority_weight" in info:
            flat_info["priority_weight"] = info["priority_weight"].repeat_interleave(T)
        return unravel_rows(storage, index.reshape(-1)), flat_info

    # ------------------------------------------------------------ priorities (delegated)
    @property
    def default_priority(self) -> float:
        """The priority sampler's default (1.0 without one)."""
        return 1.0 if self.priority is None else self.priority.default_priority

    def mark_update(self, index: int | Tensor, *, storage: Any = None) -> None:
        """Give freshly written rows the running max priority (when prioritized)."""
        if self.priority is not None:
            self.priority.mark_update(index, storage=storage)

    def update_priority(
        self, index: int | Tensor, priority: float | Tensor, *, storage: Any = None
    ) -> None:
        """Set row priorities; a window's priority is its start row's.

        Without ``priority=`` this warns like any non-prioritized torchrl sampler.
        """
        if self.priority is None:
            return super().update_priority(index, priority, storage=storage)
        self.priority.update_priority(index, priority, storage=storage)

    def state_dict(self) -> dict[str, Any]:
        """Window parameters, ERE schedule and own generator state."""
        return {
            "length": self.length,
            "num_windows": self.num_windows,
            "pad": self.pad,
            "offsets": None if self.offsets is None else list(self.offsets),
            "priority": None if self.priority is None else self.priority.state_dict(),
            **self._common_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.length = int(state_dict["length"])
        num_windows = state_dict["num_windows"]
        self.num_windows = None if num_windows is None else int(num_windows)
        self.pad = bool(state_dict["pad"])
        offsets = state_dict.get("offsets")
        self.offsets = None if offsets is None else tuple(int(o) for o in offsets)
        if state_dict.get("priority") is not None:
            if self.priority is None:
                raise ValueError(
                    "the checkpoint holds window priorities; build the sampler with "
                    "priority=PrioritizedSampler(capacity) before loading it"
                )
            self.priority.load_state_dict(state_dict["priority"])
        self._load_common_state(state_dict)

    def _empty(self) -> None:
        if self.priority is not None:
            self.priority._empty()

    def __repr__(self) -> str:
        offsets = "" if self.offsets is None else f"offsets={list(self.offsets)}, "
        return (
            f"SequenceWindowSampler(length={self.length}, num_windows={self.num_windows}, "
            f"{offsets}pad={self.pad}, ere={self._ere}, priority={self.priority})"
        )
