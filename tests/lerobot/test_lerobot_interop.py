"""Interop with the real ``lerobot`` package (0.6.x and 0.4.4, format v3.0), both ways.

Skipped unless ``lerobot`` imports (CI does not install it; the skip reason says how to run
it). Everything stays in tmp_path and offline: lerobot reads local folders only (``root=``),
the Hub is switched off.

* torchstore writes (LeRobotWriter, export_lerobot) -> ``lerobot.LeRobotDataset`` reads;
* ``LeRobotDataset.create / add_frame / save_episode / finalize`` writes -> import_lerobot;
* 2-D and bool features, both ways.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import version as _dist_version
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    lerobot = importlib.import_module("lerobot.datasets.lerobot_dataset")
except ImportError:
    pytest.skip(
        "needs the real lerobot, which is not a dependency: `bash tests/lerobot/lerobot_venv.sh "
        "[0.6.1|0.4.4] [VENV]` builds a venv with it (default 0.6.1 in /tmp/lr06), then run "
        "VENV/bin/python -m pytest tests/lerobot/test_lerobot_interop.py",
        allow_module_level=True,
    )

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.lerobot import (  # noqa: E402
    LeRobotSource,
    LeRobotWriter,
    export_lerobot,
    import_lerobot,
)

FPS = 10
VIDEO = "observation.images.front"  # 64x48 video camera
IMAGE = "observation.images.wrist"  # 32x24 PNG camera
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [6], "names": None},
    "action": {"dtype": "float32", "shape": [6], "names": None},
    "reward": {"dtype": "float32", "shape": [1], "names": None},
    VIDEO: {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"]},
    IMAGE: {"dtype": "image", "shape": [24, 32, 3], "names": ["height", "width", "channels"]},
}
DEFAULTS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
STATS = ("min", "max", "mean", "std", "count")
# Mean abs error over an episode, in 1/255 steps, of the lossy (AV1 / H.264, crf 30) video
# against the frames that were encoded (about 2 for scene() below; single frames up to 2.5).
VIDEO_MAE = 3.0


# ------------------------------------------------------------------------- environment
@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """No network, and no writes outside tmp_path (the datasets Arrow cache included)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    # lerobot 0.4.x binds HF_LEROBOT_HOME in lerobot_dataset; 0.6.x in lerobot.utils.constants and
    # every module that imported it from there: patch each loaded binding
    home = tmp_path / "lerobot-home"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    for name, module in list(sys.modules.items()):
        if name.startswith("lerobot") and hasattr(module, "HF_LEROBOT_HOME"):
            monkeypatch.setattr(module, "HF_LEROBOT_HOME", home)


def lerobot_version() -> tuple[int, int]:
    major, minor = _dist_version("lerobot").split(".")[:2]
    return int(major), int(minor)


def _pyav_backend_problem() -> str | None:
    """Why lerobot's "pyav" backend cannot run here (with how to get it), or None."""
    if lerobot_version() >= (0, 6):
        # lerobot 0.6.x decodes "pyav" with PyAV itself
        if importlib.util.find_spec("av") is None:
            return "PyAV is not installed: pip install av"
        return None
    # lerobot 0.4.x decodes "pyav" through torchvision.io.VideoReader, gone in torchvision 0.26
    try:
        import torchvision.io
    except Exception as exc:
        return f"torchvision does not import ({exc})"
    if not hasattr(torchvision.io, "VideoReader"):
        return (
            f"lerobot {_dist_version('lerobot')} decodes 'pyav' with torchvision.io.VideoReader, "
            f"which torchvision {_dist_version('torchvision')} no longer has (gone in 0.26); "
            "a venv with torchvision<0.26 runs it"
        )
    return None


def _torchcodec_problem() -> str | None:
    """Why lerobot's "torchcodec" backend cannot run here (with how to get it), or None."""
    if importlib.util.find_spec("torchcodec") is None:
        return "torchcodec is not installed: pip install torchcodec (the one lerobot pins)"
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except Exception as exc:  # no FFmpeg shared libraries, or built for another torch
        reason = str(exc).strip().splitlines()[0][:160]
        return (
            f"torchcodec does not load ({reason}): it needs FFmpeg's shared libraries "
            "(libavutil, libavcodec, libavformat, libavfilter, libavdevice, libswscale, "
            "libswresample) of a major version its build supports, e.g. Debian's "
            "`apt-get install ffmpeg`; install them and rerun"
        )
    return None


