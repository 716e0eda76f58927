"""Recording gymnasium envs: columns from spaces, the natural loop, vector envs, make_env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium", reason="recording needs gymnasium (the train extra)")
from gymnasium import spaces  # noqa: E402

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.errors import ColumnError, EpisodeError  # noqa: E402
from torchstore.gym import EpisodeRecorder, RecordEpisodes, record, space_columns  # noqa: E402


def test_the_natural_loop_writes_float64_and_python_floats_losslessly(tmp_path):
    env = gym.make("CartPole-v1")
    columns = [
        ColumnSpec("obs", "float32", (4,)),
        ColumnSpec("reward", "float32"),
        ColumnSpec("done", "bool"),
    ]
    with TrajectoryStoreWriter(tmp_path / "s.h5", columns) as w:
        obs, _ = env.reset(seed=0)
        obs, r, term, trunc, _ = env.step(0)
        assert isinstance(r, float)
        w.append({"obs": obs[None], "reward": np.array([r]), "done": np.array([term])})
        w.append({"obs": obs[None], "reward": [r], "done": [trunc]})
        w.end_episode()
        with pytest.raises(
            ColumnError, match=r"'reward' expects float32, got float64\[\]; casting would lose"
        ):
            w.append({"obs": obs[None], "reward": np.array([0.1]), "done": np.array([False])})
    with TrajectoryStore(tmp_path / "s.h5") as s:
        assert s[:]["reward"].tolist() == [1.0, 1.0]


def test_columns_come_from_every_space_kind():
    space = spaces.Dict(
        box=spaces.Box(-1, 1, (2, 3), np.float32),
        disc=spaces.Discrete(5),
        md=spaces.MultiDiscrete([2, 3, 4]),
        mb=spaces.MultiBinary(6),
        img=spaces.Box(0, 255, (32, 32, 3), np.uint8),
        tup=spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,), np.float64))),
    )
    got = {c.name: (c.dtype, c.shape) for c in space_columns("obs", space)}
    assert got == {
        "obs/box": (torch.float32, (2, 3)),
        "obs/disc": (torch.int64, ()),
        "obs/md": (torch.int64, (3,)),
        "obs/mb": (torch.int8, (6,)),
        "obs/img": (torch.uint8, (32, 32, 3)),
        "obs/tup/0": (torch.int64, ()),
        "obs/tup/1": (torch.float64, (1,)),
    }
    with pytest.raises(ColumnError, match="'obs' has a Text space"):
        space_columns("obs", spaces.Text(5))
    with pytest.raises(ColumnError, match="cannot be a column"):
        space_columns("obs", spaces.Dict({"bad key": spaces.Discrete(2)}))


def test_nested_spaces_record_and_read_back_exactly(tmp_path):
    obs_space = spaces.Dict(
        pos=spaces.Box(-1, 1, (2,), np.float32),
        tup=spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
    )
    act_space = spaces.MultiDiscrete([3, 2])
    rec = EpisodeRecorder(tmp_path / "n.h5", obs_space, act_space)
    obs_space.seed(0)
    act_space.seed(0)
    steps = [obs_space.sample() for _ in range(6)]
    actions = [act_space.sample() for _ in range(5)]
    rec.reset(0, steps[0], seed=7)
    for t in range(5):
        rec.step(0, actions[t], steps[t + 1], 0.5, t == 4, False)
    rec.close()
    with TrajectoryStore(tmp_path / "n.h5") as s:
        ep = s.episode(0)
        assert ep["obs", "pos"].numpy().tolist() == [o["pos"].tolist() for o in steps[:5]]
        assert ep["next", "obs", "tup", "1"].numpy().tolist() == [
            o["tup"][1].tolist() for o in steps[1:]
        ]
        assert ep["action"].numpy().tolist() == [a.tolist() for a in actions]
        assert ep["terminated"].tolist() == [False] * 4 + [True]
        assert s.episode_metadata(0) == {"seed": 7}
        assert s.manifest.seed == 7


def test_a_wrong_shape_is_an_error_naming_the_column(tmp_path):
    rec = EpisodeRecorder(tmp_path / "w.h5", spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    rec.reset(0, np.zeros(3, np.float32))
    with pytest.raises(
        ColumnError, match=r"column 'obs' expects one step of shape \[3\], got \[4\]"
    ):
        rec.step(0, 1, np.zeros(4, np.float32), 1.0, False, False)
    with pytest.raises(EpisodeError, match="before reset"):
        EpisodeRecorder(tmp_path / "x.h5", spaces.Box(-1, 1, (3,)), spaces.Discrete(2)).step(
            0, 1, np.zeros(3), 1.0, False, False
        )
    rec.close()


def test_wrapper_records_one_episode_per_end_keeping_both_flags(tmp_path):
    env = RecordEpisodes(gym.make("CartPole-v1", max_episode_steps=20), tmp_path / "c.h5")
    env.action_space.seed(0)
    ends = []
    for ep in range(4):
        env.reset(seed=100 + ep)
        while True:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                ends.append((term, trunc))
                break
    env.reset()
    env.step(0)  # an unfinished episode is dropped at close
    env.close()
    with TrajectoryStore(tmp_path / "c.h5") as s:
        assert s.num_episodes == 4
        for i, (term, trunc) in enumerate(ends):
            ep = s.episode(i)
            assert (bool(ep["terminated"][-1]), bool(ep["truncated"][-1])) == (term, trunc)
            assert not ep["done"][:-1].any() and ep["done"][-1]
            assert torch.equal(ep["obs"][1:], ep["next", "obs"][:-1])
            assert s.episode_metadata(i) == {"seed": 100 + i}
        assert s.episodes.lengths.max() <= 20
        assert any(trunc for _, trunc in ends)


def test_make_env_rebuilds_the_env_with_its_kwargs(tmp_path):
    path = record(gym.make("Pendulum-v1", g=9.5), None, 2, tmp_path / "p.h5", seed=3)
    with TrajectoryStore(path) as s:
        assert s.manifest.env_id == "Pendulum-v1" and s.manifest.seed == 3
        assert s.manifest.metadata["gymnasium"]["kwargs"] == {"g": 9.5}
        env = s.make_env()
        assert env.unwrapped.g == 9.5
        assert s.make_env(g=4.0).unwrapped.g == 4.0
        # replaying the first episode's seed and actions reproduces its observations
        ep = s.episode(0)
        obs, _ = env.reset(seed=s.episode_metadata(0)["seed"])
        assert np.array_equal(obs, ep["obs"][0].numpy())
        for t in range(5):
            obs, r, *_ = env.step(ep["action"][t].numpy())
            assert np.array_equal(obs, ep["next", "obs"][t].numpy()) and r == float(ep["reward"][t])
        assert s.columns[[c.name for c in s.columns].index("reward")].dtype == torch.float64


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_vector_envs_write_one_stream_per_sub_env(tmp_path, mode):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    venv = SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=30) for _ in range(3)],
        autoreset_mode=AutoresetMode(mode),
    )
    path = record(venv, None, 7, tmp_path / "v.h5", seed=10)
    with TrajectoryStore(path) as s:
        assert s.num_episodes == 7
        streams = [s.episode_metadata(i)["stream"] for i in range(7)]
        assert set(streams) == {0, 1, 2}
        first_seeds = {
            m["stream"]: m["seed"]
            for m in map(s.episode_metadata, range(7))
            if m["seed"] is not None
        }
        assert first_seeds == {0: 10, 1: 11, 2: 12}
        for i in range(7):
            ep = s.episode(i)
            assert torch.equal(ep["obs"][1:], ep["next", "obs"][:-1])  # no reset step inside
            assert ep["done"][-1] and not ep["done"][:-1].any()
            assert len(ep["reward"]) <= 30
        # each sub-env's first episode starts at its seeded reset observation
        for stream, seed in first_seeds.items():
            first = next(
                i for i in range(7) if s.episode_metadata(i) == {"seed": seed, "stream": stream}
            )
            obs, _ = gym.make("CartPole-v1").reset(seed=seed)
            assert np.array_equal(s.episode(first)["obs"][0].numpy(), obs)


def test_record_refuses_a_bad_episode_count(tmp_path):
    with pytest.raises(EpisodeError, match="episodes"):
        record(gym.make("CartPole-v1"), None, 0, tmp_path / "z.h5")


def test_a_killed_recording_keeps_every_finished_episode(tmp_path):
    import signal
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "rec.py"
    script.write_text(
        textwrap.dedent(f"""
        import gymnasium as gym
        from torchstore.gym import RecordEpisodes
        env = RecordEpisodes(gym.make("CartPole-v1"), {str(tmp_path / "k.h5")!r})
        env.action_space.seed(0)
        episode = 0
        while True:
            env.reset(seed=episode)
            while True:
                *_, term, trunc, _ = env.step(env.action_space.sample())
                if term or trunc:
                    break
            episode += 1
            print(episode, flush=True)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if int(line) >= 5:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=120)
    with TrajectoryStore(tmp_path / "k.h5") as s:
        assert s.num_episodes >= 5
        for i in range(s.num_episodes):
            ep = s.episode(i)
            assert ep["done"][-1] and not ep["done"][:-1].any()
            assert s.episode_metadata(i) == {"seed": i}


