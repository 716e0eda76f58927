"""Hostile LeRobot folders and hostile writer input.

Every broken dataset must be refused by ``import_lerobot`` with an error that says what is
wrong and names the file, must leave nothing at the destination (no store, no hidden
``.<name>.importing``) and must leave the source folder byte-for-byte unchanged. Every
refused writer call must lose no saved episode and leave the writer able to record on.
The last section builds a LeRobot v2.1 folder by hand (spec section 13) and imports it.

Format: LeRobot v3.0 (and the v2.1 layout it reads too).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")
pytest.importorskip("PIL")

from torchstore.data import TrajectoryStore  # noqa: E402
from torchstore.errors import (  # noqa: E402
    EpisodeError,
    LeRobotFormatError,
    UnsafePathError,
    VideoError,
)
from torchstore.io.frames.video import encode_video  # noqa: E402
from torchstore.lerobot import LeRobotWriter, import_lerobot  # noqa: E402

FPS = 10
H, W = 48, 64
CAM = "cam"
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    CAM: {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
}
NUMERIC = ("observation.state", "action")
LENGTHS = (5, 8, 6)

# torchstore/io/frames/video.py: decoded frames are within MAE <= 3 and PSNR >= 32 dB of the input
MAX_MAE = 3.0
MIN_PSNR = 32.0


# --------------------------------------------------------------------------- helpers
def scene(n: int, seed: int = 0, h: int = H, w: int = W) -> np.ndarray:
    """A smooth moving RGB scene, uint8 [n, h, w, 3] (what a lossy codec keeps well)."""
    t = np.arange(n, dtype=np.float64)[:, None, None]
    y = np.arange(h)[None, :, None]
    x = np.arange(w)[None, None, :]
    p = seed * 0.9
    r = 128 + 70 * np.sin(np.pi * (x / w + t / 40) + p) + 0 * y
    g = 128 + 70 * np.cos(np.pi * (y / h - t / 50) + p) + 0 * x
    b = 100 + 40 * np.sin(np.pi * ((x + y) / 120 + t / 60) + p)
    return np.stack([r, g, b], -1).round().astype(np.uint8)


def episode_rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        CAM: scene(n, seed),
    }


def one_frame(seed: int = 0) -> dict[str, np.ndarray]:
    """A valid single frame for :data:`FEATURES`."""
    return {k: v[0] for k, v in episode_rows(1, seed).items()}


def assert_video_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.uint8
    diff = got.astype(np.float64) - want.astype(np.float64)
    mae = np.abs(diff).mean()
    psnr = 10 * np.log10(255.0**2 / max((diff**2).mean(), 1e-12))
    assert mae <= MAX_MAE, f"video MAE {mae:.2f} > {MAX_MAE}"
    assert psnr >= MIN_PSNR, f"video PSNR {psnr:.1f} dB < {MIN_PSNR}"


def assert_store_holds(path: Path, episodes: list[dict[str, np.ndarray]], tasks=None) -> None:
    """The imported store holds exactly ``episodes`` (numbers exact, video within tolerance)."""
    with TrajectoryStore(path) as store:
        assert store.num_episodes == len(episodes)
        start = 0
        for i, want in enumerate(episodes):
            got = store.episode(i)
            n = len(want[CAM])
            assert got.batch_size[0] == n
            for name in NUMERIC:
                np.testing.assert_array_equal(got[name].numpy(), want[name], err_msg=name)
            np.testing.assert_array_equal(got["frame_index"].numpy(), np.arange(n))
            np.testing.assert_array_equal(got["episode_index"].numpy(), np.full(n, i))
            # LeRobot's global frame index is the store row, not a column ("index" is the
            # key every DataModule batch adds); the episode's first one is in its metadata
            assert "index" not in got.keys()
            assert store.episode_metadata(i)["dataset_from_index"] == start
            np.testing.assert_array_equal(
                got["timestamp"].numpy(), (np.arange(n) / FPS).astype(np.float32)
            )
            assert_video_close(got[CAM].numpy(), want[CAM])
            start += n
        if tasks is not None:
            assert store.manifest.metadata["lerobot"]["tasks"] == tasks


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file (and the target of every symlink) under ``root``."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_refused(root: Path, tmp_path: Path, errors, match: str) -> pytest.ExceptionInfo:
    """``import_lerobot(root)`` raises ``errors`` matching ``match``; dest and source untouched."""
    before = tree_digest(root)
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / "out.h5"
    with pytest.raises(errors, match=match) as info:
        import_lerobot(root, dest, progress=False)
    left = sorted(p.name for p in dest_dir.iterdir())
    assert left == [], f"the failed import left {left} at the destination"
    assert not dest.exists() and not (dest_dir / ".out.h5.importing").exists()
    assert tree_digest(root) == before, "the import changed the source folder"
    return info


def edit_info(root: Path, change: Callable[[dict], object]) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info, indent=4))


def strip_footer(path: Path) -> None:
    """Cut a Parquet file's footer (metadata, its length and the closing ``PAR1``) off.

    What LeRobot leaves when the recorder dies: the row groups are there, the footer not.
    """
    data = path.read_bytes()
    assert data[-4:] == b"PAR1"
    footer = int.from_bytes(data[-8:-4], "little")
    path.write_bytes(data[: len(data) - 8 - footer])


DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
VIDEO = f"videos/{CAM}/chunk-000/file-000.mp4"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A valid v3.0 dataset written by LeRobotWriter (3 episodes, one camera) and its rows."""
    root = tmp_path_factory.mktemp("pristine") / "ds"
    episodes = [episode_rows(n, seed) for seed, n in enumerate(LENGTHS)]
    with LeRobotWriter(root, fps=FPS, features=FEATURES) as w:
        for rows in episodes:
            w.add_episode(rows, task="pick")
    return root, episodes


