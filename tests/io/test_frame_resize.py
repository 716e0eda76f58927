"""Frames decoded at training resolution: every codec's resize against the source resized."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av")
pytest.importorskip("simplejpeg")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _camera_frames import camera_frames  # noqa: E402

from torchstore.errors import ArgumentError  # noqa: E402
from torchstore.io.frames.codec import FrameCodec, FrameDecoder, encode_frames  # noqa: E402
from torchstore.io.frames.resize import FrameResize, frame_resizes  # noqa: E402

H, W = 96, 128
# mean absolute error (8-bit levels) of a decode-and-resize against the source frames
# resized by Pillow: lossless kinds are exact; lossy ones carry their codec's loss (AV1 at
# LeRobot's crf 30, JPEG q90) plus the other resampler's rounding. A frame off by one, a
# swapped plane or a wrong crop is tens of levels away.
BOUND = {"raw": 0.0, "png": 0.0, "jpeg": 4.0, "av1": 5.0, "h264": 6.0}
CODECS = {
    "raw": FrameCodec("raw"),
    "png": FrameCodec("png"),
    "jpeg": FrameCodec("jpeg"),
    "av1": FrameCodec("av1", gop=4),
    "h264": FrameCodec("h264", gop=4),
}
RESIZES = [
    FrameResize(48, 64),
    FrameResize(40, 40, crop=(8, 24, 80, 80)),
    FrameResize(30, 50, interpolation="bilinear"),
]


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return camera_frames(12, H, W, seed=5)


@pytest.mark.parametrize("kind", sorted(CODECS))
@pytest.mark.parametrize("resize", RESIZES, ids=lambda r: f"{r.height}x{r.width}-{r.crop}")
def test_a_resized_decode_matches_the_source_resized(frames, kind, resize):
    encoded = encode_frames(CODECS[kind], frames)
    decoder = FrameDecoder(CODECS[kind], encoded.info, resize=resize)
    out = decoder.decode(encoded.packets, first=2)
    assert out.shape == (10, resize.height, resize.width, 3)
    assert decoder.frame_shape == (resize.height, resize.width, 3)
    reference = resize.apply(frames[2:])
    error = np.abs(out.astype(np.int16) - reference.astype(np.int16)).mean()
    assert error <= BOUND[kind], f"{kind}: {error:.2f} levels from the source"
    # another camera path's frames are far outside that bound: the check can fail
    other = resize.apply(camera_frames(10, H, W, seed=6))
    assert np.abs(out.astype(np.int16) - other.astype(np.int16)).mean() > 3 * BOUND[kind] + 5


def test_the_crop_comes_before_the_resize():
    frame = np.zeros((60, 80, 3), np.uint8)
    frame[10:30, 40:60] = 200  # the crop is exactly this square
    out = FrameResize(5, 5, crop=(10, 40, 20, 20)).apply(frame)
    assert out.shape == (5, 5, 3) and (out == 200).all()


def test_float_frames_resize_through_torch_in_their_dtype():
    frames = torch.rand(3, 32, 32, 3)
    out = FrameResize(16, 16).apply(frames)
    assert out.dtype == torch.float32 and out.shape == (3, 16, 16, 3)
    # area: each output pixel the mean of its 2x2 footprint
    expected = frames.reshape(3, 16, 2, 16, 2, 3).mean(dim=(2, 4))
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize(
    "value, message",
    [
        ([0, 10], "resize height"),
        ({"height": 10, "width": 10, "zoom": 2}, "unknown keys"),
        ({"height": 10, "width": 10, "interpolation": "lanczos9"}, "interpolation"),
        ("224", "must be"),
    ],
)
def test_a_bad_resize_is_refused_naming_what_is_wrong(value, message):
    with pytest.raises(ArgumentError, match=message):
        frame_resizes(value, {"cam": (48, 64, 3)})


def test_resizes_name_only_camera_columns_that_are_read():
    shapes = {"cam": (48, 64, 3), "wrist": (24, 24, 3), "state": (7,)}
    every = frame_resizes([16, 16], shapes)
    assert sorted(every) == ["cam", "wrist"]
    assert frame_resizes({"wrist": [8, 8]}, shapes) == {"wrist": FrameResize(8, 8)}
    with pytest.raises(ArgumentError, match="'state' holds \\[7\\] rows"):
        frame_resizes({"state": [8, 8]}, shapes)
    with pytest.raises(ArgumentError, match="'top' is not a column read here"):
        frame_resizes({"top": [8, 8]}, shapes)
    with pytest.raises(ArgumentError, match="does not fit its 24x24 frames"):
        frame_resizes({"wrist": {"height": 8, "width": 8, "crop": [0, 0, 30, 30]}}, shapes)
    with pytest.raises(ArgumentError, match="none of the columns"):
        frame_resizes([8, 8], {"state": (7,)})
