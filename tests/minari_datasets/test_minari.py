"""Minari both ways, exact, against datasets minari's own code writes (HDF5 and Arrow)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium", reason="Minari interop needs gymnasium")
minari = pytest.importorskip("minari", reason='Minari interop needs: pip install -e ".[interop]"')
from gymnasium import spaces  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

from torchstore.cli import main  # noqa: E402
from torchstore.data import TrajectoryStore  # noqa: E402
from torchstore.errors import ColumnError, DatasetFormatError, DestinationExistsError  # noqa: E402
from torchstore.gym import record  # noqa: E402
from torchstore.minari import export_minari, import_minari  # noqa: E402

FORMATS = ["hdf5", "arrow"]


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    warnings.simplefilter("ignore", UserWarning)  # minari warns about missing author fields


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _assert_equal_datasets(a, b) -> None:
    assert a.total_episodes == b.total_episodes and a.total_steps == b.total_steps
    for x, y in zip(a.iterate_episodes(), b.iterate_episodes(), strict=True):
        for field in ("observations", "actions", "rewards", "terminations", "truncations", "infos"):
            assert _same(getattr(x, field), getattr(y, field)), field
    ids = list(a.episode_indices)
    assert [m.get("seed") for m in a.storage.get_episode_metadata(ids)] == [
        m.get("seed") for m in b.storage.get_episode_metadata(ids)
    ]


def _cartpole_buffers(episodes: int) -> list:
    """Episodes played on a real CartPole, as minari's EpisodeBuffers (T+1 obs and infos)."""
    env = gym.make("CartPole-v1")
    env.action_space.seed(0)
    buffers = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=ep)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        while True:
            a = env.action_space.sample()
            obs, r, term, trunc, _ = env.step(a)
            observations.append(obs)
            actions.append(a)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            if term or trunc:
                break
        steps = np.arange(len(observations), dtype=np.int64).reshape(-1, 1)
        buffers.append(
            EpisodeBuffer(
                id=ep,
                seed=ep,
                observations=np.stack(observations),
                actions=np.array(actions),
                rewards=rewards,
                terminations=terms,
                truncations=truncs,
                infos={"step": steps},
            )
        )
    return buffers


def _dict_buffers() -> tuple[list, spaces.Space, spaces.Space]:
    obs_space = spaces.Dict(
        pos=spaces.Box(-1, 1, (2,), np.float32),
        tup=spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (1,), np.float64))),
    )
    act_space = spaces.Box(-1, 1, (1,), np.float32)
    rng = np.random.default_rng(0)
    buffers = []
    for ep in range(3):
        T = 4 + ep
        obs = {
            "pos": rng.random((T + 1, 2), dtype=np.float32),
            "tup": (np.arange(T + 1) % 3, rng.random((T + 1, 1))),
        }
        buffers.append(
            EpisodeBuffer(
                id=ep,
                seed=10 + ep,
                observations=obs,
                actions=rng.random((T, 1), dtype=np.float32),
                rewards=list(rng.random(T)),
                terminations=[False] * (T - 1) + [True],
                truncations=[False] * T,
                infos={"x": np.arange(T + 1).reshape(T + 1, 1)},
            )
        )
    return buffers, obs_space, act_space


