"""``meta/rejected_episodes.json``: episodes an operator rejected after recording.

LeRobot has no such flag (its only "reject" is discarding the episode in progress), so
this is torchstore's own file beside LeRobot's metadata; LeRobot ignores it and loads
every episode, torchstore's importer skips the listed ones unless asked not to. The
file is a JSON list of ``{"episode_index", "reason", "time"}`` objects, rewritten
atomically on every change.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.layout import REJECTED

__all__ = ["RejectedEpisode", "read_rejected", "write_rejected", "now_iso"]


@dataclass(frozen=True, slots=True)
class RejectedEpisode:
    episode_index: int
    reason: str
    time: str


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_rejected(root: str | os.PathLike) -> dict[int, RejectedEpisode]:
    """``{episode_index: RejectedEpisode}``; an absent file means none were rejected."""
    from torchstore.lerobot.info import read_json

    path = Path(root) / REJECTED
    data = read_json(path, missing=[])
    if not isinstance(data, list):
        raise LeRobotFormatError(f"{path} must hold a JSON list of rejected episodes")
    out: dict[int, RejectedEpisode] = {}
    for item in data:
        try:
            index = item["episode_index"]
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise TypeError
            out[index] = RejectedEpisode(
                index, str(item.get("reason", "")), str(item.get("time", ""))
            )
        except (TypeError, KeyError):
            raise LeRobotFormatError(
                f"{path}: entry {item!r} needs a non-negative int 'episode_index'"
            ) from None
    return out


def write_rejected(root: str | os.PathLike, rejected: dict[int, RejectedEpisode]) -> None:
    from torchstore.lerobot.info import write_json_atomically

    write_json_atomically(Path(root) / REJECTED, [asdict(rejected[i]) for i in sorted(rejected)])
