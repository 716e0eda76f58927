"""Recording gymnasium environments into trajectory stores.

:class:`RecordEpisodes` wraps an env (:class:`RecordVectorEpisodes` a vector env) and
records every episode it plays; :func:`record`
plays a policy for a number of episodes (single or vector envs); the columns come from the
env's spaces (:func:`space_columns`). Names load on first use, so the space helpers
import without gymnasium.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.gym.recorder import (
        EpisodeRecorder,
        RecordEpisodes,
        RecordVectorEpisodes,
        record,
    )
    from torchstore.gym.spaces import space_columns

_EXPORTS = {
    "EpisodeRecorder": "torchstore.gym.recorder",
    "RecordEpisodes": "torchstore.gym.recorder",
    "RecordVectorEpisodes": "torchstore.gym.recorder",
    "record": "torchstore.gym.recorder",
    "space_columns": "torchstore.gym.spaces",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["EpisodeRecorder", "RecordEpisodes", "RecordVectorEpisodes", "record", "space_columns"]
