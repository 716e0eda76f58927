"""D4RL-style flat HDF5: episodes from terminals | timeouts, exact rows, hostile files named."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from torchstore.cli import main
from torchstore.data import TrajectoryStore
from torchstore.errors import DatasetFormatError
from torchstore.minari import import_d4rl


def _d4rl_file(path, *, n=10, next_obs=True, column_flags=False):
    rng = np.random.default_rng(0)
    terminals = np.zeros(n, dtype=bool)
    timeouts = np.zeros(n, dtype=bool)
    terminals[3], timeouts[6] = True, True
    data = {
        "observations": rng.standard_normal((n, 3)).astype(np.float32),
        "actions": rng.standard_normal((n, 2)).astype(np.float32),
        "rewards": rng.standard_normal((n, 1) if column_flags else n),
        "terminals": terminals[:, None] if column_flags else terminals,
        "timeouts": timeouts.astype(np.float32),
    }
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            f[k] = v
        if next_obs:
            f["next_observations"] = data["observations"] + 1
        f["infos/qpos"] = rng.standard_normal((n, 4))
        f["infos/goal"] = rng.integers(0, 5, n)
        f["metadata/algorithm"] = b"random"
        f["metadata/policy/fc0"] = np.zeros((3, 3))
    return data


@pytest.mark.parametrize("column_flags", [False, True])
def test_a_d4rl_file_imports_exactly(tmp_path, column_flags):
    data = _d4rl_file(tmp_path / "d.hdf5", column_flags=column_flags)
    path = import_d4rl(tmp_path / "d.hdf5", tmp_path / "d.h5", env_id="Hopper-v5")
    with TrajectoryStore(path) as s:
        assert s.episodes.lengths.tolist() == [
            4,
            3,
            3,
        ]  # ends at 3 (terminal), 6 (timeout), then a tail
        assert s.episode_metadata(2) == {"unfinished": True} and s.episode_metadata(0) == {}
        rows = s[:]
        assert np.array_equal(rows["obs"].numpy(), data["observations"])
        assert np.array_equal(rows["next", "obs"].numpy(), data["observations"] + 1)
        assert np.array_equal(rows["action"].numpy(), data["actions"])
        assert np.array_equal(rows["reward"].numpy(), np.asarray(data["rewards"]).reshape(-1))
        assert rows["terminated"].nonzero().flatten().tolist() == [3]
        assert rows["truncated"].nonzero().flatten().tolist() == [6]
        assert rows["done"].nonzero().flatten().tolist() == [3, 6]
        assert (
            rows["info", "qpos"].shape == (10, 4)
            and rows["info", "goal"].dtype.is_floating_point is False
        )
        assert s.manifest.env_id == "Hopper-v5"
        assert s.manifest.metadata["d4rl"] == {"source": "d.hdf5", "algorithm": "random"}


def test_without_next_observations_there_is_no_next_column(tmp_path):
    _d4rl_file(tmp_path / "d.hdf5", next_obs=False)
    with TrajectoryStore(import_d4rl(tmp_path / "d.hdf5", tmp_path / "d.h5")) as s:
        assert "next/obs" not in {c.name for c in s.columns}


def test_hostile_d4rl_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.hdf5"
    with h5py.File(bad, "w") as f:
        f["observations"] = np.zeros((5, 3), np.float32)
        f["actions"] = np.zeros((5, 1), np.float32)
    with pytest.raises(DatasetFormatError, match=r"lacks \['rewards', 'terminals'\]"):
        import_d4rl(bad, tmp_path / "x.h5")
    with h5py.File(bad, "a") as f:
        f["rewards"] = np.zeros(4)
        f["terminals"] = np.zeros(5)
    with pytest.raises(DatasetFormatError, match="'rewards' has 4 rows, 'observations' has 5"):
        import_d4rl(bad, tmp_path / "x.h5")
    with h5py.File(bad, "a") as f:
        del f["rewards"]
        f["rewards"] = np.zeros((5, 2))
    with pytest.raises(
        DatasetFormatError, match=r"'rewards' must be numbers of shape \[5\] or \[5, 1\]"
    ):
        import_d4rl(bad, tmp_path / "x.h5")
    with h5py.File(bad, "a") as f:
        del f["rewards"]
        f["rewards"] = np.zeros(5)
        del f["terminals"]
        f["terminals"] = np.full(5, 2)
    with pytest.raises(DatasetFormatError, match="'terminals' must hold only 0/1"):
        import_d4rl(bad, tmp_path / "x.h5")
    with h5py.File(bad, "a") as f:
        del f["terminals"]
        f["terminals"] = np.zeros(5)
        f["next_observations"] = np.zeros((5, 2), np.float32)
    with pytest.raises(DatasetFormatError, match="'next_observations' has shape"):
        import_d4rl(bad, tmp_path / "x.h5")
    _d4rl_file(tmp_path / "good.hdf5")
    truncated = tmp_path / "truncated.hdf5"
    raw = (tmp_path / "good.hdf5").read_bytes()
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetFormatError, match="truncated.hdf5"):
        import_d4rl(truncated, tmp_path / "x.h5")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(DatasetFormatError, match="is not a readable HDF5 file"):
        import_d4rl(tmp_path / "text.hdf5", tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    assert main(["import-d4rl", str(truncated), str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("torchstore import-d4rl: ")
    assert (
        main(
            [
                "import-d4rl",
                str(tmp_path / "good.hdf5"),
                str(tmp_path / "y.h5"),
                "--env-id",
                "Hopper-v5",
            ]
        )
        == 0
    )
    with TrajectoryStore(tmp_path / "y.h5") as s:
        assert s.num_rows == 10 and s.manifest.env_id == "Hopper-v5"


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchstore.minari.d4rl import episode_lengths  # noqa: E402


@given(st.lists(st.booleans(), min_size=1, max_size=200))
def test_episodes_end_exactly_at_the_flags(flags):
    ends = np.array(flags, dtype=bool)
    lengths, unfinished = episode_lengths(ends)
    assert sum(lengths) == len(ends) and all(n > 0 for n in lengths)
    stops = np.cumsum(lengths) - 1
    finished = stops[:-1] if unfinished else stops
    assert finished.tolist() == np.flatnonzero(ends).tolist()
    assert unfinished == (not ends[-1])