def test_the_vector_wrapper_records_each_sub_env(tmp_path):
    from torchstore.gym import RecordVectorEpisodes

    venv = RecordVectorEpisodes(
        gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", max_episode_steps=15),
        tmp_path / "w.h5",
    )
    obs, _ = venv.reset(seed=4)
    finished = 0
    while finished < 5:
        obs, _, terms, truncs, _ = venv.step(venv.action_space.sample())
        finished += int((terms | truncs).sum())
    venv.close()
    with TrajectoryStore(tmp_path / "w.h5") as s:
        assert s.num_episodes == finished
        assert {s.episode_metadata(i)["stream"] for i in range(finished)} == {0, 1}
        for i in range(finished):
            ep = s.episode(i)
            assert torch.equal(ep["obs"][1:], ep["next", "obs"][:-1]) and len(ep["reward"]) <= 15


def test_image_observations_stay_uint8_or_are_quantised(tmp_path):
    from torchstore.data import Quantize

    obs_space = spaces.Dict(
        pixels=spaces.Box(0, 255, (32, 32, 3), np.uint8),
        depth=spaces.Box(0.0, 2.0, (8, 8), np.float32),
    )
    rec = EpisodeRecorder(
        tmp_path / "i.h5", obs_space, spaces.Discrete(2), quantize={"obs/depth": "bounds"}
    )
    obs_space.seed(0)
    frames = [obs_space.sample() for _ in range(4)]
    rec.reset(0, frames[0])
    for t in range(3):
        rec.step(0, 1, frames[t + 1], 0.0, False, t == 2)
    rec.close()
    with TrajectoryStore(tmp_path / "i.h5") as s:
        assert s.column("obs/pixels").describe() == "uint8[32, 32, 3]"
        assert s.column("next/obs/depth").quantize == Quantize(0.0, 2.0)
        ep = s.episode(0)
        assert np.array_equal(
            ep["obs", "pixels"].numpy(), np.stack([f["pixels"] for f in frames[:3]])
        )
        depth = np.stack([f["depth"] for f in frames[1:]])
        assert np.abs(ep["next", "obs", "depth"].numpy() - depth).max() <= 2.0 / 510 + 1e-6
    with pytest.raises(ColumnError, match=r"quantize names \['obs/nope'\]"):
        EpisodeRecorder(
            tmp_path / "j.h5", obs_space, spaces.Discrete(2), quantize={"obs/nope": "bounds"}
        )
    with pytest.raises(ColumnError, match="no finite bounds"):
        EpisodeRecorder(
            tmp_path / "j.h5",
            spaces.Box(-np.inf, np.inf, (2,)),
            spaces.Discrete(2),
            quantize={"obs": "bounds"},
        )


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchstore.data.file.writer import lossless_cast  # noqa: E402


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20))
def test_a_float64_cast_to_float32_happens_only_when_every_value_survives(values):
    source = np.array(values, dtype=np.float64)
    out = lossless_cast(source, torch.float32)
    with np.errstate(over="ignore"):
        exact = np.array_equal(source.astype(np.float32).astype(np.float64), source, equal_nan=True)
    assert (out.dtype == np.float32) == exact
    if exact:
        assert np.array_equal(out.astype(np.float64), source, equal_nan=True)
        as_tensor = lossless_cast(torch.from_numpy(source), torch.float32)
        assert as_tensor.dtype == torch.float32


