"""Which frames of step ``t``'s episode each column of a demonstration batch takes.

A :class:`FrameSelection` is the DataModule's table of frame offsets per column and role:
``n_obs_steps`` / ``action_horizon`` are one table (every observation at ``1 - n_obs_steps
.. 0``, every action at ``0 .. action_horizon - 1``); ``frame_offsets`` or LeRobot's
``delta_timestamps`` set any column's own offsets (strided, a frame from a second ago),
the others keeping their role's. Offsets that leave the episode take its first or last
frame and are marked as padding (:func:`~torchstore.samplers.windows.offset_rows`), so a
sample never crosses an episode.

A batch is gathered per distinct table: the rows of one table are worked out once, and the
columns that use it are read together when they hold most of a row, else each column's
own bytes (:meth:`~torchstore.data.rows.packed.PackedColumns.gather_columns`). An action
chunk of 50 steps beside a camera frame at ``[0]`` therefore reads ``B`` frames and ``50
B`` actions, never the ``50 B`` frames a whole-row gather of the chunk would read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchstore.data.columns import column_key, set_nested
from torchstore.data.rows.packed import PackedColumns
from torchstore.errors import ArgumentError
from torchstore.samplers.frame_offsets import check_frame_offsets, offsets_of_timestamps
from torchstore.samplers.windows import offset_rows

__all__ = ["FrameSelection", "PAD_SUFFIX", "recorded_fps", "resolve_frame_offsets"]

#: a column's pad mask is ``f"{name}{PAD_SUFFIX}"``, as LeRobot names it
PAD_SUFFIX = "_is_pad"
ROLES = ("obs", "action")


def recorded_fps(metadata: Mapping[str, Any]) -> float | None:
    """The frame rate a store's manifest metadata records: a LeRobot import's
    (``metadata["lerobot"]["fps"]``), a motion import's (``metadata["motion"]["fps"]``),
    or a top-level ``metadata["fps"]``; None when there is none."""
    for section in ("lerobot", "motion"):
        value = metadata.get(section)
        if isinstance(value, Mapping) and value.get("fps") is not None:
            return float(value["fps"])
    value = metadata.get("fps")
    return None if value is None else float(value)


def resolve_frame_offsets(
    *,
    frame_offsets: Mapping[Any, Any] | None,
    delta_timestamps: Mapping[Any, Any] | None,
    fps: float | None,
    tolerance_s: float,
    metadata: Mapping[str, Any],
    source: Any,
) -> dict[str, tuple[int, ...]] | None:
    """The per-column frame offsets asked for, in frames (None: none asked for).

    ``delta_timestamps`` are converted at ``fps``, else at the frame rate the store records
    (:func:`recorded_fps`; ``source`` names the store in the error when it records none).

    Raises:
        ArgumentError: for both tables at once, no frame rate, or an offset off the grid.
    """
    if frame_offsets is not None and delta_timestamps is not None:
        raise ArgumentError("pass frame_offsets (frames) or delta_timestamps (seconds), not both")
    if frame_offsets is not None:
        return check_frame_offsets(frame_offsets)
    if delta_timestamps is None:
        return None
    rate = fps if fps is not None else recorded_fps(metadata)
    if rate is None:
        raise ArgumentError(
            f"delta_timestamps are seconds, and {source} records no frame rate (a LeRobot "
            "import records its fps); pass fps= or give the offsets in frames with frame_offsets="
        )
    return offsets_of_timestamps(delta_timestamps, rate, tolerance_s)


class FrameSelection:
    """The frame offsets of every (role, column) of a demonstration batch, and its gather.

    Args:
        obs_keys, action_keys: the columns of each role.
        n_obs_steps, action_horizon: each role's offsets for a column not in
            ``frame_offsets``: ``1 - n_obs_steps .. 0`` and ``0 .. action_horizon - 1``.
        frame_offsets: per column, its own offsets (:func:`resolve_frame_offsets`), or
            None: the roles' tables only, with one mask per role (``obs_mask`` and
            ``action_mask``, ``True`` on real steps). With a table, every column gets its
            LeRobot pad mask ``<name>_is_pad`` (``True`` on padded steps) instead.

    Raises:
        ArgumentError: for a ``frame_offsets`` column that is in neither role, or a column
            in both roles without its own offsets (its two tables would share one mask).
    """

    def __init__(
        self,
        obs_keys: Sequence[str],
        action_keys: Sequence[str],
        *,
        n_obs_steps: int,
        action_horizon: int,
        frame_offsets: Mapping[str, tuple[int, ...]] | None = None,
    ):
        defaults = {
            "obs": tuple(range(1 - n_obs_steps, 1)),
            "action": tuple(range(action_horizon)),
        }
        keys = {"obs": list(obs_keys), "action": list(action_keys)}
        self.per_key = frame_offsets is not None
        table = dict(frame_offsets or {})
        known = set(keys["obs"]) | set(keys["action"])
        for name in table:
            if name not in known:
                raise ArgumentError(
                    f"frame_offsets/delta_timestamps key {name!r} is in neither obs_keys "
                    f"{keys['obs']} nor action_keys {keys['action']}; add it to one of them"
                )
        if self.per_key:
            for name in set(keys["obs"]) & set(keys["action"]):
                if name not in table:
                    raise ArgumentError(
                        f"column {name!r} is in obs_keys and action_keys: give it its own "
                        "offsets in frame_offsets/delta_timestamps (it has one pad mask)"
                    )
        #: ``(role, name) -> offsets``, in the roles' key order
        self.offsets: dict[tuple[str, str], tuple[int, ...]] = {
            (role, name): table.get(name, defaults[role]) for role in ROLES for name in keys[role]
        }
        self.role_offsets = defaults
        every = [o for offsets in self.offsets.values() for o in offsets]
        #: the lowest and highest offset of any column
        self.span = (min(every), max(every))
        self._tensors: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}

    def column_offsets(self) -> dict[str, tuple[int, ...]]:
        """Each column's offsets by name (a column in both roles has one table then)."""
        return {name: offsets for (_, name), offsets in self.offsets.items()}

    def _tensor(self, offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
        tensor = self._tensors.get((offsets, device))
        if tensor is None:
            tensor = torch.tensor(offsets, dtype=torch.int64, device=device)
            self._tensors[(offsets, device)] = tensor
        return tensor

    def gather(
        self,
        packed_of: Callable[[str], PackedColumns],
        at: torch.Tensor,
        first: torch.Tensor,
        length: torch.Tensor,
        normalize: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """The batch's ``"obs"`` and ``"action"`` trees and its masks for steps ``at``.

        Args:
            packed_of: the packed rows a role's columns are gathered from.
            at: ``[B]`` positions of the steps ``t`` in those packed rows.
            first, length: ``[B]`` first position and length of each step's episode.
            normalize: ``normalize(name, leaf)`` applied to every leaf, or None.
        """
        groups: dict[tuple[int, tuple[int, ...]], list[tuple[str, str]]] = {}
        sources: dict[int, PackedColumns] = {}
        for (role, name), offsets in self.offsets.items():
            packed = packed_of(role)
            sources[id(packed)] = packed
            groups.setdefault((id(packed), offsets), []).append((role, name))
        pads: dict[tuple[int, ...], torch.Tensor] = {}
        leaves: dict[str, Any] = {"obs": {}, "action": {}}
        for (source, offsets), members in groups.items():
            index, pad = offset_rows(at, first, length, self._tensor(offsets, at.device))
            pads[offsets] = pad
            names = list(dict.fromkeys(name for _, name in members))
            gathered = sources[source].gather_columns(index.reshape(-1), names)
            for role, name in members:
                leaf = gathered[name].unflatten(0, index.shape)
                if normalize is not None:
                    leaf = normalize(name, leaf)
                set_nested(leaves[role], column_key(name), leaf)
        if self.per_key:
            for (_, name), offsets in self.offsets.items():
                leaves[name + PAD_SUFFIX] = pads[offsets]
        else:
            for role in ROLES:
                offsets = self.role_offsets[role]
                pad = pads.get(offsets)
                if pad is None:
                    pad = offset_rows(at, first, length, self._tensor(offsets, at.device))[1]
                leaves[f"{role}_mask"] = ~pad
        return leaves
