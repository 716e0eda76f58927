"""LeRobotWriter -> folder -> import_lerobot, checked against the LeRobot v3.0 format."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.io.frames.video import EncoderSettings
from torchstore.lerobot import LeRobotSource, LeRobotWriter, export_lerobot, import_lerobot
from torchstore.lerobot.stats import STAT_NAMES

FPS = 10
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]},
    "action": {"dtype": "float64", "shape": [2, 2], "names": None},
    "gripper_closed": {"dtype": "bool", "shape": [1], "names": None},
    "count": {"dtype": "int64", "shape": [1], "names": None},
    "observation.images.wrist": {
        "dtype": "image",
        "shape": [8, 6, 3],
        "names": ["height", "width", "channels"],
    },
    "observation.images.front": {
        "dtype": "video",
        "shape": [48, 64, 3],
        "names": ["height", "width", "channels"],
    },
}
LENGTHS = (10, 15, 8)
# AV1 at LeRobot's defaults on the smooth test scene: mean abs error about 1 level in 255
# (torchstore/io/frames/video.py states and tests the codec bound).
VIDEO_MAE = 3.0


def scene(episode: int, n: int) -> np.ndarray:
    """Smooth camera-like frames: a gradient with a square moving across it."""
    frames = np.zeros((n, 48, 64, 3), np.uint8)
    frames[..., 0] = np.linspace(0, 255, 64, dtype=np.uint8)[None, None]
    frames[..., 1] = np.linspace(0, 255, 48, dtype=np.uint8)[None, :, None]
    frames[..., 2] = (40 * episode) % 256
    for k in range(n):
        x = (3 * k + 7 * episode) % 50
        frames[k, 15:27, x : x + 12] = 230
    return frames


def episode_rows(episode: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(episode)
    return {
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2, 2)),
        "gripper_closed": rng.random(n) < 0.5,
        "count": np.arange(n, dtype=np.int64) * (episode + 1),
        "observation.images.wrist": rng.integers(0, 256, (n, 8, 6, 3), dtype=np.uint8),
        "observation.images.front": scene(episode, n),
    }


def record(root, lengths=LENGTHS, **kwargs) -> list[dict[str, np.ndarray]]:
    """Episode 0 frame by frame (two tasks), the rest through add_episode."""
    written = []
    with LeRobotWriter(
        root, fps=FPS, features=FEATURES, robot_type="so101_follower", **kwargs
    ) as w:
        for e, n in enumerate(lengths):
            rows = episode_rows(e, n)
            if e == 0:
                for k in range(n):
                    frame = {name: value[k] for name, value in rows.items()}
                    frame["task"] = "pick the cube" if k < n // 2 else None
                    w.add_frame(frame)
                assert w.save_episode(task="place the cube") == 0
            else:
                assert w.add_episode(rows, task="stack") == e
            written.append(rows)
    return written


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "ds"
    return root, record(root)


def check_store(path, written, *, video_mae=VIDEO_MAE):
    with TrajectoryStore(path) as store:
        assert store.num_episodes == len(written)
        for e, rows in enumerate(written):
            got = store.episode(e)
            for name, value in rows.items():
                have = got[name].numpy()
                if name == "observation.images.front":
                    err = np.abs(have.astype(np.int16) - value.astype(np.int16)).mean()
                    assert err <= video_mae, (e, err)
                else:
                    np.testing.assert_array_equal(have, value.reshape(have.shape), err_msg=name)
            n = len(rows["count"])
            np.testing.assert_array_equal(got["frame_index"].numpy(), np.arange(n))
            np.testing.assert_array_equal(got["episode_index"].numpy(), np.full(n, e))
            np.testing.assert_allclose(got["timestamp"].numpy(), np.arange(n) / FPS, rtol=1e-6)
        return store.manifest.metadata["lerobot"], store.episode(0)["task_index"].numpy()


def test_round_trip_reproduces_every_feature(recorded, tmp_path):
    root, written = recorded
    summary = import_lerobot(root, tmp_path / "out.h5", progress=False)
    assert (summary.episodes, summary.frames) == (3, sum(LENGTHS))
    meta, task_index = check_store(tmp_path / "out.h5", written)
    assert meta["fps"] == FPS and meta["robot_type"] == "so101_follower"
    assert meta["tasks"] == ["pick the cube", "place the cube", "stack"]
    assert list(task_index) == [0] * 5 + [1] * 5
    assert meta["features"]["observation.state"]["names"] == ["x", "y", "z"]
    assert set(meta["stats"]) >= {"observation.state", "observation.images.front", "index"}


def test_columns_and_episode_selection(recorded, tmp_path):
    root, written = recorded
    import_lerobot(root, tmp_path / "sub.h5", episodes=[2, 0], columns=["action"], progress=False)
    with TrajectoryStore(tmp_path / "sub.h5") as store:
        assert [c.name for c in store.columns] == ["action"]
        assert store.num_episodes == 2
        np.testing.assert_array_equal(store.episode(1)["action"].numpy(), written[2]["action"])
        assert store.episode_metadata(1)["lerobot_episode_index"] == 2


def test_files_and_keys_follow_the_spec(recorded):
    root, _ = recorded
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert [f for f in files if not f.startswith("images/")] == [
        "data/chunk-000/file-000.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/info.json",
        "meta/stats.json",
        "meta/tasks.parquet",
        "videos/observation.images.front/chunk-000/file-000.mp4",
    ]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 33, 3)
    assert info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert (
        info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    assert (info["chunks_size"], info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (
        1000,
        100,
        200,
    )
    assert list(info["features"]) == [
        *FEATURES,
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    assert info["features"]["timestamp"] == {"dtype": "float32", "shape": [1], "names": None}
    video = info["features"]["observation.images.front"]["info"]
    assert video["video.codec"] == "av1" and video["video.pix_fmt"] == "yuv420p"
    assert (video["video.height"], video["video.width"], video["video.fps"]) == (48, 64, FPS)
    assert video["has_audio"] is False

    data = pq.ParquetFile(root / "data/chunk-000/file-000.parquet")
    schema = data.schema_arrow
    assert schema.names == [n for n in info["features"] if n != "observation.images.front"]
    assert schema.field("observation.state").type == pa.list_(pa.float32(), 3)
    assert schema.field("gripper_closed").type == pa.bool_()
    assert schema.field("count").type == pa.int64()
    assert schema.field("timestamp").type == pa.float32()
    action = schema.field("action")
    assert action.type == pa.list_(pa.list_(pa.float64()))
    assert (
        action.metadata[b"ARROW:extension:name"]
        == b"datasets.features.features.Array2DExtensionType"
    )
    assert json.loads(action.metadata[b"ARROW:extension:metadata"]) == [[2, 2], "float64"]
    assert schema.field("observation.images.wrist").type == pa.struct(
        [("bytes", pa.binary()), ("path", pa.string())]
    )
    hf = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.state"] == {
        "_type": "List",
        "feature": {"dtype": "float32", "_type": "Value"},
        "length": 3,
    }
    assert hf["observation.images.wrist"] == {"_type": "Image"}
    assert [data.metadata.row_group(i).num_rows for i in range(data.num_row_groups)] == list(
        LENGTHS
    )
    first = data.read_row_group(0).column("observation.images.wrist")[0].as_py()
    assert first["bytes"][:8] == b"\x89PNG\r\n\x1a\n" and first["path"] == "frame-000000.png"
    table = data.read()
    assert table.column("index").to_pylist() == list(range(33))

    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    cam = "videos/observation.images.front"
    assert episodes.column_names[:11] == [
        "episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
        "dataset_from_index", "dataset_to_index", f"{cam}/chunk_index", f"{cam}/file_index",
        f"{cam}/from_timestamp", f"{cam}/to_timestamp",
    ]  # fmt: skip
    assert episodes.column_names[-2:] == ["meta/episodes/chunk_index", "meta/episodes/file_index"]
    assert episodes.column(f"{cam}/from_timestamp").to_pylist() == [0.0, 1.0, 2.5]
    assert episodes.column(f"{cam}/to_timestamp").to_pylist() == [1.0, 2.5, 3.3]
    assert episodes.column("dataset_to_index").to_pylist() == [10, 25, 33]
    assert sorted(episodes.column("tasks")[0].as_py()) == ["pick the cube", "place the cube"]
    assert episodes.schema.field("stats/observation.state/mean").type == pa.list_(pa.float64())
    assert episodes.schema.field("stats/count/count").type == pa.list_(pa.int64())
    assert episodes.schema.field("stats/observation.images.front/mean").type == pa.list_(
        pa.list_(pa.list_(pa.float64()))
    )
    assert np.asarray(episodes.column("stats/observation.images.front/max")[0].as_py()).shape == (
        3,
        1,
        1,
    )
    for stat in STAT_NAMES:
        assert f"stats/frame_index/{stat}" in episodes.column_names

    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column_names == ["task_index", "task"]
    assert tasks.to_pylist()[2] == {"task_index": 2, "task": "stack"}
    assert b"pandas" in tasks.schema.metadata

    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["observation.state"]["count"] == [33]
    assert np.asarray(stats["observation.images.front"]["mean"]).shape == (3, 1, 1)
    all_states = np.concatenate(
        [episode_rows(e, n)["observation.state"] for e, n in enumerate(LENGTHS)]
    )
    np.testing.assert_allclose(stats["observation.state"]["mean"], all_states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["std"], all_states.std(0), rtol=1e-5)


def test_every_save_is_a_complete_dataset(tmp_path):
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=FPS, features=FEATURES) as w:
        for e, n in enumerate((4, 6, 5)):
            w.add_episode(episode_rows(e, n), task="t")
            with LeRobotSource(root) as src:  # the writer is still open
                assert len(src.episodes) == e + 1
                last = src.read_episode(src.episodes[-1], ["count"])
                np.testing.assert_array_equal(last["count"], episode_rows(e, n)["count"])
        # an unsaved episode is not visible, and close() discards it
        w.add_frame({k: v[0] for k, v in episode_rows(9, 1).items()}, task="t")
    with LeRobotSource(root) as src:
        assert len(src.episodes) == 3 and src.num_frames == 15


def test_files_roll_over_at_the_caps(tmp_path):
    root = tmp_path / "ds"
    lengths = (6, 7, 5, 8, 6)
    written = record(
        root, lengths, chunks_size=2, data_files_size_in_mb=0.003, video_files_size_in_mb=0.003
    )
    data = sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet"))
    assert data[:3] == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    videos = sorted((root / "videos").rglob("*.mp4"))
    assert len(videos) > 1
    with LeRobotSource(root) as src:
        froms = [e.videos["observation.images.front"][1] for e in src.episodes]
    assert 0.0 in froms[1:]  # a later episode starts a new video file
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    check_store(tmp_path / "out.h5", written)


def test_resume_continues_in_new_files(tmp_path):
    root = tmp_path / "ds"
    first = record(root, (5, 6))
    with LeRobotWriter.resume(root) as w:
        assert w.num_episodes == 2 and w.tasks == ["pick the cube", "place the cube", "stack"]
        more = [episode_rows(e, n) for e, n in ((2, 7), (3, 4))]
        for rows in more:
            w.add_episode(rows, task="stack")
    assert (root / "data/chunk-000/file-001.parquet").exists()
    assert (root / "videos/observation.images.front/chunk-000/file-001.mp4").exists()
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    check_store(tmp_path / "out.h5", first + more)
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (4, 22)
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["index"]["max"] == [21.0] and stats["index"]["count"] == [22]


def test_a_second_writer_is_refused(tmp_path):
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=FPS, features={"a": {"dtype": "float32", "shape": [1]}}):
        with pytest.raises(ValueError, match="another LeRobotWriter"):
            LeRobotWriter.resume(root)


def test_rejected_episodes_are_recorded_and_skipped(recorded, tmp_path, caplog):
    root, written = recorded
    copy = tmp_path / "ds"
    import shutil

    shutil.copytree(root, copy)
    with LeRobotWriter.resume(copy) as w:
        w.reject_episode(1, "gripper slipped")
        with pytest.raises(ValueError, match="does not exist"):
            w.reject_episode(3, "no such episode")
    entries = json.loads((copy / "meta/rejected_episodes.json").read_text())
    assert [(e["episode_index"], e["reason"]) for e in entries] == [(1, "gripper slipped")]
    assert entries[0]["time"].startswith("20")
    with caplog.at_level("WARNING"):
        summary = import_lerobot(copy, tmp_path / "kept.h5", progress=False)
    assert summary.skipped_rejected == (1,) and "skipped 1 rejected" in str(summary)
    assert "skipping 1 rejected" in caplog.text
    with TrajectoryStore(tmp_path / "kept.h5") as store:
        assert [store.episode_metadata(i)["lerobot_episode_index"] for i in range(2)] == [0, 2]
        np.testing.assert_array_equal(store.episode(1)["count"].numpy(), written[2]["count"])
    summary = import_lerobot(copy, tmp_path / "all.h5", include_rejected=True, progress=False)
    assert summary.episodes == 3 and summary.skipped_rejected == ()
    with TrajectoryStore(tmp_path / "all.h5") as store:
        assert store.episode_metadata(1)["rejected"] == "gripper slipped"


def test_h264_option(tmp_path):
    root = tmp_path / "ds"
    written = record(root, (6, 5), video_encoder=EncoderSettings.h264())
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["info"]["video.codec"] == "h264"
    import_lerobot(root, tmp_path / "out.h5", progress=False)
    check_store(tmp_path / "out.h5", written)


def test_export_of_an_imported_store_round_trips(recorded, tmp_path):
    root, written = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    summary = export_lerobot(tmp_path / "a.h5", tmp_path / "exported", progress=False)
    assert (summary.episodes, summary.frames) == (3, 33)
    info = json.loads((tmp_path / "exported/meta/info.json").read_text())
    original = json.loads((root / "meta/info.json").read_text())
    assert info["features"].keys() == original["features"].keys()
    assert info["robot_type"] == "so101_follower" and info["fps"] == FPS
    import_lerobot(tmp_path / "exported", tmp_path / "b.h5", progress=False)
    meta, task_index = check_store(tmp_path / "b.h5", written, video_mae=2 * VIDEO_MAE)
    assert meta["tasks"] == ["pick the cube", "place the cube", "stack"]
    assert list(task_index) == [0] * 5 + [1] * 5


def test_export_of_a_plain_store(tmp_path):
    columns = [
        ColumnSpec("obs", torch.float32, (4,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("next/obs", torch.float32, (4,)),
        ColumnSpec("pixels", torch.uint8, (16, 16, 3)),
    ]
    rng = np.random.default_rng(0)
    episodes = []
    with TrajectoryStoreWriter(tmp_path / "s.h5", columns, env_id="Reach-v0") as w:
        for n in (5, 7):
            rows = {
                "obs": rng.standard_normal((n, 4)).astype(np.float32),
                "reward": rng.standard_normal(n).astype(np.float32),
                "next/obs": rng.standard_normal((n, 4)).astype(np.float32),
                "pixels": rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
            }
            w.add_episode(rows)
            episodes.append(rows)
    with pytest.raises(ValueError, match=r"records no frame rate: pass fps=.*--fps"):
        export_lerobot(tmp_path / "s.h5", tmp_path / "x", progress=False)
    export_lerobot(tmp_path / "s.h5", tmp_path / "ds", fps=20, cameras="image", progress=False)
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["features"]["next.obs"]["shape"] == [4]
    assert info["features"]["reward"]["shape"] == [1]
    assert info["features"]["pixels"]["dtype"] == "image"
    with LeRobotSource(tmp_path / "ds") as src:
        assert src.tasks == ["Reach-v0"]
    import_lerobot(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with TrajectoryStore(tmp_path / "back.h5") as store:
        assert [c.name for c in store.columns] == [c.name for c in columns]  # nesting kept
        for e, rows in enumerate(episodes):
            got = store.episode(e)
            for name, value in rows.items():
                np.testing.assert_array_equal(got[tuple(name.split("/"))].numpy(), value)


def test_string_features_become_codes_and_export_back(tmp_path):
    features = {
        "note": {"dtype": "string", "shape": [1], "names": None},
        "x": {"dtype": "float32", "shape": [1], "names": None},
    }
    notes = [["ok", "slip", "ok"], ["grasp", "ok"]]
    with LeRobotWriter(tmp_path / "ds", fps=FPS, features=features) as w:
        for episode in notes:
            n = len(episode)
            w.add_episode({"note": episode, "x": np.arange(n, dtype=np.float32)}, task="t")
    assert (
        pq.read_schema(tmp_path / "ds/data/chunk-000/file-000.parquet").field("note").type
        == pa.string()
    )
    import_lerobot(tmp_path / "ds", tmp_path / "a.h5", progress=False)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        table = store.manifest.metadata["lerobot"]["string_tables"]["note"]
        assert table == ["ok", "slip", "grasp"]
        assert [table[c] for c in store.episode(1)["note"].tolist()] == notes[1]
    export_lerobot(tmp_path / "a.h5", tmp_path / "back", progress=False)
    column = pq.read_table(tmp_path / "back/data/chunk-000/file-000.parquet").column("note")
    assert column.to_pylist() == notes[0] + notes[1]


def test_tasks_table_as_lerobot_04_writes_it(recorded, tmp_path):
    """lerobot 0.4.x saves tasks with an unnamed pandas index: column '__index_level_0__'."""
    import shutil

    root, written = recorded
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    tasks = pq.read_table(copy / "meta/tasks.parquet")
    pandas_meta = {"index_columns": ["__index_level_0__"], "columns": []}
    table = pa.table(
        {"task_index": tasks.column("task_index"), "__index_level_0__": tasks.column("task")}
    ).replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    pq.write_table(table, copy / "meta/tasks.parquet")
    import_lerobot(copy, tmp_path / "out.h5", progress=False)
    meta, _ = check_store(tmp_path / "out.h5", written)
    assert meta["tasks"] == ["pick the cube", "place the cube", "stack"]
    with LeRobotWriter.resume(copy) as w:
        assert w.tasks == meta["tasks"]


def test_round_trip_restores_the_store(tmp_path):
    """store -> export_lerobot -> import_lerobot gives back the same store: columns with
    their nesting, dtypes and quantisation, env id, seed, metadata, per-episode metadata,
    and no column the export added."""
    from torchstore.data.quantize import Quantize

    columns = [
        ColumnSpec("obs", torch.float32, (3,), quantize=Quantize(-2.0, 2.0)),
        ColumnSpec("next/state", torch.float64, (2, 2)),
        ColumnSpec("done", torch.bool),
        ColumnSpec("count", torch.int16, (1,)),
    ]
    metadata = {"robot": {"arm": "so101", "links": [1, 2]}, "note": "demo"}
    rng = np.random.default_rng(3)
    with TrajectoryStoreWriter(
        tmp_path / "s.h5", columns, env_id="Reach-v0", seed=7, metadata=metadata
    ) as w:
        for e, n in enumerate((4, 6, 3)):
            rows = {
                "obs": rng.uniform(-2, 2, (n, 3)).astype(np.float32),
                "next/state": rng.standard_normal((n, 2, 2)),
                "done": np.arange(n) == n - 1,
                "count": np.arange(n, dtype=np.int16)[:, None] * (e + 1),
            }
            w.add_episode(rows, metadata={"operator": f"op{e}", "success": e != 1})
    with TrajectoryStore(tmp_path / "s.h5") as original:
        before = [original.episode(e) for e in range(3)]
    export_lerobot(tmp_path / "s.h5", tmp_path / "ds", fps=10, progress=False)
    assert (tmp_path / "ds/meta/torchstore.json").exists()
    with LeRobotSource(tmp_path / "ds") as src:  # still an ordinary LeRobot dataset
        assert [e.length for e in src.episodes] == [4, 6, 3]
    import_lerobot(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with TrajectoryStore(tmp_path / "back.h5") as store:
        assert store.columns == tuple(columns)
        assert store.manifest.env_id == "Reach-v0" and store.manifest.seed == 7
        assert store.manifest.metadata == metadata
        for e in range(3):
            assert store.episode_metadata(e) == {"operator": f"op{e}", "success": e != 1}
            got, raw = store.episode(e), store.episode(e, raw=True)
            for spec in columns:
                key = tuple(spec.name.split("/"))
                assert got[key].dtype == before[e][key].dtype
                np.testing.assert_array_equal(got[key].numpy(), before[e][key].numpy())
            assert raw["obs"].dtype == torch.uint8  # still quantised on disk
        with TrajectoryStore(tmp_path / "s.h5") as original:
            assert store.size_on_disk() < 2 * original.size_on_disk()


def test_a_lerobot_imported_store_round_trips_with_its_task_table(recorded, tmp_path):
    root, _ = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    export_lerobot(tmp_path / "a.h5", tmp_path / "again", progress=False)
    import_lerobot(tmp_path / "again", tmp_path / "b.h5", progress=False)
    with TrajectoryStore(tmp_path / "a.h5") as a, TrajectoryStore(tmp_path / "b.h5") as b:
        assert a.columns == b.columns and "index" not in {c.name for c in a.columns}
        assert a.manifest.metadata == b.manifest.metadata
        for e in range(a.num_episodes):
            assert a.episode_metadata(e) == b.episode_metadata(e)
            for name in (
                "observation.state",
                "task_index",
                "timestamp",
                "frame_index",
                "episode_index",
            ):
                np.testing.assert_array_equal(
                    a.episode(e)[name].numpy(), b.episode(e)[name].numpy(), err_msg=name
                )


def test_cameras_option_applies_to_imported_cameras(recorded, tmp_path):
    root, _ = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    export_lerobot(tmp_path / "a.h5", tmp_path / "img", cameras="image", progress=False)
    info = json.loads((tmp_path / "img/meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "image"
    assert not (tmp_path / "img/videos").exists()
    export_lerobot(tmp_path / "a.h5", tmp_path / "asis", progress=False)  # default: as imported
    info = json.loads((tmp_path / "asis/meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    assert info["features"]["observation.images.wrist"]["dtype"] == "image"


def test_import_and_export_refuse_their_source_as_destination(recorded, tmp_path):
    from torchstore.errors import DestinationError

    root, _ = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    with pytest.raises(DestinationError, match="is the input"):
        export_lerobot(tmp_path / "a.h5", tmp_path / "a.h5", fps=10, overwrite=True, progress=False)
    with pytest.raises(DestinationError, match="inside the input folder"):
        import_lerobot(root, root / "meta" / "x.h5", progress=False)
    (tmp_path / "plain.txt").write_text("not a store")
    with pytest.raises(DestinationError, match="not a torchstore store"):
        import_lerobot(root, tmp_path / "plain.txt", overwrite=True, progress=False)
    assert (tmp_path / "plain.txt").read_text() == "not a store"


def test_lerobot_imported_stores_train_in_both_datamodules(recorded, tmp_path):
    """No column of an imported store clashes with the keys batches add ("index")."""
    from torchstore.lightning import DemonstrationDataModule, OfflineDataModule

    root, _ = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    offline = OfflineDataModule(tmp_path / "a.h5", batch_size=4, steps_per_epoch=2, device="cpu")
    batch = next(iter(offline.train_dataloader()))
    assert batch["index"].shape == (4,)
    assert batch["observation.state"].shape == (4, 3)
    demo = DemonstrationDataModule(
        tmp_path / "a.h5",
        batch_size=4,
        obs_keys=["observation.state", "observation.images.wrist"],
        action_keys=["action"],
        n_obs_steps=2,
        action_horizon=3,
        steps_per_epoch=2,
        device="cpu",
        stats_cache=False,
    )
    batch = next(iter(demo.train_dataloader()))
    assert batch["action", "action"].shape == (4, 3, 2, 2)
    assert batch["index"].shape == (4,)


@pytest.mark.parametrize("slab_frames", [1, 12, 10**6])
def test_import_in_slabs_of_any_size_gives_the_same_store(
    recorded, tmp_path, monkeypatch, slab_frames
):
    """Episodes are decoded and committed in slabs; where a slab ends changes nothing."""
    import torchstore.lerobot.importer as importer

    root, written = recorded
    with LeRobotSource(root) as src:
        frame_bytes = sum(
            int(np.prod(src.features[n].column_spec().shape, dtype=np.int64))
            * src.features[n].column_spec().storage_dtype.itemsize
            for n in src.features
            if n != "index"
        )
    monkeypatch.setattr(importer, "_SLAB_BYTES", slab_frames * frame_bytes)
    import_lerobot(root, tmp_path / "all.h5", progress=False)
    check_store(tmp_path / "all.h5", written)
    import_lerobot(root, tmp_path / "some.h5", episodes=[0, 2], progress=False)  # a gap
    with TrajectoryStore(tmp_path / "some.h5") as store:
        assert [store.episode_metadata(e)["lerobot_episode_index"] for e in range(2)] == [0, 2]
        np.testing.assert_array_equal(store.episode(1)["count"].numpy(), written[2]["count"])


def test_language_annotations_import_as_codes_of_their_json(tmp_path):
    """lerobot 0.6's language_persistent column (a list of message structs per frame, filled
    in by its annotation tools) is imported, not skipped: one code per frame, standing for
    the cell's JSON."""
    features = {"x": {"dtype": "float32", "shape": [1], "names": None}}
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=FPS, features=features) as w:
        for n in (3, 2):
            w.add_episode({"x": np.arange(n, dtype=np.float32)}, task="t")
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("style", pa.string()),
            ("timestamp", pa.float64()),
            ("camera", pa.string()),
            ("tool_calls", pa.string()),
        ]
    )
    plan = {
        "role": "assistant",
        "content": "open the gripper",
        "style": "subtask",
        "timestamp": 0.0,
        "camera": None,
        "tool_calls": None,
    }
    later = {**plan, "content": "lift", "timestamp": 0.2}
    cells = [[plan], [plan], [plan, later], None, [later]]
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.append_column("language_persistent", pa.array(cells, pa.list_(message))), path
    )
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["language_persistent"] = {"dtype": "language", "shape": [1], "names": None}
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        assert store.column("language_persistent").dtype == torch.int64
        strings = store.manifest.metadata["lerobot"]["string_tables"]["language_persistent"]
        codes = np.concatenate([store.episode(e)["language_persistent"].numpy() for e in range(2)])
        assert [json.loads(strings[c]) for c in codes] == cells
        assert codes[0] == codes[1]  # equal annotations share a code
    export_lerobot(tmp_path / "a.h5", tmp_path / "back", progress=False)  # annotations left out
    back = json.loads((tmp_path / "back/meta/info.json").read_text())
    assert "language_persistent" not in back["features"] and "x" in back["features"]


@pytest.mark.parametrize("slab_bytes", [1, 200, 2**30])
def test_export_reads_the_store_in_slabs_of_any_size(recorded, tmp_path, monkeypatch, slab_bytes):
    import torchstore.lerobot.export as export

    root, written = recorded
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    monkeypatch.setattr(export, "_SLAB_BYTES", slab_bytes)
    export_lerobot(tmp_path / "a.h5", tmp_path / "again", progress=False)
    import_lerobot(tmp_path / "again", tmp_path / "b.h5", progress=False)
    check_store(tmp_path / "b.h5", written, video_mae=2 * VIDEO_MAE)  # encoded twice