@pytest.mark.parametrize("fmt", FORMATS)
def test_cartpole_round_trip_is_exact(tmp_path, fmt):
    source = minari.create_dataset_from_buffers(
        f"probe/cartpole-{fmt}-v0", _cartpole_buffers(4), env="CartPole-v1", data_format=fmt
    )
    store = import_minari(f"probe/cartpole-{fmt}-v0", tmp_path / "c.h5")
    with TrajectoryStore(store) as s:
        assert s.num_episodes == 4 and s.num_rows == source.total_steps
        assert s.manifest.env_id == "CartPole-v1"
        assert s.episode_metadata(2) == {"seed": 2, "minari_id": 2}
        ep = s.episode(0)
        first = next(source.iterate_episodes())
        assert np.array_equal(ep["obs"].numpy(), first.observations[:-1])
        assert np.array_equal(ep["next", "obs"][-1].numpy(), first.observations[-1])
        assert np.array_equal(ep["info", "step"].numpy(), first.infos["step"][:-1])
        assert s.make_env().spec.id == "CartPole-v1"
    out = export_minari(store, f"back/cartpole-{fmt}-v0", data_format=fmt)
    assert out == tmp_path / "minari" / "back" / f"cartpole-{fmt}-v0"
    back = minari.load_dataset(f"back/cartpole-{fmt}-v0")
    _assert_equal_datasets(source, back)
    assert back.env_spec.id == "CartPole-v1"
    assert back.recover_environment().spec.id == "CartPole-v1"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dict_and_tuple_spaces_round_trip(tmp_path, fmt):
    buffers, obs_space, act_space = _dict_buffers()
    source = minari.create_dataset_from_buffers(
        f"probe/dict-{fmt}-v0",
        buffers,
        observation_space=obs_space,
        action_space=act_space,
        data_format=fmt,
    )
    store = import_minari(tmp_path / "minari" / "probe" / f"dict-{fmt}-v0", tmp_path / "d.h5")
    with TrajectoryStore(store) as s:
        assert {c.name for c in s.columns} >= {
            "obs/pos",
            "obs/tup/0",
            "obs/tup/1",
            "next/obs/tup/1",
            "info/x",
        }
    export_minari(store, f"back/dict-{fmt}-v0", data_format=fmt)
    back = minari.load_dataset(f"back/dict-{fmt}-v0")
    _assert_equal_datasets(source, back)
    assert back.observation_space == obs_space


def test_data_collector_datasets_import_when_jax_is_installed(tmp_path):
    pytest.importorskip(
        "jax",
        reason="minari's DataCollector needs jax (minari[create]); buffers are tested without it",
    )
    env = minari.DataCollector(gym.make("CartPole-v1"), record_infos=True, data_format="hdf5")
    for ep in range(3):
        env.reset(seed=ep)
        while True:
            *_, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                break
    source = env.create_dataset(dataset_id="probe/collected-v0", algorithm_name="random")
    store = import_minari("probe/collected-v0", tmp_path / "c.h5")
    export_minari(store, "back/collected-v0")
    _assert_equal_datasets(source, minari.load_dataset("back/collected-v0"))


def test_a_recording_exports_to_minari(tmp_path):
    path = record(gym.make("CartPole-v1"), None, 3, tmp_path / "r.h5", seed=5)
    export_minari(path, "rec/cartpole-v0", data_format="arrow")
    back = minari.load_dataset("rec/cartpole-v0")
    with TrajectoryStore(path) as s:
        for i, ep in enumerate(back.iterate_episodes()):
            rows = s.episode(i)
            assert np.array_equal(ep.observations[:-1], rows["obs"].numpy())
            assert np.array_equal(ep.actions, rows["action"].numpy())
            assert np.array_equal(ep.rewards, rows["reward"].numpy())
    assert back.storage.get_episode_metadata([0]).__iter__().__next__()["seed"] == 5
    with pytest.raises(DestinationExistsError, match="already exists"):
        export_minari(path, "rec/cartpole-v0")


def test_export_refuses_a_store_without_next_observations(tmp_path):
    from torchstore.demo import write_demo_store

    path = write_demo_store(tmp_path / "demo.h5", episodes=2, steps=5)
    with TrajectoryStore(path) as s:
        assert "terminated" not in {c.name for c in s.columns}
    with pytest.raises(ColumnError, match=r"lacks the columns \['terminated'\]"):
        export_minari(path, "probe/demo-v0")


