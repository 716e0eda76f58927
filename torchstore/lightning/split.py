"""Which episodes train, which validate, and which ones a DDP rank samples.

Splits are by whole episodes, so no validation row ever shares an episode with a training
row. The validation episodes are the **last** ones in the store (its newest data, the
same set whatever the seed or the number of ranks), which also keeps the training rows one
contiguous block ``[0, first validation row)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torchstore.validation import fraction, non_negative_int

__all__ = ["EpisodeSplit", "named_split", "split_episodes", "shard_episodes", "validation_count"]

_COUNT_HINT = "; pass an int for a count of episodes"


@dataclass(frozen=True, slots=True)
class EpisodeSplit:
    """Episode numbers (int64, ascending) of the training and the validation set."""

    train: torch.Tensor
    val: torch.Tensor


def validation_count(val_episodes: float | int, num_episodes: int) -> int:
    """How many episodes ``val_episodes`` asks for.

    A float is a fraction in ``[0, 1)`` of ``num_episodes``, rounded half up, and at least
    one episode when the fraction is positive; an int is a count.

    Raises:
        ValueError: for a bool, a negative value, a fraction ``>= 1``, or a split that
            leaves no training episode.
    """
    if isinstance(val_episodes, bool) or not isinstance(val_episodes, (int, float)):
        raise ValueError(
            f"val_episodes ({val_episodes!r}) must be a fraction in [0, 1) or an int count"
        )
    if isinstance(val_episodes, float):
        fraction("val_episodes", val_episodes, high_open=True, hint=_COUNT_HINT)
        count = math.floor(val_episodes * num_episodes + 0.5)
        if val_episodes > 0:
            count = max(count, 1)
    else:
        count = non_negative_int("val_episodes", val_episodes)
    if count >= num_episodes:
        raise ValueError(
            f"val_episodes ({val_episodes!r}) leaves no training episodes: {count} of the "
            f"store's {num_episodes} episodes would validate"
        )
    return count


def named_split(num_episodes: int, name: str, episode_sets: dict | None) -> EpisodeSplit:
    """Validate on the store's episode set ``name`` (e.g. robomimic's ``valid`` filter key,
    kept as ``metadata["episode_sets"]``), train on every other episode.

    Raises:
        ValueError: the store has no such set, it names episodes the store lacks, or it
            leaves no training episode.
    """
    sets = episode_sets or {}
    if name not in sets:
        raise ValueError(
            f"val_episodes={name!r} names no episode set of the store; its sets: "
            f"{sorted(sets) or 'none'} (metadata['episode_sets'])"
        )
    val = torch.tensor(sorted({int(i) for i in sets[name]}), dtype=torch.int64)
    if len(val) == 0:
        raise ValueError(
            f"episode set {name!r} is empty: nothing would validate (val_episodes=0 for no "
            "validation)"
        )
    if len(val) and (int(val[0]) < 0 or int(val[-1]) >= num_episodes):
        raise ValueError(
            f"episode set {name!r} names episodes outside the store's 0..{num_episodes - 1}"
        )
    keep = torch.ones(num_episodes, dtype=torch.bool)
    keep[val] = False
    train = torch.arange(num_episodes, dtype=torch.int64)[keep]
    if len(train) == 0:
        raise ValueError(f"episode set {name!r} holds every episode: none would train")
    return EpisodeSplit(train=train, val=val)


def split_episodes(
    num_episodes: int, val_episodes: float | int | str, episode_sets: dict | None = None
) -> EpisodeSplit:
    """Train on the first episodes, validate on the last ``validation_count(...)``; a str
    names one of the store's episode sets to validate on (:func:`named_split`)."""
    if isinstance(val_episodes, str):
        return named_split(num_episodes, val_episodes, episode_sets)
    n_val = validation_count(val_episodes, num_episodes)
    ids = torch.arange(num_episodes, dtype=torch.int64)
    return EpisodeSplit(train=ids[: num_episodes - n_val], val=ids[num_episodes - n_val :])


def shard_episodes(episodes: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s share of ``episodes``: every ``world_size``-th one, from ``rank``.

    Raises:
        ValueError: if there are fewer episodes than ranks (a rank would have nothing).
    """
    if len(episodes) < world_size:
        raise ValueError(
            f"shard_episodes needs at least one training episode per rank: "
            f"{len(episodes)} training episodes for {world_size} ranks"
        )
    return episodes[rank::world_size]