@pytest.fixture
def ds(pristine, tmp_path) -> Path:
    """A fresh copy of the pristine dataset at ``tmp_path/src/ds`` (``../..`` is tmp_path)."""
    root = tmp_path / "src" / "ds"
    shutil.copytree(pristine[0], root, symlinks=True)
    return root


def test_the_pristine_dataset_imports(ds, pristine, tmp_path):
    before = tree_digest(ds)
    summary = import_lerobot(ds, tmp_path / "out.h5", progress=False)
    assert (summary.episodes, summary.frames) == (len(LENGTHS), sum(LENGTHS))
    assert_store_holds(tmp_path / "out.h5", pristine[1], tasks=["pick"])
    assert tree_digest(ds) == before
    assert not (tmp_path / ".out.h5.importing").exists()


# --------------------------------------------------------------------------- 1. info.json
def _drop(key):
    return lambda info: info.pop(key)


def _set(key, value):
    return lambda info: info.__setitem__(key, value)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.unlink(), r"meta/info\.json is missing"),
        (lambda p: p.write_text('{"fps": 10, "features": '), r"meta/info\.json is not valid JSON"),
        (lambda p: p.write_bytes(b"\xff\xfe{}"), r"meta/info\.json is not UTF-8"),
        (lambda p: p.write_text("[1, 2, 3]"), r"meta/info\.json must hold a JSON object, got list"),
        (lambda p: p.write_text("null"), r"meta/info\.json must hold a JSON object"),
    ],
    ids=["missing", "not-json", "not-utf8", "json-list", "json-null"],
)
def test_unreadable_info_json(ds, tmp_path, damage, match):
    damage(ds / "meta/info.json")
    assert_refused(ds, tmp_path, LeRobotFormatError, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_drop("features"), r"meta/info\.json has no 'features' key"),
        (_drop("fps"), r"meta/info\.json has no 'fps' key"),
        (_drop("codebase_version"), r"meta/info\.json has no 'codebase_version' key"),
        (_set("fps", 0), r"meta/info\.json: fps \(0\) must be a finite number > 0"),
        (_set("fps", -10), r"meta/info\.json: fps \(-10\) must be a finite number > 0"),
        (_set("fps", "ten"), r"meta/info\.json: fps \('ten'\) must be a finite number > 0"),
        (_set("fps", True), r"meta/info\.json: fps \(True\) must be a finite number > 0"),
        (_set("features", {}), r"meta/info\.json: 'features' must be a non-empty object"),
        (_set("features", [1]), r"meta/info\.json: 'features' must be a non-empty object"),
        (_set("total_episodes", -1), r"meta/info\.json: total_episodes \(-1\) must be an int >= 0"),
    ],
    ids=[
        "no-features",
        "no-fps",
        "no-version",
        "fps-0",
        "fps-negative",
        "fps-ten",
        "fps-bool",
        "features-empty",
        "features-list",
        "total-negative",
    ],
)
def test_info_json_missing_or_bad_keys(ds, tmp_path, change, match):
    edit_info(ds, change)
    assert_refused(ds, tmp_path, LeRobotFormatError, match)


def test_fractional_fps_is_refused_naming_info_json(ds, tmp_path):
    edit_info(ds, _set("fps", 12.5))
    assert_refused(ds, tmp_path, LeRobotFormatError, r"meta/info\.json.*fps.*12\.5")


# --------------------------------------------------------------------------- 2. versions
@pytest.mark.parametrize(
    ("version", "match"),
    [
        ("v1.0", r"meta/info\.json: codebase_version 'v1\.0' is not supported"),
        ("v4.0", r"meta/info\.json: codebase_version 'v4\.0' is not supported"),
        ("3.0", r"meta/info\.json: codebase_version '3\.0' is not like 'v3\.0'"),
        ("v3", r"meta/info\.json: codebase_version 'v3' is not like 'v3\.0'"),
        ("vthree", r"meta/info\.json: codebase_version 'vthree' is not like 'v3\.0'"),
        (3.0, r"meta/info\.json: codebase_version 3\.0 is not like 'v3\.0'"),
    ],
)
def test_unsupported_codebase_version(ds, tmp_path, version, match):
    edit_info(ds, _set("codebase_version", version))
    assert_refused(ds, tmp_path, LeRobotFormatError, match)


def test_a_newer_minor_version_is_read(ds, pristine, tmp_path):
    edit_info(ds, _set("codebase_version", "v3.1"))
    import_lerobot(ds, tmp_path / "out.h5", progress=False)
    assert_store_holds(tmp_path / "out.h5", pristine[1])


# --------------------------------------------------------------------------- 3. missing files
def test_missing_data_parquet(ds, tmp_path):
    (ds / DATA).unlink()
    assert_refused(ds, tmp_path, LeRobotFormatError, rf"{re.escape(DATA)} is missing")


def test_missing_video(ds, tmp_path):
    (ds / VIDEO).unlink()
    assert_refused(
        ds, tmp_path, (LeRobotFormatError, VideoError), rf"{re.escape(VIDEO)} is missing"
    )


def test_missing_tasks_parquet(ds, tmp_path):
    (ds / "meta/tasks.parquet").unlink()
    assert_refused(ds, tmp_path, LeRobotFormatError, r"meta/tasks\.parquet is missing")


