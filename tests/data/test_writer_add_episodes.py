"""TrajectoryStoreWriter.add_episodes: several episodes, one commit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchstore import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import EpisodeError

COLUMNS = [ColumnSpec("obs", torch.float32, (2,)), ColumnSpec("next/r", torch.float64)]


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {"obs": np.stack([k, -k], 1).astype(np.float32), "next/r": k * 0.5}


def test_add_episodes_splits_rows_into_episodes_with_their_metadata(tmp_path):
    path = tmp_path / "s.h5"
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        assert w.add_episode(rows(2), metadata={"i": 0}) == 0
        assert w.add_episodes(rows(9, 2), [4, 1, 4], [{"i": 1}, None, {"i": 3}]) == range(1, 4)
        assert w.add_episodes(rows(3, 11), [3]) == range(4, 5)
        assert (w.num_episodes, w.num_rows) == (5, 14)
    with TrajectoryStore(path) as store:
        assert [int(n) for n in store.episodes.lengths] == [2, 4, 1, 4, 3]
        assert [store.episode_metadata(e) for e in range(5)] == [
            {"i": 0},
            {"i": 1},
            {},
            {"i": 3},
            {},
        ]
        np.testing.assert_array_equal(store.episode(3)["obs"][:, 0].numpy(), np.arange(7, 11))
        np.testing.assert_array_equal(
            store.episode(4)[("next", "r")].numpy(), np.arange(11, 14) * 0.5
        )


@pytest.mark.parametrize(
    ("lengths", "metadata", "match"),
    [
        ([4, 4], None, "9 rows, the lengths sum to 8"),
        ([9, 0], None, "positive"),
        ([], None, "positive"),
        ([5, 4], [{}], "1 metadata entries for 2 episodes"),
        ([5, 4], [{"x": float("nan")}, None], "JSON-serialisable"),
    ],
)
def test_add_episodes_refuses_and_commits_nothing(tmp_path, lengths, metadata, match):
    path = tmp_path / "s.h5"
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        w.add_episode(rows(2))
        with pytest.raises(EpisodeError, match=match):
            w.add_episodes(rows(9), lengths, metadata)
        assert (w.num_episodes, w.num_rows, w.pending_rows) == (1, 2, 0)
        w.add_episodes(rows(3), [1, 2])  # the writer is still usable
    with TrajectoryStore(path) as store:
        assert [int(n) for n in store.episodes.lengths] == [2, 1, 2]


def test_add_episodes_refuses_pending_rows(tmp_path):
    with TrajectoryStoreWriter(tmp_path / "s.h5", COLUMNS) as w:
        w.append(rows(2))
        with pytest.raises(EpisodeError, match="already appended"):
            w.add_episodes(rows(2), [2])