@pytest.fixture(params=["pyav", "torchcodec"])
def backend(request) -> str:
    """lerobot's two video decoders; each is skipped when this environment cannot run it."""
    problem = {"pyav": _pyav_backend_problem, "torchcodec": _torchcodec_problem}[request.param]()
    if problem is not None:
        pytest.skip(f"lerobot's {request.param!r} video backend cannot run here: {problem}")
    return request.param


# ------------------------------------------------------------------------- data
def scene(episode: int, n: int, height: int = 48, width: int = 64) -> np.ndarray:
    """Smooth camera-like frames (a gradient and a moving square), fair to a lossy codec."""
    frames = np.zeros((n, height, width, 3), np.uint8)
    frames[..., 0] = np.linspace(40, 200, width, dtype=np.uint8)[None, None]
    frames[..., 1] = np.linspace(40, 200, height, dtype=np.uint8)[None, :, None]
    frames[..., 2] = (40 * episode + 20) % 256
    for k in range(n):
        x = (3 * k + 7 * episode) % (width - 14)
        frames[k, height // 3 : height // 3 + 12, x : x + 12] = 160
    return frames


def episode_rows(episode: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + episode)
    return {
        "observation.state": rng.standard_normal((n, 6)).astype(np.float32),
        "action": rng.standard_normal((n, 6)).astype(np.float32),
        "reward": rng.standard_normal((n, 1)).astype(np.float32),
        VIDEO: scene(episode, n),
        IMAGE: rng.integers(0, 256, (n, 24, 32, 3), dtype=np.uint8),  # PNG: exact
    }


def frame_tasks(episode: int, n: int) -> list[str]:
    """Two tasks; episode 0 switches task half-way (lerobot keeps a task per frame)."""
    if episode == 0:
        return ["pick the cube" if k < n // 2 else "place the cube" for k in range(n)]
    return ["place the cube"] * n


def video_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).mean())


# ------------------------------------------------------------------------- lerobot side
def check_in_lerobot(ds, episodes, tasks, *, videos=(), images=(), decoded=None) -> None:
    """Every frame of ``ds`` (a LeRobotDataset) against what was written.

    ``decoded[key][e]``: the same video frames as torchstore decodes them (uint8 HWC); lerobot's
    decode must match them exactly (same file, same timestamps -> same frames).
    """
    lengths = [len(t) for t in tasks]
    assert len(ds) == ds.num_frames == sum(lengths)
    assert ds.num_episodes == ds.meta.total_episodes == len(episodes)
    # lerobot numbers the tasks an episode introduces in set order: compare as sets
    assert sorted(ds.meta.tasks.index) == sorted({t for ts in tasks for t in ts})
    g = 0
    for e, rows in enumerate(episodes):
        errors = {name: [] for name in videos}
        for k in range(lengths[e]):
            item = ds[g]
            for name, value in rows.items():
                got = item[name]
                if name in videos or name in images:
                    assert got.dtype == torch.float32 and tuple(got.shape) == (3, *value.shape[1:3])
                    assert 0.0 <= got.min() and got.max() <= 1.0
                    hwc = got.permute(1, 2, 0).numpy() * 255
                    if name in videos:
                        errors[name].append(video_error(hwc, value[k]))
                        if decoded is not None:
                            ours = decoded[name][e][k]
                            np.testing.assert_array_equal(np.round(hwc).astype(np.uint8), ours)
                    else:
                        np.testing.assert_array_equal(np.round(hwc).astype(np.uint8), value[k])
                else:
                    want = np.asarray(value[k])
                    if want.dtype == np.float64:
                        # lerobot 0.4's hf_transform_to_torch does torch.tensor(python floats):
                        # float64 features come back as float32, whoever wrote them
                        want = want.astype(np.float32)
                    assert got.dtype == torch.from_numpy(want).dtype, name
                    np.testing.assert_array_equal(got.numpy(), want.reshape(got.shape))
            assert item["task"] == tasks[e][k]
            assert int(item["task_index"]) == list(ds.meta.tasks.index).index(tasks[e][k])
            assert (int(item["episode_index"]), int(item["frame_index"])) == (e, k)
            assert int(item["index"]) == g
            assert item["timestamp"].item() == np.float32(k / FPS)
            g += 1
        for name, errs in errors.items():
            assert np.mean(errs) <= VIDEO_MAE and max(errs) <= 2 * VIDEO_MAE, (name, e, errs)
    stats = ds.meta.stats
    for name in [*episodes[0], *DEFAULTS]:
        assert name in stats, name
        assert set(STATS) <= set(stats[name]), name
        assert int(np.asarray(stats[name]["count"]).ravel()[0]) > 0
    for name in (*videos, *images):
        assert np.asarray(stats[name]["mean"]).shape == (3, 1, 1)


