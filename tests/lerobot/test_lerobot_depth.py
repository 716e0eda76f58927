"""Depth-map videos written the way lerobot 0.6 writes them import as depth in metres."""

from __future__ import annotations

import json
import math

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torchstore.data import TrajectoryStore
from torchstore.errors import LeRobotFormatError
from torchstore.io.frames.video import concat_videos
from torchstore.lerobot import LeRobotWriter, export_lerobot, import_lerobot
from torchstore.lerobot.layout import VIDEO_PATH

KEY = "observation.images.depth"
H, W, FPS = 48, 64, 10  # x265 needs frames of at least 64 wide
CODING = {
    "video.depth_min": 0.01,
    "video.depth_max": 10.0,
    "video.shift": 3.5,
    "video.use_log": True,
}


def quantize(depth_m: np.ndarray) -> np.ndarray:
    """lerobot 0.6's log quantisation to 12-bit codes, written out."""
    low = math.log(CODING["video.depth_min"] + CODING["video.shift"])
    high = math.log(CODING["video.depth_max"] + CODING["video.shift"])
    norm = (np.log(depth_m + CODING["video.shift"]) - low) / (high - low)
    return np.rint(norm * 4095).clip(0, 4095).astype(np.uint16)


def encode_gray12(path, codes: np.ndarray) -> None:
    """Lossless HEVC in gray12le, as lerobot's default depth encoder."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = W, H, "gray12le"
        stream.options = {"x265-params": "lossless=1:log-level=none"}
        for frame in codes:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="gray12le")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def depth_dataset(root, tmp_path, info_extra=None) -> list[np.ndarray]:
    """A numbers dataset, then a depth camera added as lerobot 0.6 lays it out."""
    lengths = (4, 3)
    with LeRobotWriter(
        root, fps=FPS, features={"x": {"dtype": "float32", "shape": [1], "names": None}}
    ) as w:
        for n in lengths:
            w.add_episode({"x": np.zeros(n, np.float32)}, task="look")
    rng = np.random.default_rng(0)
    depths, parts = [], []
    for e, n in enumerate(lengths):
        depth = rng.uniform(0.2, 4.0, (n, H, W)).astype(np.float32)
        depths.append(depth)
        parts.append(tmp_path / f"ep{e}.mp4")
        encode_gray12(parts[-1], quantize(depth))
    target = root / VIDEO_PATH.format(video_key=KEY, chunk_index=0, file_index=0)
    target.parent.mkdir(parents=True)
    spans = concat_videos(parts, target)
    meta = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(meta)
    for name, values, typ in (
        ("chunk_index", [0, 0], pa.int64()),
        ("file_index", [0, 0], pa.int64()),
        ("from_timestamp", [a for a, _ in spans], pa.float64()),
        ("to_timestamp", [b for _, b in spans], pa.float64()),
    ):
        table = table.append_column(f"videos/{KEY}/{name}", pa.array(values, typ))
    pq.write_table(table, meta)
    info = json.loads((root / "meta/info.json").read_text())
    info["video_path"] = VIDEO_PATH
    info["features"][KEY] = {
        "dtype": "video",
        "shape": [H, W, 1],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": H,
            "video.width": W,
            "video.codec": "hevc",
            "video.pix_fmt": "gray12le",
            "video.fps": FPS,
            "video.channels": 1,
            "has_audio": False,
            "is_depth_map": True,
            "depth_unit": "m",
            **CODING,
            **(info_extra or {}),
        },
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return depths


def test_depth_video_imports_as_metres_not_rgb(tmp_path):
    root = tmp_path / "ds"
    depths = depth_dataset(root, tmp_path)
    import_lerobot(root, tmp_path / "a.h5", progress=False)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        spec = store.column(KEY)
        assert (str(spec.dtype), spec.shape) == ("torch.float32", (H, W, 1))
        for e, want in enumerate(depths):
            got = store.episode(e)[KEY].numpy()[..., 0]
            # 12-bit log codes over 0.01..10 m: a step is 0.033 % of (depth + shift)
            assert (np.abs(got - want) <= (want + 3.5) * 1.7e-4).all()
            assert np.abs(quantize(got).astype(int) - quantize(want)).max() == 0  # the same codes
    export_lerobot(tmp_path / "a.h5", tmp_path / "back", progress=False)  # depth left out
    assert KEY not in json.loads((tmp_path / "back/meta/info.json").read_text())["features"]


def test_depth_without_its_coding_is_refused(tmp_path):
    root = tmp_path / "ds"
    depth_dataset(root, tmp_path, {"video.depth_max": None})
    with pytest.raises(
        LeRobotFormatError, match=r"depth feature 'observation.images.depth'.*video.depth_max"
    ):
        import_lerobot(root, tmp_path / "a.h5", progress=False)
    assert not (tmp_path / "a.h5").exists()
