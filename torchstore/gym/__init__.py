"""Recording gymnasium environments into trajectory stores.

:class:`RecordEpisodes` wraps an env and records every episode it plays; :func:`record`
plays a policy for a number of episodes (single or vector envs); the columns come from the
env's spaces (:func:`space_columns`).
"""

from torchstore.gym.recorder import EpisodeRecorder, RecordEpisodes, record
from torchstore.gym.spaces import space_columns

__all__ = ["EpisodeRecorder", "RecordEpisodes", "record", "space_columns"]