def load(root, backend=None):
    """A new LeRobotDataset of ``root``, as a new reader process would open it.

    lerobot keeps one process-wide cache of torchcodec decoders keyed by file path, so in
    this process a file read before a merge replaced it would decode through its old
    decoder (its old frame count); it is cleared first.
    """
    from lerobot.datasets import video_utils

    cache = getattr(video_utils, "_default_decoder_cache", None)
    if cache is not None:
        cache.clear()
    return lerobot.LeRobotDataset(repo_id="local/test", root=root, video_backend=backend)


def torchstore_decode(root, key) -> list[np.ndarray]:
    with LeRobotSource(root) as src:
        return [src.read_episode(entry, [key])[key] for entry in src.episodes]


# ------------------------------------------------------------------------- 1. torchstore -> lerobot
def test_writer_dataset_loads_in_lerobot(tmp_path, backend):
    root = tmp_path / "ds"
    lengths = (12, 17)
    episodes = [episode_rows(e, n) for e, n in enumerate(lengths)]
    tasks = [frame_tasks(e, n) for e, n in enumerate(lengths)]
    with LeRobotWriter(root, fps=FPS, features=FEATURES, robot_type="so101_follower") as w:
        rows = episodes[0]  # frame by frame, like a recorder
        for k in range(lengths[0]):
            w.add_frame({name: value[k] for name, value in rows.items()}, task=tasks[0][k])
        assert w.save_episode() == 0
        assert w.add_episode(episodes[1], task=tasks[1]) == 1
    ds = load(root, backend)
    assert ds.meta.robot_type == "so101_follower" and ds.fps == FPS
    assert ds.meta.video_keys == [VIDEO] and set(ds.meta.camera_keys) == {VIDEO, IMAGE}
    decoded = {VIDEO: torchstore_decode(root, VIDEO)}
    check_in_lerobot(ds, episodes, tasks, videos={VIDEO}, images={IMAGE}, decoded=decoded)
    state = np.concatenate([rows["observation.state"] for rows in episodes])
    np.testing.assert_allclose(ds.meta.stats["observation.state"]["mean"], state.mean(0), rtol=1e-5)
    np.testing.assert_allclose(ds.meta.stats["observation.state"]["max"], state.max(0), rtol=1e-6)


def test_merged_sessions_load_in_lerobot_after_every_save(tmp_path, backend):
    """One-episode files while recording, merged at close and at the next resume after a
    kill: lerobot loads the folder at each of those points."""
    root = tmp_path / "ds"
    lengths = (5, 7, 4, 6, 5)
    episodes = [episode_rows(e, n) for e, n in enumerate(lengths)]
    tasks = [frame_tasks(e, n) for e, n in enumerate(lengths)]
    w = LeRobotWriter(root, fps=FPS, features=FEATURES)
    for e in range(3):
        w.add_episode(episodes[e], task=tasks[e])
        check_in_lerobot(
            load(root, backend), episodes[: e + 1], tasks[: e + 1], videos={VIDEO}, images={IMAGE}
        )
    os.close(w._session_fd)  # as a kill: no close(), no merge, and the kernel drops the lock
    w._closed = True
    with LeRobotWriter.resume(root) as again:  # merges the killed session's files
        for e in range(3, 5):
            again.add_episode(episodes[e], task=tasks[e])
    assert len(list((root / "data").rglob("*.parquet"))) == 2  # one per session
    check_in_lerobot(load(root, backend), episodes, tasks, videos={VIDEO}, images={IMAGE})