# --------------------------------------------------------------------------- 4. no footer
def test_footerless_data_parquet(ds, tmp_path):
    strip_footer(ds / DATA)
    assert_refused(
        ds, tmp_path, LeRobotFormatError, rf"{re.escape(DATA)} has no Parquet footer.*not finalized"
    )


def test_footerless_episodes_parquet(ds, tmp_path):
    strip_footer(ds / EPISODES)
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        rf"{re.escape(EPISODES)} has no Parquet footer.*not finalized",
    )


def test_parquet_that_is_not_parquet(ds, tmp_path):
    (ds / DATA).write_bytes(b"this is not a parquet file at all")
    assert_refused(ds, tmp_path, LeRobotFormatError, rf"{re.escape(DATA)} is not a Parquet file")


def test_no_episodes_folder_means_never_finalized(ds, tmp_path):
    shutil.rmtree(ds / "meta/episodes")
    assert_refused(ds, tmp_path, LeRobotFormatError, r"meta/episodes/.*never finalized")


def test_lerobot_killed_mid_recording(ds, tmp_path):
    """What a SIGKILLed LeRobot recorder leaves: footerless data, no episodes table."""
    strip_footer(ds / DATA)
    shutil.rmtree(ds / "meta/episodes")
    assert_refused(ds, tmp_path, LeRobotFormatError, r"never finalized")


# --------------------------------------------------------------------------- 5. videos
@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_truncated_video(ds, tmp_path, keep):
    path = ds / VIDEO
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert_refused(
        ds, tmp_path, (VideoError, LeRobotFormatError), rf"{re.escape(VIDEO)} .*truncated"
    )


def test_video_with_fewer_frames_than_the_episodes(ds, tmp_path):
    (ds / VIDEO).unlink()
    encode_video(ds / VIDEO, scene(sum(LENGTHS) - 4), fps=FPS)
    assert_refused(
        ds,
        tmp_path,
        (VideoError, LeRobotFormatError),
        rf"episode 2, feature 'cam': .*{re.escape(VIDEO)} is truncated or too short",
    )


def test_video_at_another_frame_rate(ds, tmp_path):
    (ds / VIDEO).unlink()
    encode_video(ds / VIDEO, scene(sum(LENGTHS)), fps=2 * FPS)
    assert_refused(
        ds,
        tmp_path,
        (VideoError, LeRobotFormatError),
        rf"{re.escape(VIDEO)} runs at 20 fps, not the 10 fps",
    )


def test_video_that_is_not_a_video(ds, tmp_path):
    (ds / VIDEO).write_bytes(os.urandom(4000))
    assert_refused(ds, tmp_path, (VideoError, LeRobotFormatError), re.escape(VIDEO))


def test_video_frames_of_another_size_than_declared(ds, tmp_path):
    edit_info(ds, lambda info: info["features"][CAM].__setitem__("shape", [32, 48, 3]))
    assert_refused(
        ds,
        tmp_path,
        (LeRobotFormatError, VideoError),
        rf"{re.escape(VIDEO)} frames are \[48, 64, 3\], info\.json declares \[32, 48, 3\]"
        rf".*'{CAM}'",
    )


def test_camera_declared_channels_first_still_imports(ds, pristine, tmp_path):
    """LeRobot accepts ``[C, H, W]`` camera shapes (spec section 3): not an error."""
    edit_info(
        ds,
        lambda info: info["features"][CAM].update(
            shape=[3, H, W], names=["channels", "height", "width"]
        ),
    )
    import_lerobot(ds, tmp_path / "out.h5", progress=False)
    assert_store_holds(tmp_path / "out.h5", pristine[1])


# --------------------------------------------------------------------------- 6. shapes
def test_feature_shape_disagrees_with_the_data(ds, tmp_path):
    edit_info(ds, lambda info: info["features"]["observation.state"].__setitem__("shape", [4]))
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        rf"{re.escape(DATA)}: column 'observation\.state' has 3 values per frame, "
        r"the feature shape \[4\]",
    )


def test_feature_dtype_disagrees_with_the_data(ds, tmp_path):
    edit_info(ds, lambda info: info["features"]["action"].__setitem__("dtype", "int64"))
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        rf"{re.escape(DATA)}: column 'action' holds float32, info\.json declares int64",
    )


def test_feature_column_missing_from_the_data(ds, tmp_path):
    def add(info):
        info["features"] = {"gripper": {"dtype": "float32", "shape": [1]}, **info["features"]}

    edit_info(ds, add)
    assert_refused(
        ds, tmp_path, LeRobotFormatError, rf"{re.escape(DATA)} has no column for feature 'gripper'"
    )


# --------------------------------------------------------------------------- 7. episode table
def rewrite_episodes(root: Path, change: Callable[[object], object]) -> None:
    path = root / EPISODES
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def test_episode_index_gap(ds, tmp_path):
    def gap(table):
        i = table.schema.get_field_index("episode_index")
        return table.set_column(i, "episode_index", pa.array([0, 1, 3], pa.int64()))

    rewrite_episodes(ds, gap)
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        r"meta/episodes: episode indices must run 0\.\.2 in order, found 3 at position 2 "
        r"\(an episode index gap",
    )


def test_episode_rows_reordered(ds, tmp_path):
    rewrite_episodes(ds, lambda table: table.take([1, 0, 2]))
    assert_refused(ds, tmp_path, LeRobotFormatError, r"meta/episodes: .*found 1 at position 0")