def test_hostile_minari_datasets_are_clear_errors(tmp_path, capsys):
    minari.create_dataset_from_buffers(
        "probe/cp-v0", _cartpole_buffers(2), env="CartPole-v1", data_format="hdf5"
    )
    folder = tmp_path / "minari" / "probe" / "cp-v0"
    data = folder / "data" / "main_data.hdf5"
    with pytest.raises(DatasetFormatError, match="not a Minari dataset"):
        import_minari(tmp_path, tmp_path / "x.h5")
    with pytest.raises(DatasetFormatError, match="no-such-v0: not a readable Minari dataset"):
        import_minari("probe/no-such-v0", tmp_path / "x.h5")
    # truncated data file
    good = data.read_bytes()
    data.write_bytes(good[: len(good) // 3])
    with pytest.raises(DatasetFormatError, match="cp-v0"):
        import_minari(folder, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    # observations one row short
    data.write_bytes(good)
    import h5py

    with h5py.File(data, "r+") as f:
        obs = f["episode_1/observations"][:-1]
        del f["episode_1/observations"]
        f["episode_1/observations"] = obs
    with pytest.raises(
        DatasetFormatError, match=r"episode 1: 'observations' has \d+ rows, expected \d+"
    ):
        import_minari(folder, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()  # a failed import leaves no partial store
    # a missing key
    with h5py.File(data, "r+") as f:
        del f["episode_0/rewards"]
    with pytest.raises(DatasetFormatError, match="episode 0"):
        import_minari(folder, tmp_path / "x.h5")
    # metadata that is not JSON
    (folder / "data" / "metadata.json").write_text("{not json")
    assert main(["import-minari", str(folder), str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a readable Minari dataset" in err


def test_cli_import_and_export(tmp_path, capsys):
    minari.create_dataset_from_buffers(
        "probe/cli-v0", _cartpole_buffers(2), env="CartPole-v1", data_format="arrow"
    )
    assert main(["import-minari", "probe/cli-v0", str(tmp_path / "c.h5")]) == 0
    assert (
        main(
            [
                "export-minari",
                str(tmp_path / "c.h5"),
                "back/cli-v0",
                "--root",
                str(tmp_path / "other"),
                "--format",
                "hdf5",
            ]
        )
        == 0
    )
    assert f"wrote {tmp_path / 'other' / 'back' / 'cli-v0'}" in capsys.readouterr().out
    assert main(["import-minari", "probe/cli-v0", str(tmp_path / "c.h5")]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_a_failed_overwrite_keeps_the_old_store(tmp_path):
    minari.create_dataset_from_buffers("probe/ok-v0", _cartpole_buffers(2), env="CartPole-v1")
    minari.create_dataset_from_buffers("probe/bad-v0", _cartpole_buffers(3), env="CartPole-v1")
    import h5py

    with h5py.File(tmp_path / "minari" / "probe" / "bad-v0" / "data" / "main_data.hdf5", "r+") as f:
        del f["episode_2/terminations"]
    store = import_minari("probe/ok-v0", tmp_path / "s.h5")
    with pytest.raises(DatasetFormatError, match="bad-v0 episode 2"):
        import_minari("probe/bad-v0", store, overwrite=True)
    with TrajectoryStore(store) as s:
        assert s.num_episodes == 2


def test_infos_that_change_between_episodes_are_named(tmp_path):
    buffers = _cartpole_buffers(2)
    buffers[1] = EpisodeBuffer(
        **{**buffers[1].__dict__, "infos": {"other": buffers[1].infos["step"]}}
    )
    minari.create_dataset_from_buffers("probe/infos-v0", buffers, env="CartPole-v1")
    with pytest.raises(
        DatasetFormatError, match="episode 1: infos lack 'step', which episode 0 has"
    ):
        import_minari("probe/infos-v0", tmp_path / "x.h5")


def test_image_observations_round_trip(tmp_path):
    image = spaces.Box(0, 255, (32, 32, 3), np.uint8)
    act = spaces.Discrete(4)
    rng = np.random.default_rng(1)
    buffers = [
        EpisodeBuffer(
            id=i,
            seed=i,
            observations=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
            actions=rng.integers(0, 4, 5),
            rewards=[0.0] * 5,
            terminations=[False] * 4 + [True],
            truncations=[False] * 5,
            infos={},
        )
        for i in range(2)
    ]
    # minari JPEG-encodes images by default; what it reads back is what must survive
    source = minari.create_dataset_from_buffers(
        "probe/img-v0", buffers, observation_space=image, action_space=act
    )
    store = import_minari("probe/img-v0", tmp_path / "img.h5")
    with TrajectoryStore(store) as s:
        assert s.column("obs").describe() == "uint8[32, 32, 3]"
    export_minari(store, "back/img-v0")
    _assert_equal_datasets(source, minari.load_dataset("back/img-v0"))


class _NestedEnv(gym.Env):
    """An unregistered env with Dict/Tuple observations and MultiBinary actions."""

    observation_space = spaces.Dict(
        pos=spaces.Box(-1, 1, (2,), np.float32),
        tup=spaces.Tuple((spaces.Discrete(3), spaces.Box(0, np.inf, (1,), np.float64))),
    )
    action_space = spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return (
            self._obs(),
            float(action.sum()),
            self.t >= 4 + int(self.np_random.integers(3)),
            False,
            {},
        )

    def _obs(self):
        return {
            "pos": self.np_random.uniform(-1, 1, 2).astype(np.float32),
            "tup": (int(self.np_random.integers(3)), self.np_random.uniform(0, 5, 1)),
        }


def test_a_vector_recording_with_nested_spaces_exports_exactly(tmp_path):
    venv = gym.vector.SyncVectorEnv([_NestedEnv for _ in range(2)])
    path = record(venv, None, 5, tmp_path / "nested.h5", seed=1)
    export_minari(path, "rec/nested-v0")
    back = minari.load_dataset("rec/nested-v0")
    assert back.observation_space == _NestedEnv.observation_space
    assert back.action_space == _NestedEnv.action_space
    with TrajectoryStore(path) as s:
        assert s.num_episodes == back.total_episodes == 5
        for i, ep in enumerate(back.iterate_episodes()):
            rows = s.episode(i)
            assert np.array_equal(ep.observations["tup"][1][:-1], rows["obs", "tup", "1"].numpy())
            assert np.array_equal(
                ep.observations["pos"][-1], rows["next", "obs", "pos"][-1].numpy()
            )
            assert np.array_equal(ep.actions, rows["action"].numpy())
            assert np.array_equal(ep.rewards, rows["reward"].numpy())
    # and back into a store: the same rows
    again = import_minari("rec/nested-v0", tmp_path / "again.h5")
    with TrajectoryStore(path) as a, TrajectoryStore(again) as b:
        for name in ("obs/pos", "obs/tup/0", "next/obs/tup/1", "action", "reward", "terminated"):
            assert np.array_equal(
                a.read_column(name, 0, a.num_rows), b.read_column(name, 0, b.num_rows)
            ), name


def test_export_in_chunks_and_hostile_ids(tmp_path, monkeypatch):
    import torchstore.minari.exporter as exporter

    path = record(gym.make("CartPole-v1"), None, 6, tmp_path / "r.h5", seed=0)
    monkeypatch.setattr(exporter, "CHUNK_STEPS", 30)  # several create/update rounds
    export_minari(path, "probe/chunks-v0", data_format="arrow")
    back = minari.load_dataset("probe/chunks-v0")
    with TrajectoryStore(path) as s:
        assert back.total_episodes == 6 and back.total_steps == s.num_rows
        for i, ep in enumerate(back.iterate_episodes()):
            assert np.array_equal(ep.observations[1:], s.episode(i)["next", "obs"].numpy())
    from torchstore.errors import UnsafePathError

    for bad, error in (
        ("", ValueError),
        ("no version", ValueError),
        ("../../escape-v0", UnsafePathError),
        ("/abs/x-v0", UnsafePathError),
    ):
        with pytest.raises(error, match="dataset_id"):
            export_minari(path, bad)
    assert sorted(p.name for p in (tmp_path / "minari").iterdir()) == ["probe"]
    assert not (tmp_path / "escape-v0").exists()


def test_a_failed_export_leaves_no_partial_dataset(tmp_path, monkeypatch):
    import torchstore.minari.exporter as exporter

    path = record(gym.make("CartPole-v1"), None, 4, tmp_path / "r.h5", seed=0)
    monkeypatch.setattr(exporter, "CHUNK_STEPS", 10)
    calls = []

    def failing(self, buffer):
        calls.append(len(buffer))
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(minari.MinariDataset, "update_dataset_from_buffer", failing)
    with pytest.raises(OSError, match="simulated"):
        export_minari(path, "probe/partial-v0")
    assert calls and not (tmp_path / "minari" / "probe" / "partial-v0").exists()


def test_a_damaged_arrow_dataset_is_a_clear_error(tmp_path):
    minari.create_dataset_from_buffers(
        "probe/arrow-v0", _cartpole_buffers(3), env="CartPole-v1", data_format="arrow"
    )
    data = tmp_path / "minari" / "probe" / "arrow-v0" / "data"
    part = next((data / "1").glob("*.arrow"))
    raw = part.read_bytes()
    part.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetFormatError, match="episode 1"):
        import_minari("probe/arrow-v0", tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    part.write_bytes(raw)
    (data / "2" / "metadata.json").write_text("[1, 2")
    with pytest.raises(DatasetFormatError, match="arrow-v0"):
        import_minari("probe/arrow-v0", tmp_path / "x.h5")