@pytest.mark.parametrize("cameras", ["video", "image"])
def test_export_of_a_plain_store_loads_in_lerobot(tmp_path, backend, cameras):
    columns = [
        ColumnSpec("obs", torch.float32, (6,)),
        ColumnSpec("action", torch.float32, (6,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("next/obs", torch.float32, (6,)),  # exported as "next.obs"
        ColumnSpec("pixels", torch.uint8, (48, 64, 3)),
    ]
    rng = np.random.default_rng(7)
    stored = []
    with TrajectoryStoreWriter(tmp_path / "s.h5", columns, env_id="Reach-v0") as w:
        for e, n in enumerate((11, 14)):
            rows = {
                "obs": rng.standard_normal((n, 6)).astype(np.float32),
                "action": rng.standard_normal((n, 6)).astype(np.float32),
                "reward": rng.standard_normal(n).astype(np.float32),
                "next/obs": rng.standard_normal((n, 6)).astype(np.float32),
                "pixels": scene(e, n),
            }
            w.add_episode(rows)
            stored.append(rows)
    root = tmp_path / "ds"
    export_lerobot(tmp_path / "s.h5", root, fps=FPS, cameras=cameras, progress=False)
    ds = load(root, backend)
    assert ds.meta.video_keys == (["pixels"] if cameras == "video" else [])
    episodes = [{k.replace("/", "."): v for k, v in rows.items()} for rows in stored]
    tasks = [["Reach-v0"] * len(rows["reward"]) for rows in stored]
    if cameras == "video":
        kind = {"videos": {"pixels"}, "decoded": {"pixels": torchstore_decode(root, "pixels")}}
    else:
        kind = {"images": {"pixels"}}
    check_in_lerobot(ds, episodes, tasks, **kind)


# ------------------------------------------------------------------------- 2. lerobot -> torchstore
LEROBOT_LENGTHS = (10, 14, 8)


def record_with_lerobot(root: Path, features: dict, rows_of, tasks_of, lengths, **kwargs):
    """LeRobotDataset.create -> add_frame -> save_episode -> finalize; returns what was added."""
    create_features = {k: {**v, "shape": tuple(v["shape"])} for k, v in features.items()}
    ds = lerobot.LeRobotDataset.create(
        repo_id="local/rec", fps=FPS, root=root, features=create_features, **kwargs
    )
    episodes, tasks = [], []
    try:
        for e, n in enumerate(lengths):
            rows, ts = rows_of(e, n), tasks_of(e, n)
            for k in range(n):
                ds.add_frame({**{name: value[k] for name, value in rows.items()}, "task": ts[k]})
            try:
                ds.save_episode()
            except TypeError as exc:
                if "0-dimensional" not in str(exc):
                    raise
                # lerobot 0.4.x keeps shape-[1] features as 1-element arrays and datasets
                # int()/float()s them: an error from numpy 2.4 on (lerobot's era had < 2.4)
                why = f"lerobot {_dist_version('lerobot')} cannot save shape-[1] features"
                pytest.skip(f"{why} with numpy {np.__version__}: {exc}")
            episodes.append(rows)
            tasks.append(ts)
    finally:
        ds.finalize()
    return episodes, tasks


def _can_encode(codec: str) -> bool:
    import av

    try:
        av.codec.Codec(codec, "w")
    except Exception:
        return False
    return True


@pytest.fixture(scope="module", params=["libsvtav1", "h264"])
def lerobot_recorded(request, tmp_path_factory):
    """lerobot's default encoder (AV1 through PyAV's libsvtav1) and its h264 option."""
    if not _can_encode(request.param):
        pytest.skip(f"this PyAV build has no {request.param} encoder")
    root = tmp_path_factory.mktemp(f"lerobot-{request.param}") / "rec"
    with pytest.MonkeyPatch.context() as mp:
        import datasets
        import huggingface_hub.constants

        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        mp.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", root.parent / "hf-datasets-cache")
        if lerobot_version() >= (0, 6):
            # lerobot 0.6.x takes an encoder config instead of create(vcodec=)
            from lerobot.configs import RGBEncoderConfig

            codec = {"rgb_encoder": RGBEncoderConfig(vcodec=request.param)}
        else:  # lerobot 0.4.x
            codec = {"vcodec": request.param}
        episodes, tasks = record_with_lerobot(
            root, FEATURES, episode_rows, frame_tasks, LEROBOT_LENGTHS, use_videos=True, **codec
        )
    return root, episodes, tasks, request.param


def check_store(path, episodes, tasks, *, videos=(), video_mae=VIDEO_MAE) -> dict:
    with TrajectoryStore(path) as store:
        meta = store.manifest.metadata["lerobot"]
        assert store.num_episodes == len(episodes)
        table = meta["tasks"]  # the dataset's task_index order (set order in lerobot 0.4)
        assert sorted(table) == sorted({t for ts in tasks for t in ts})
        for e, rows in enumerate(episodes):
            got = store.episode(e)
            n = len(tasks[e])
            for name, value in rows.items():
                have = got[name].numpy()
                if name in videos:
                    assert have.dtype == np.uint8 and have.shape == value.shape
                    errs = [video_error(have[k], value[k]) for k in range(n)]
                    assert np.mean(errs) <= video_mae and max(errs) <= 2 * video_mae, (e, errs)
                else:
                    assert have.dtype == value.dtype, name
                    np.testing.assert_array_equal(have, value.reshape(have.shape), err_msg=name)
            assert [table[i] for i in got["task_index"].numpy()] == tasks[e]
            np.testing.assert_array_equal(got["frame_index"].numpy(), np.arange(n))
            np.testing.assert_array_equal(got["episode_index"].numpy(), np.full(n, e))
            np.testing.assert_array_equal(
                got["timestamp"].numpy(), (np.arange(n) / FPS).astype(np.float32)
            )
            assert store.episode_metadata(e)["lerobot_episode_index"] == e
        assert set(meta["stats"]) >= {*episodes[0], *DEFAULTS}
        return meta


def test_unchanged_lerobot_dataset_imports(lerobot_recorded, tmp_path):
    root, episodes, tasks, _ = lerobot_recorded
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    check_store(tmp_path / "out.h5", episodes, tasks, videos={VIDEO})


def test_lerobot_dataset_imports_into_torchstore(lerobot_recorded, tmp_path):
    root, episodes, tasks, vcodec = lerobot_recorded
    assert (root / "meta/tasks.parquet").exists() and (root / "meta/episodes").is_dir()
    fixed = root
    summary = import_lerobot(fixed, tmp_path / "out.h5", progress=False)
    assert (summary.episodes, summary.frames) == (3, sum(LEROBOT_LENGTHS))
    meta = check_store(tmp_path / "out.h5", episodes, tasks, videos={VIDEO})
    assert meta["fps"] == FPS and meta["codebase_version"] == "v3.0"
    codec = {"libsvtav1": "av1", "h264": "h264"}[vcodec]
    assert meta["features"][VIDEO]["info"]["video.codec"] == codec


def test_lerobot_and_torchstore_decode_the_recording_alike(lerobot_recorded, backend, tmp_path):
    """The same recording through lerobot's own reader: equal to what we imported, frame by
    frame."""
    root, episodes, tasks, _ = lerobot_recorded
    fixed = root
    import_lerobot(fixed, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        ours = [store.episode(e, [VIDEO])[VIDEO].numpy() for e in range(store.num_episodes)]
    ds = load(root, backend)
    check_in_lerobot(ds, episodes, tasks, videos={VIDEO}, images={IMAGE}, decoded={VIDEO: ours})


# ------------------------------------------------------------------------- 3. 2-D and bool
ND_FEATURES = {
    "action": {"dtype": "float32", "shape": [2, 3], "names": None},
    "grid": {"dtype": "float64", "shape": [3, 2], "names": ["rows", "cols"]},
    "gripper_closed": {"dtype": "bool", "shape": [1], "names": None},
    "contacts": {"dtype": "bool", "shape": [4], "names": None},
    "count": {"dtype": "int64", "shape": [1], "names": None},
}


def nd_rows(episode: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(200 + episode)
    return {
        "action": rng.standard_normal((n, 2, 3)).astype(np.float32),
        "grid": rng.standard_normal((n, 3, 2)),
        "gripper_closed": rng.random((n, 1)) < 0.5,
        "contacts": rng.random((n, 4)) < 0.5,
        "count": np.arange(n, dtype=np.int64)[:, None] * (episode + 1),
    }


def nd_tasks(episode: int, n: int) -> list[str]:
    return ["push" if episode % 2 == 0 else "pull"] * n


def test_2d_and_bool_features_torchstore_to_lerobot(tmp_path):
    root = tmp_path / "ds"
    episodes = [nd_rows(e, n) for e, n in enumerate((9, 6))]
    tasks = [nd_tasks(e, len(rows["count"])) for e, rows in enumerate(episodes)]
    with LeRobotWriter(root, fps=FPS, features=ND_FEATURES) as w:
        for rows, ts in zip(episodes, tasks):
            w.add_episode(rows, task=ts)
    ds = load(root)
    hf = ds.hf_dataset.features
    assert type(hf["action"]).__name__ == "Array2D" and tuple(hf["action"].shape) == (2, 3)
    assert hf["gripper_closed"].dtype == "bool"
    item = ds[0]
    assert item["action"].shape == (2, 3) and item["grid"].shape == (3, 2)
    assert item["gripper_closed"].dtype == torch.bool and item["contacts"].shape == (4,)
    check_in_lerobot(ds, episodes, tasks)


def test_2d_and_bool_features_lerobot_to_torchstore(tmp_path):
    root = tmp_path / "rec"
    episodes, tasks = record_with_lerobot(root, ND_FEATURES, nd_rows, nd_tasks, (7, 5, 6))
    fixed = root
    import_lerobot(fixed, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        specs = {c.name: c for c in store.columns}
    assert specs["action"].shape == (2, 3) and specs["action"].dtype == torch.float32
    assert specs["grid"].shape == (3, 2) and specs["grid"].dtype == torch.float64
    assert specs["gripper_closed"].dtype == torch.bool and specs["contacts"].shape == (4,)
    check_store(tmp_path / "out.h5", episodes, tasks)


# ------------------------------------------------------------------------- stats
STATS_CASES = {
    "state": ("float32", (6,)),
    "grid": ("float64", (3, 2)),
    "grip": ("bool", (1,)),
    "contacts": ("bool", (4,)),
    "count": ("int64", (1,)),
}


def stats_rows(episode: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(300 + episode)
    return {
        "state": (rng.standard_normal((n, 6)) * 3 + 1).astype(np.float32),
        "grid": rng.standard_normal((n, 3, 2)),
        "grip": rng.random((n, 1)) < 0.3,
        "contacts": rng.random((n, 4)) < 0.5,
        "count": rng.integers(0, 20, (n, 1)),
    }


@pytest.mark.parametrize("n", [2, 7, 40, 333])
def test_episode_stats_are_lerobots(n):
    """Per-episode stats: lerobot's shapes and types, its histogram quantiles exactly."""
    from lerobot.datasets.compute_stats import compute_episode_stats

    from torchstore.lerobot.stats import numeric_stats

    rows = stats_rows(n, n)
    features = {
        k: {"dtype": d, "shape": list(s), "names": None} for k, (d, s) in STATS_CASES.items()
    }
    theirs = compute_episode_stats(rows, features)
    # lerobot 0.6 casts bools to float32 before its stats; 0.4 kept them: bool min/max, and
    # float64 histogram edges (quantiles a float32 rounding apart). torchstore writes 0.6's.
    before_06 = lerobot_version() < (0, 6)
    for key, values in rows.items():
        ours = numeric_stats(values)
        for stat, want in theirs[key].items():
            got, want = ours[stat], np.asarray(want)
            where = f"{key} {stat}"
            assert got.shape == want.shape, where
            assert want.dtype != np.bool_ or (before_06 and stat in ("min", "max")), where
            assert got.dtype == (np.int64 if stat == "count" else np.float64), where
            if stat in ("mean", "std"):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)
            elif before_06 and values.dtype == np.bool_:
                np.testing.assert_allclose(got, want.astype(float), rtol=1e-6, atol=1e-9)
            else:
                np.testing.assert_array_equal(got, want, err_msg=where)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float16", "int32", "bool"])
def test_episode_stats_of_every_promoted_dtype_are_lerobot_06s(dtype):
    """lerobot 0.6 computes stats in result_type(dtype, float32): float32 for the narrow
    types (histogram edges too), float64 for int32. The same numbers, to the last bit."""
    if lerobot_version() < (0, 6):
        pytest.skip(
            f"lerobot {_dist_version('lerobot')} keeps the raw dtype (its uint8/int16 std "
            "overflows); this checks lerobot 0.6's promotion: run it in the 0.6.1 venv "
            "(bash tests/lerobot/lerobot_venv.sh 0.6.1)"
        )
    from lerobot.datasets.compute_stats import compute_episode_stats

    from torchstore.lerobot.stats import numeric_stats

    rng = np.random.default_rng(7)
    for n in (2, 9, 300):
        if dtype == "bool":
            values = rng.random((n, 3)) < 0.4
        elif dtype == "float16":
            values = (rng.standard_normal((n, 3)) * 4).astype(np.float16)
        else:
            values = rng.integers(0, 120, (n, 3)).astype(dtype)
        feature = {"x": {"dtype": dtype, "shape": [3], "names": None}}
        theirs = compute_episode_stats({"x": values}, feature)["x"]
        ours = numeric_stats(values)
        for stat, want in theirs.items():
            if stat in ("mean", "std"):  # lerobot's running float32 sums
                np.testing.assert_allclose(ours[stat], want, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(ours[stat], want, err_msg=f"{n} {stat}")


def test_lerobot_aggregates_a_torchstore_datasets_episode_stats(tmp_path):
    """The episodes table's stats aggregate in lerobot (a (3, 2) feature has (2,) stats) to
    what stats.json says."""
    import json

    import pyarrow.parquet as pq
    from lerobot.datasets.compute_stats import aggregate_stats

    root = tmp_path / "ds"
    features = {
        k: {"dtype": d, "shape": list(s), "names": None} for k, (d, s) in STATS_CASES.items()
    }
    with LeRobotWriter(root, fps=FPS, features=features) as w:
        for e, n in enumerate((5, 9, 4)):
            w.add_episode(stats_rows(e, n), task="t")
    table = pq.read_table(next((root / "meta/episodes").rglob("*.parquet")))
    per_episode = []
    for i in range(table.num_rows):
        episode = {}
        for name in table.column_names:
            if name.startswith("stats/"):
                _, key, stat = name.split("/")
                episode.setdefault(key, {})[stat] = np.asarray(table.column(name)[i].as_py())
        per_episode.append(episode)
    theirs = aggregate_stats(per_episode)
    ours = json.loads((root / "meta/stats.json").read_text())
    assert np.asarray(ours["grid"]["mean"]).shape == (2,)
    for key in STATS_CASES:
        for stat, want in theirs[key].items():
            np.testing.assert_allclose(
                np.asarray(ours[key][stat], dtype=float),
                np.asarray(want, dtype=float),
                rtol=1e-9,
                atol=1e-12,
                err_msg=f"{key} {stat}",
            )
    assert all(type(v) is float for v in ours["grip"]["min"] + ours["grip"]["max"])


def _stats_json(root: Path) -> dict:
    import json

    return json.loads((root / "meta/stats.json").read_text())


def assert_same_stats(got: dict, want: dict) -> None:
    """The same features and stats, the numbers equal to float32 rounding (lerobot keeps
    float32 running sums), and a bool feature's min/max as 0.0/1.0 floats (lerobot 0.6)."""
    assert set(got) == set(want)
    for key in want:
        assert set(got[key]) == set(want[key]), key
        for stat, value in want[key].items():
            np.testing.assert_allclose(
                np.asarray(got[key][stat], dtype=float),
                np.asarray(value, dtype=float),
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{key} {stat}",
            )
    for key in ("grip", "contacts"):
        assert all(type(v) is float for v in got[key]["min"] + got[key]["max"]), key


STATS_FEATURES = {
    k: {"dtype": d, "shape": list(s), "names": None} for k, (d, s) in STATS_CASES.items()
}
STATS_LENGTHS = (6, 9, 5, 7)


def test_a_lerobot_dataset_extended_by_torchstore_aggregates_as_lerobot_does(tmp_path):
    """lerobot records two episodes, torchstore resumes and adds two: stats.json is what
    lerobot writes for all four (whichever lerobot wrote the first two)."""
    both = tmp_path / "lerobot-all"
    record_with_lerobot(
        both, STATS_FEATURES, stats_rows, lambda e, n: ["t"] * n, STATS_LENGTHS, use_videos=False
    )
    root = tmp_path / "extended"
    record_with_lerobot(
        root,
        STATS_FEATURES,
        stats_rows,
        lambda e, n: ["t"] * n,
        STATS_LENGTHS[:2],
        use_videos=False,
    )
    with LeRobotWriter.resume(root) as w:
        for e, n in enumerate(STATS_LENGTHS[2:], start=2):
            w.add_episode(stats_rows(e, n), task="t")
    assert_same_stats(_stats_json(root), _stats_json(both))
    ds = lerobot.LeRobotDataset("local/rec", root=root)
    assert ds.num_episodes == 4 and len(ds) == sum(STATS_LENGTHS)


def test_a_torchstore_dataset_extended_by_lerobot_aggregates_as_torchstore_does(tmp_path):
    """torchstore records two episodes, lerobot 0.6 resumes and adds two: stats.json is
    what torchstore writes for all four."""
    if not hasattr(lerobot.LeRobotDataset, "resume"):
        pytest.skip(
            f"lerobot {_dist_version('lerobot')} has no LeRobotDataset.resume; "
            "run it in the 0.6.1 venv (bash tests/lerobot/lerobot_venv.sh 0.6.1)"
        )
    both, root = tmp_path / "torchstore-all", tmp_path / "extended"
    for path, lengths in ((both, STATS_LENGTHS), (root, STATS_LENGTHS[:2])):
        with LeRobotWriter(path, fps=FPS, features=STATS_FEATURES) as w:
            for e, n in enumerate(lengths):
                w.add_episode(stats_rows(e, n), task="t")
    ds = lerobot.LeRobotDataset.resume("local/rec", root=root)
    try:
        for e, n in enumerate(STATS_LENGTHS[2:], start=2):
            rows = stats_rows(e, n)
            for k in range(n):
                ds.add_frame({**{name: value[k] for name, value in rows.items()}, "task": "t"})
            ds.save_episode()
    finally:
        ds.finalize()
    assert_same_stats(_stats_json(root), _stats_json(both))
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        assert store.num_episodes == 4 and store.num_rows == sum(STATS_LENGTHS)


# ------------------------------------------------------------------------- frame selection
#: LeRobot's delta_timestamps at FPS (10): histories, strides, a second back, a chunk longer
#: than the shortest episode (8 frames), and the frame numbers themselves ("frame_index")
DELTA_TIMESTAMPS = {
    VIDEO: [-0.5, -0.1, 0.0],
    IMAGE: [-0.2, 0.0],
    "observation.state": [-0.1, 0.0],
    "frame_index": [-1.0, -0.3, 0.0, 0.2, 0.5],
    "action": [i / FPS for i in range(12)],
    "reward": [0.0, 0.3, 1.0],
}


def _as_frames(value: torch.Tensor) -> np.ndarray:
    """lerobot's float CHW frames in [0, 1] as uint8 HWC."""
    return np.round(value.permute(0, 2, 3, 1).numpy() * 255).astype(np.uint8)


@pytest.mark.parametrize("resident", ["all", 48])
def test_delta_timestamps_select_the_frames_lerobot_selects(
    lerobot_recorded, backend, tmp_path, resident
):
    """DemonstrationDataModule(delta_timestamps=...) on an imported recording gives, row for
    row, what LeRobotDataset(delta_timestamps=...)[t] gives: the same frames (frame
    indices, state, action, reward exactly; video frames as decoded, images exactly) and
    the same ``<key>_is_pad`` masks, resident or with whole episodes in a budget."""
    pytest.importorskip("lightning", reason="the DataModules need torchstore's train extra")
    from torchstore.lightning import DemonstrationDataModule

    root, _, _, _ = lerobot_recorded
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    obs = [VIDEO, IMAGE, "observation.state", "frame_index"]
    dm = DemonstrationDataModule(
        tmp_path / "out.h5",
        batch_size=48,
        obs_keys=obs,
        action_keys=["action", "reward"],
        delta_timestamps=DELTA_TIMESTAMPS,  # seconds at the fps the import recorded
        steps_per_epoch=1,
        device="cpu",
        normalize=False,
        resident=resident,
        resident_blocks=2,
    )
    batch = next(iter(dm.train_dataloader()))
    dm.close()
    ds = lerobot.LeRobotDataset(
        repo_id="local/rec", root=root, delta_timestamps=DELTA_TIMESTAMPS, video_backend=backend
    )
    assert len(set(batch["index"].tolist())) > 16  # rows of every episode, edges included
    for b, t in enumerate(batch["index"].tolist()):
        item = ds[t]
        assert int(item["index"]) == t
        for key in DELTA_TIMESTAMPS:
            pad = f"{key}_is_pad"
            assert torch.equal(batch[pad][b], item[pad]), (t, key)
            ours = batch["obs" if key in obs else "action", key][b]
            if key == VIDEO:
                theirs = _as_frames(item[key])
                assert np.abs(ours.numpy().astype(int) - theirs).max() <= 1, (t, key)
            elif key == IMAGE:
                np.testing.assert_array_equal(ours.numpy(), _as_frames(item[key]))
            else:
                assert ours.dtype == item[key].dtype, key
                torch.testing.assert_close(ours, item[key].reshape(ours.shape), rtol=0, atol=0)