def test_episode_length_disagrees_with_its_range(ds, tmp_path):
    def longer(table):
        i = table.schema.get_field_index("length")
        return table.set_column(i, "length", pa.array([5, 9, 6], pa.int64()))

    rewrite_episodes(ds, longer)
    assert_refused(
        ds, tmp_path, LeRobotFormatError, r"meta/episodes: episode row 1 has length 9 but"
    )


@pytest.mark.parametrize(("key", "extra"), [("total_episodes", 1), ("total_frames", 7)])
def test_info_totals_ahead_of_the_table(ds, tmp_path, key, extra):
    """A crashed LeRobot recording rewrites info.json before its tables reach disk."""
    edit_info(ds, lambda info: info.__setitem__(key, info[key] + extra))
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        r"meta/info\.json says \d+ episodes and \d+ frames, the episode table holds 3 and 19: "
        r"the recording was not finalized",
    )


# --------------------------------------------------------------------------- 8. hostile paths
def _decoy(tmp_path: Path, ds: Path, rel: str, name: str) -> Path:
    """A valid copy of ``rel`` outside the dataset: reading it would let the import succeed."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    shutil.copy(ds / rel, outside / name)
    return outside


@pytest.mark.parametrize("how", ["dotdot", "absolute", "dotdot-inside"])
def test_data_path_template_outside_the_root(ds, tmp_path, how):
    outside = _decoy(tmp_path, ds, DATA, "0.parquet")
    template = {
        "dotdot": "../../outside/{chunk_index}.parquet",
        "absolute": str(outside) + "/{chunk_index}.parquet",
        "dotdot-inside": "data/../../../outside/{chunk_index}.parquet",
    }[how]
    edit_info(ds, _set("data_path", template))
    digest = tree_digest(outside)
    info = assert_refused(
        ds,
        tmp_path,
        (LeRobotFormatError, UnsafePathError),
        r"'\.\.' segments are not allowed|absolute paths are not allowed",
    )
    assert "outside/0.parquet" in str(info.value)
    assert tree_digest(outside) == digest


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_video_path_template_outside_the_root(ds, tmp_path, how):
    outside = _decoy(tmp_path, ds, VIDEO, f"{CAM}.mp4")
    template = {
        "dotdot": "../../outside/{video_key}.mp4",
        "absolute": str(outside) + "/{video_key}.mp4",
    }[how]
    edit_info(ds, _set("video_path", template))
    assert_refused(
        ds,
        tmp_path,
        (LeRobotFormatError, UnsafePathError),
        r"'\.\.' segments are not allowed|absolute paths are not allowed",
    )


def test_path_template_with_unknown_placeholder(ds, tmp_path):
    edit_info(ds, _set("data_path", "data/{episode_chunk}/{nope}.parquet"))
    assert_refused(ds, tmp_path, LeRobotFormatError, r"info\.json data_path template .* cannot be")


def test_data_chunk_folder_symlinked_outside(ds, tmp_path):
    """A symlink inside the folder must not redirect a read outside it."""
    outside = _decoy(tmp_path, ds, DATA, "file-000.parquet")
    shutil.rmtree(ds / "data/chunk-000")
    (ds / "data/chunk-000").symlink_to(outside, target_is_directory=True)
    assert_refused(ds, tmp_path, (LeRobotFormatError, UnsafePathError), r"symlink")


# --------------------------------------------------------------------------- 9. feature specs
def test_feature_name_with_a_slash(ds, tmp_path):
    def rename(info):
        info["features"] = {
            ("act/ion" if k == "action" else k): v for k, v in info["features"].items()
        }

    edit_info(ds, rename)
    assert_refused(
        ds, tmp_path, LeRobotFormatError, r"meta/info\.json: feature name 'act/ion' .*contains '/'"
    )


@pytest.mark.parametrize("dtype", ["complex64", "float128", "tensor", None, 7])
def test_feature_with_unknown_dtype(ds, tmp_path, dtype):
    edit_info(ds, lambda info: info["features"]["action"].__setitem__("dtype", dtype))
    assert_refused(
        ds,
        tmp_path,
        LeRobotFormatError,
        rf"meta/info\.json: feature 'action' has unsupported dtype {re.escape(repr(dtype))}",
    )


@pytest.mark.parametrize("shape", [[], [0], [-3], [2.5], "3", None, [True]])
def test_feature_with_a_bad_shape(ds, tmp_path, shape):
    edit_info(ds, lambda info: info["features"]["action"].__setitem__("shape", shape))
    assert_refused(
        ds, tmp_path, LeRobotFormatError, r"meta/info\.json: feature 'action' shape must be"
    )


def test_camera_feature_with_two_axes(ds, tmp_path):
    edit_info(ds, lambda info: info["features"][CAM].__setitem__("shape", [H, W]))
    assert_refused(
        ds, tmp_path, LeRobotFormatError, rf"video feature '{CAM}' shape must have 3 axes"
    )


# --------------------------------------------------------------------------- Hub cache layout
def test_hub_cache_snapshot_of_symlinks_imports(pristine, tmp_path):
    """huggingface_hub lays a snapshot out as symlinks into the cache's blob store."""
    cache = tmp_path / "hub" / "datasets--me--ds"
    snapshot, blobs = cache / "snapshots" / ("0" * 40), cache / "blobs"
    blobs.mkdir(parents=True)
    for path in sorted(pristine[0].rglob("*")):
        rel = path.relative_to(pristine[0])
        if not path.is_file() or rel.parts[0] == "images":
            continue
        blob = blobs / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copy(path, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    import_lerobot(snapshot, tmp_path / "out.h5", progress=False)
    assert_store_holds(tmp_path / "out.h5", pristine[1])


# --------------------------------------------------------------------------- 10. the writer
@pytest.fixture
def recording(tmp_path):
    """A writer with two saved episodes, and those episodes' rows."""
    root = tmp_path / "rec"
    saved = [episode_rows(n, 10 + i) for i, n in enumerate((4, 6))]
    w = LeRobotWriter(root, fps=FPS, features=FEATURES)
    for rows in saved:
        w.add_episode(rows, task="pick")
    try:
        yield w, saved
    finally:
        w.close()


def assert_recording_intact(w: LeRobotWriter, saved, tmp_path: Path) -> None:
    """Saved episodes still import exactly, and the writer records a valid next episode."""
    dest = tmp_path / "check"
    dest.mkdir(exist_ok=True)
    import_lerobot(w.root, dest / "before.h5", progress=False)
    assert_store_holds(dest / "before.h5", saved, tasks=["pick"])
    assert not (w.root / "meta/rejected_episodes.json").exists()
    w.clear_episode_buffer()
    more = episode_rows(3, 99)
    assert w.add_episode(more, task="pick") == len(saved)
    import_lerobot(w.root, dest / "after.h5", progress=False)
    assert_store_holds(dest / "after.h5", [*saved, more], tasks=["pick"])


def _frame_with(**changes):
    frame = one_frame()
    for key, value in changes.items():
        if value is None:
            frame.pop(key)
        else:
            frame[key] = value
    return frame


BAD_FRAMES = {
    "wrong-shape": (
        _frame_with(**{"observation.state": np.zeros(4, np.float32)}),
        r"feature 'observation\.state' expects shape \[3\], got \[4\]",
    ),
    "wrong-rank": (
        _frame_with(**{"observation.state": np.zeros((1, 3), np.float32)}),
        r"feature 'observation\.state' expects shape \[3\], got \[1, 3\]",
    ),
    "object-array": (
        _frame_with(action=np.array(["a", "b"], dtype=object)),
        r"feature 'action' expects float32, got object",
    ),
    "missing-key": (_frame_with(action=None), r"missing \['action'\], unexpected \[\]"),
    "unexpected-key": (
        _frame_with(gripper=np.zeros(1, np.float32)),
        r"missing \[\], unexpected \['gripper'\]",
    ),
    "default-feature": (
        _frame_with(frame_index=np.int64(0)),
        r"unexpected \['frame_index'\] \(default features are filled in automatically\)",
    ),
    "camera-wrong-size": (
        _frame_with(cam=np.zeros((32, 32, 3), np.uint8)),
        r"feature 'cam' expects frames of shape \[48, 64, 3\]",
    ),
    "camera-float-above-1": (
        _frame_with(cam=np.full((H, W, 3), 2.0, np.float32)),
        r"feature 'cam': float frames must lie in \[0, 1\]",
    ),
    "camera-float-negative": (
        _frame_with(cam=np.full((H, W, 3), -0.5, np.float32)),
        r"feature 'cam': float frames must lie in \[0, 1\]",
    ),
    "camera-float-nan": (
        _frame_with(cam=np.full((H, W, 3), np.nan, np.float32)),
        r"feature 'cam': float frames must lie in \[0, 1\]",
    ),
    "camera-int16": (
        _frame_with(cam=np.zeros((H, W, 3), np.int16)),
        r"feature 'cam' expects uint8 \(or float in \[0, 1\]\) frames, got int16",
    ),
}


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_writer_refuses_a_bad_frame(recording, tmp_path, case):
    w, saved = recording
    frame, match = BAD_FRAMES[case]
    w.add_frame(one_frame(1), task="pick")  # a good frame of the episode in progress
    with pytest.raises(LeRobotFormatError, match=match):
        w.add_frame(frame, task="pick")
    assert w.pending_frames == 1  # the bad frame left no trace, the good one is kept
    assert_recording_intact(w, saved, tmp_path)


@pytest.mark.parametrize(
    "case", ["wrong-shape", "missing-key", "unexpected-key", "camera-wrong-size"]
)
def test_writer_refuses_a_bad_whole_episode(recording, tmp_path, case):
    w, saved = recording
    rows = episode_rows(3, 5)
    if case == "wrong-shape":
        rows["action"] = np.zeros((3, 5), np.float32)
        match = r"feature 'action' expects shape \[2\], got \[5\]"
    elif case == "missing-key":
        rows.pop("action")
        match = r"missing \['action'\]"
    elif case == "unexpected-key":
        rows["index"] = np.arange(3)
        match = r"unexpected \['index'\] \(default features"
    else:
        rows[CAM] = np.zeros((3, H + 2, W, 3), np.uint8)
        match = r"feature 'cam' expects frames of shape \[48, 64, 3\]"
    with pytest.raises(LeRobotFormatError, match=match):
        w.add_episode(rows, task="pick")
    assert w.pending_frames == 0
    assert_recording_intact(w, saved, tmp_path)


def test_writer_refuses_ints_for_a_float32_feature(recording, tmp_path):
    w, saved = recording
    frame = _frame_with(**{"observation.state": np.array([1, 2, 3])})
    try:
        with pytest.raises(LeRobotFormatError, match=r"'observation\.state' expects float32"):
            w.add_frame(frame, task="pick")
    finally:
        w.clear_episode_buffer()
    assert_recording_intact(w, saved, tmp_path)


def test_writer_refuses_floats_for_an_int_feature(tmp_path):
    features = {"count": {"dtype": "int64", "shape": [1]}}
    with LeRobotWriter(tmp_path / "ints", fps=FPS, features=features) as w:
        with pytest.raises(LeRobotFormatError, match=r"feature 'count' expects int64, got float64"):
            w.add_frame({"count": np.float64(1.5)}, task="t")
        assert w.pending_frames == 0


def test_writer_accepts_python_floats_for_float32(recording, tmp_path):
    w, saved = recording
    w.add_frame(
        {"observation.state": [0.1, 0.2, 0.3], "action": [1.5, -2.25], CAM: one_frame()[CAM]},
        task="pick",
    )
    assert w.save_episode() == 2
    import_lerobot(w.root, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        got = store.episode(2)
        np.testing.assert_array_equal(
            got["observation.state"].numpy(), np.array([[0.1, 0.2, 0.3]], np.float32)
        )
        np.testing.assert_array_equal(got["action"].numpy(), np.array([[1.5, -2.25]], np.float32))


def test_writer_save_with_no_frames(recording, tmp_path):
    w, saved = recording
    with pytest.raises(EpisodeError, match=r"save_episode\(\) with no frames added"):
        w.save_episode(task="pick")
    assert_recording_intact(w, saved, tmp_path)


def test_writer_add_episode_with_no_frames(recording, tmp_path):
    w, saved = recording
    rows = {k: v[:0] for k, v in episode_rows(2, 1).items()}
    with pytest.raises(EpisodeError, match=r"an episode needs at least one frame"):
        w.add_episode(rows, task="pick")
    assert_recording_intact(w, saved, tmp_path)


def test_writer_frames_without_any_task(recording, tmp_path):
    w, saved = recording
    w.add_frame(one_frame(2))
    with pytest.raises(LeRobotFormatError, match=r"frames without a task"):
        w.save_episode()
    # the frames stay pending, so the caller can still name the task
    assert w.pending_frames == 1
    assert w.save_episode(task="pick") == 2
    import_lerobot(w.root, tmp_path / "out.h5", progress=False)
    with TrajectoryStore(tmp_path / "out.h5") as store:
        assert store.num_episodes == 3
        np.testing.assert_array_equal(store.episode(2)["task_index"].numpy(), [0])


@pytest.mark.parametrize("task", [3, b"pick", ["pick"]])
def test_writer_task_not_a_string(recording, tmp_path, task):
    w, saved = recording
    with pytest.raises(LeRobotFormatError, match=r"task must be a string"):
        w.add_frame(one_frame(), task=task)
    assert w.pending_frames == 0
    assert_recording_intact(w, saved, tmp_path)


@pytest.mark.parametrize("fps", [10.0, 29.97, "10", 0, -1, True, None])
def test_writer_non_int_fps(tmp_path, fps):
    root = tmp_path / "new"
    with pytest.raises(
        LeRobotFormatError, match=r"fps \(.*\) must be an int >= 1 \(LeRobot stores an int\)"
    ):
        LeRobotWriter(root, fps=fps, features=FEATURES)
    assert not root.exists()


def test_writer_refusals_before_overwrite_keep_the_existing_dataset(recording, tmp_path):
    """overwrite=True with bad arguments must refuse before deleting anything."""
    w, saved = recording
    for kwargs in (
        {"fps": 12.5, "features": FEATURES},
        {"fps": FPS, "features": {"a/b": {"dtype": "float32", "shape": [1]}}},
        {"fps": FPS, "features": {"frame_index": {"dtype": "int64", "shape": [1]}}},
        {"fps": FPS, "features": {"x": {"dtype": "complex64", "shape": [1]}}},
        {"fps": FPS, "features": {}},
    ):
        with pytest.raises(LeRobotFormatError):
            LeRobotWriter(w.root, overwrite=True, **kwargs)
    assert_recording_intact(w, saved, tmp_path)


@pytest.mark.parametrize(
    ("features", "match"),
    [
        ({"frame_index": {"dtype": "int64", "shape": [1]}}, r"'frame_index' is one of LeRobot's"),
        ({"a/b": {"dtype": "float32", "shape": [1]}}, r"feature name 'a/b' .*contains '/'"),
        ({"x": {"dtype": "float8", "shape": [1]}}, r"feature 'x' has unsupported dtype"),
        ({"x": {"dtype": "float32", "shape": [0]}}, r"feature 'x' shape must be"),
        ({"c": {"dtype": "video", "shape": [H, W]}}, r"video feature 'c' shape must have 3 axes"),
    ],
)
def test_writer_refuses_bad_features(tmp_path, features, match):
    root = tmp_path / "new"
    with pytest.raises(LeRobotFormatError, match=match):
        LeRobotWriter(root, fps=FPS, features=features)
    assert not root.exists()


@pytest.mark.parametrize("name", ["..", "."])
def test_writer_refuses_a_feature_name_that_is_a_path_segment(tmp_path, name):
    root = tmp_path / "new"
    features = {name: {"dtype": "video", "shape": [H, W, 3]}}
    try:
        with pytest.raises(LeRobotFormatError, match=re.escape(repr(name))):
            w = LeRobotWriter(root, fps=FPS, features=features)
            try:
                w.add_episode({name: scene(2)}, task="t")
            finally:
                w.close()
    finally:
        strays = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*.mp4")
            if p.relative_to(root).parts[0] != "videos"
        )
        assert strays == [], f"video files outside videos/: {strays}"


@pytest.mark.parametrize("index", [2, 99, -1, True, 1.0, "0"])
def test_writer_reject_a_nonexistent_episode(recording, tmp_path, index):
    w, saved = recording
    with pytest.raises(EpisodeError, match=r"episode .* does not exist \(2 saved\)"):
        w.reject_episode(index, "bad grasp")
    assert_recording_intact(w, saved, tmp_path)


@pytest.mark.parametrize("reason", ["", "   ", None, 3])
def test_writer_reject_without_a_reason(recording, tmp_path, reason):
    w, saved = recording
    with pytest.raises(LeRobotFormatError, match=r"reject_episode needs a non-empty reason"):
        w.reject_episode(0, reason)
    assert_recording_intact(w, saved, tmp_path)


def test_writer_calls_after_close(recording, tmp_path):
    w, saved = recording
    w.close()
    with pytest.raises(EpisodeError, match=r"is closed"):
        w.add_frame(one_frame(), task="pick")
    with pytest.raises(EpisodeError, match=r"is closed"):
        w.add_episode(episode_rows(2, 3), task="pick")
    import_lerobot(w.root, tmp_path / "out.h5", progress=False)
    assert_store_holds(tmp_path / "out.h5", saved, tasks=["pick"])


def test_second_writer_on_a_recording_folder_is_refused(recording, tmp_path):
    w, saved = recording
    with pytest.raises(LeRobotFormatError, match=r"another LeRobotWriter is recording"):
        LeRobotWriter.resume(w.root)
    assert_recording_intact(w, saved, tmp_path)


def test_overwrite_of_a_folder_another_writer_is_recording(recording, tmp_path):
    w, saved = recording
    other = None
    try:
        with pytest.raises(LeRobotFormatError, match=r"another LeRobotWriter is recording"):
            other = LeRobotWriter(w.root, fps=FPS, features=FEATURES, overwrite=True)
    finally:
        if other is not None:
            other.close()
    assert_recording_intact(w, saved, tmp_path)


# --------------------------------------------------------------------------- v2.1 import
V21_CAM = "observation.images.front"
V21_LENGTHS = (6, 7, 5)
V21_TASKS = ["pick", "place"]
V21_FRAME_TASKS = ([0] * 6, [1] * 7, [0, 0, 0, 1, 1])  # episode 2 changes task midway


def _v21_features() -> dict:
    scalar = {"shape": [1], "names": None}
    return {
        "observation.state": {
            "dtype": "float32",
            "shape": [3],
            "names": {"motors": ["a", "b", "c"]},  # the older dict form
        },
        "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
        V21_CAM: {
            "dtype": "video",
            "shape": [H, W, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.fps": 10.0,
                "video.height": H,
                "video.width": W,
                "video.channels": 3,
                "video.codec": "av1",
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "has_audio": False,
            },
        },
        "timestamp": {"dtype": "float32", **scalar},
        "frame_index": {"dtype": "int64", **scalar},
        "episode_index": {"dtype": "int64", **scalar},
        "index": {"dtype": "int64", **scalar},
        "task_index": {"dtype": "int64", **scalar},
    }


def _vector(values: np.ndarray, *, variable: bool):
    """Rows ``[n, k]`` as ``fixed_size_list<T>[k]`` or (other writers) a variable ``list<T>``."""
    flat = pa.array(values.reshape(-1))
    k = values.shape[1]
    if variable:
        offsets = pa.array(np.arange(len(values) + 1, dtype=np.int32) * k)
        return pa.ListArray.from_arrays(offsets, flat)
    return pa.FixedSizeListArray.from_arrays(flat, k)


def _list_of_one(values: np.ndarray):
    return _vector(values.reshape(-1, 1), variable=True)


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _stats(values: np.ndarray) -> dict:
    x = values.reshape(len(values), -1).astype(np.float64)
    return {
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "count": [len(x)],
    }


def make_v21(root: Path) -> list[dict[str, np.ndarray]]:
    """A LeRobot v2.1 folder (one parquet and one mp4 per episode), as lerobot <= 0.3 wrote it.

    Episode 0 uses lerobot's own encodings (fixed_size_list vectors, plain scalars, the
    ``huggingface`` metadata in its datasets-3.x ``Sequence`` spelling); episode 1 stores
    ``observation.state`` as a variable ``list<float>`` and ``timestamp``/``task_index`` as
    lists of one; episode 2 stores ``action`` as a variable list.
    """
    (root / "meta").mkdir(parents=True)
    info = {
        "codebase_version": "v2.1",
        "robot_type": "so100",
        "total_episodes": len(V21_LENGTHS),
        "total_frames": sum(V21_LENGTHS),
        "total_tasks": len(V21_TASKS),
        "total_videos": len(V21_LENGTHS),
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(V21_LENGTHS)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": (
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        ),
        "features": _v21_features(),
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    _jsonl(
        root / "meta/tasks.jsonl", [{"task_index": i, "task": t} for i, t in enumerate(V21_TASKS)]
    )
    hf_meta = json.dumps(
        {
            "info": {
                "features": {
                    "observation.state": {
                        "feature": {"dtype": "float32", "_type": "Value"},
                        "length": 3,
                        "_type": "Sequence",
                    },
                    "action": {
                        "feature": {"dtype": "float32", "_type": "Value"},
                        "length": 2,
                        "_type": "Sequence",
                    },
                }
            }
        }
    ).encode()
    episodes, ep_rows, ep_stats, start = [], [], [], 0
    for e, n in enumerate(V21_LENGTHS):
        rows = episode_rows(n, 40 + e)
        frame_index = np.arange(n, dtype=np.int64)
        rows.update(
            timestamp=(frame_index / FPS).astype(np.float32),
            frame_index=frame_index,
            episode_index=np.full(n, e, np.int64),
            index=np.arange(start, start + n, dtype=np.int64),
            task_index=np.array(V21_FRAME_TASKS[e], np.int64),
        )
        columns = {
            "observation.state": _vector(rows["observation.state"], variable=e == 1),
            "action": _vector(rows["action"], variable=e == 2),
            "timestamp": _list_of_one(rows["timestamp"]) if e == 1 else pa.array(rows["timestamp"]),
        }
        for name in ("frame_index", "episode_index", "index"):
            columns[name] = pa.array(rows[name])
        columns["task_index"] = (
            _list_of_one(rows["task_index"]) if e == 1 else pa.array(rows["task_index"])
        )
        table = pa.table(columns)
        if e == 0:
            table = table.replace_schema_metadata({b"huggingface": hf_meta})
        data = root / f"data/chunk-000/episode_{e:06d}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, data)
        video = root / f"videos/chunk-000/{V21_CAM}/episode_{e:06d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        encode_video(video, rows[CAM], fps=FPS)
        tasks = [V21_TASKS[t] for t in dict.fromkeys(V21_FRAME_TASKS[e])]
        ep_rows.append({"episode_index": e, "tasks": tasks, "length": n})
        ep_stats.append(
            {
                "episode_index": e,
                "stats": {k: _stats(rows[k]) for k in rows if k != CAM},
            }
        )
        episodes.append(rows)
        start += n
    _jsonl(root / "meta/episodes.jsonl", ep_rows)
    _jsonl(root / "meta/episodes_stats.jsonl", ep_stats)
    return episodes


@pytest.fixture(scope="module")
def v21(tmp_path_factory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("v21") / "ds"
    return root, make_v21(root)


@pytest.fixture
def v21_copy(v21, tmp_path) -> Path:
    root = tmp_path / "src" / "v21"
    shutil.copytree(v21[0], root)
    return root


def test_v21_imports(v21_copy, v21, tmp_path):
    before = tree_digest(v21_copy)
    summary = import_lerobot(v21_copy, tmp_path / "out.h5", progress=False)
    assert (summary.episodes, summary.frames) == (len(V21_LENGTHS), sum(V21_LENGTHS))
    assert tree_digest(v21_copy) == before
    episodes = v21[1]
    with TrajectoryStore(tmp_path / "out.h5") as store:
        lerobot = store.manifest.metadata["lerobot"]
        assert lerobot["codebase_version"] == "v2.1"
        assert lerobot["tasks"] == V21_TASKS
        assert lerobot["fps"] == FPS
        assert store.num_episodes == len(V21_LENGTHS)
        assert [int(n) for n in store.episodes.lengths] == list(V21_LENGTHS)
        for e, want in enumerate(episodes):
            got = store.episode(e)
            for name in (*NUMERIC, "timestamp", "frame_index", "episode_index"):
                np.testing.assert_array_equal(got[name].numpy(), want[name], err_msg=f"{e} {name}")
                assert got[name].numpy().dtype == want[name].dtype, name
            assert "index" not in got.keys()
            assert store.episode_metadata(e)["dataset_from_index"] == want["index"][0]
            np.testing.assert_array_equal(got["task_index"].numpy(), V21_FRAME_TASKS[e])
            assert_video_close(got[V21_CAM].numpy(), want[CAM])
            meta = store.episode_metadata(e)
            assert meta["lerobot_episode_index"] == e
            assert meta["tasks"] == [V21_TASKS[t] for t in dict.fromkeys(V21_FRAME_TASKS[e])]
        column = {c.name: c for c in store.columns}
        assert tuple(column["observation.state"].shape) == (3,)
        assert tuple(column["task_index"].shape) == ()
        assert tuple(column[V21_CAM].shape) == (H, W, 3)


@pytest.mark.parametrize(
    ("missing", "errors", "match"),
    [
        ("meta/episodes.jsonl", LeRobotFormatError, r"meta/episodes\.jsonl is missing"),
        ("meta/tasks.jsonl", LeRobotFormatError, r"meta/tasks\.jsonl is missing"),
        (
            "data/chunk-000/episode_000001.parquet",
            LeRobotFormatError,
            r"data/chunk-000/episode_000001\.parquet is missing",
        ),
        (
            f"videos/chunk-000/{V21_CAM}/episode_000002.mp4",
            (LeRobotFormatError, VideoError),
            rf"videos/chunk-000/{re.escape(V21_CAM)}/episode_000002\.mp4 is missing",
        ),
    ],
)
def test_v21_missing_file(v21_copy, tmp_path, missing, errors, match):
    (v21_copy / missing).unlink()
    assert_refused(v21_copy, tmp_path, errors, match)


def test_v21_episode_lines_with_a_gap(v21_copy, tmp_path):
    path = v21_copy / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[2]["episode_index"] = 3
    _jsonl(path, rows)
    assert_refused(
        v21_copy, tmp_path, LeRobotFormatError, r"meta/episodes\.jsonl: .*found 3 at position 2"
    )


def test_v21_episode_line_not_json(v21_copy, tmp_path):
    path = v21_copy / "meta/episodes.jsonl"
    path.write_text(path.read_text() + "{oops\n")
    assert_refused(
        v21_copy, tmp_path, LeRobotFormatError, r"meta/episodes\.jsonl line 4 is not valid JSON"
    )