def test_spaces_round_trip_through_the_manifest_json():
    import json

    from torchstore.gym.spaces import space_from_json, space_to_json

    for space in (
        spaces.Box(-np.inf, np.inf, (3,)),
        spaces.Box(np.array([0.0, -1.5]), np.array([1.0, np.inf]), dtype=np.float64),
        spaces.Box(0, 255, (8, 8, 3), np.uint8),
        spaces.Discrete(5, start=2),
        spaces.MultiDiscrete([2, 3]),
        spaces.MultiBinary([2, 2]),
        spaces.Dict(a=spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,))))),
    ):
        text = json.dumps(space_to_json(space), allow_nan=False)
        assert space_from_json(json.loads(text)) == space
    assert (
        space_to_json(spaces.Box(0, 255, (84, 84, 3), np.uint8))["low"] == 0
    )  # uniform bounds stay small
    with pytest.raises(ColumnError, match="malformed"):
        space_from_json({"type": "Box", "shape": [2]})
    with pytest.raises(ColumnError, match="unknown type 'Graph'"):
        space_from_json({"type": "Graph"})


class _CameraEnv(gym.Env):
    """Pixels of a moving gradient and the step count: a camera env in miniature."""

    observation_space = spaces.Dict(
        {
            "pixels": spaces.Box(0, 255, (24, 32, 3), np.uint8),
            "t": spaces.Box(0, 100, (1,), np.float32),
        }
    )
    action_space = spaces.Discrete(2)

    def _obs(self):
        y, x = np.mgrid[0:24, 0:32]
        frame = (x * 5 + y * 2 + 7 * self.t) % 256
        return {
            "pixels": np.stack([frame, frame, 255 - frame], -1).astype(np.uint8),
            "t": np.array([self.t], np.float32),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 12, False, {}


def test_camera_observations_are_recorded_encoded(tmp_path):
    path = record(_CameraEnv(), None, 3, tmp_path / "cam.h5", seed=0, codecs={"obs/pixels": "png"})
    with TrajectoryStore(path) as store:
        assert store.column("obs/pixels").codec.kind == "png"
        assert store.column("next/obs/pixels").codec.kind == "png"
        assert store.num_episodes == 3 and store.num_rows == 36
        rows = store.read_slab(0, store.num_rows)
        env = _CameraEnv()
        for i, t in enumerate(rows["obs", "t"][:, 0].int().tolist()):
            env.t = t
            assert np.array_equal(rows["obs", "pixels"][i].numpy(), env._obs()["pixels"])
    with pytest.raises(ColumnError, match="codecs names \\['obs/nope'\\]"):
        EpisodeRecorder(
            tmp_path / "x.h5", _CameraEnv.observation_space, _CameraEnv.action_space,
            codecs={"obs/nope": "av1"},
        )  # fmt: skip
