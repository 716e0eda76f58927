"""The threaded episode encoder: same file as inline encoding, errors reach the caller."""

from __future__ import annotations

import numpy as np
import pytest

from torchstore.errors import VideoError
from torchstore.io.frames.background_encoder import BackgroundVideoEncoder
from torchstore.io.frames.video import VideoFrameReader, encode_video, probe_video


def frames(n: int) -> np.ndarray:
    out = np.zeros((n, 48, 64, 3), np.uint8)
    out[..., 0] = np.linspace(0, 255, 64, dtype=np.uint8)[None, None]
    for k in range(n):
        out[k, 10:20, 3 * k : 3 * k + 10] = 220
    return out


def test_threaded_encode_equals_inline_and_copies_the_callers_buffer(tmp_path):
    want = frames(12)
    encoder = BackgroundVideoEncoder(
        tmp_path / "bg.mp4", fps=10, width=64, height=48, max_pending=2
    )
    buffer = np.empty_like(want[0])
    for frame in want:
        buffer[:] = frame  # the recorder reuses one buffer, as camera drivers do
        encoder.add(buffer)
    buffer[:] = 0
    assert encoder.close() == 12
    encode_video(tmp_path / "inline.mp4", want, fps=10)
    assert probe_video(tmp_path / "bg.mp4").frames == 12
    with (
        VideoFrameReader(tmp_path / "bg.mp4", fps=10) as a,
        VideoFrameReader(tmp_path / "inline.mp4", fps=10) as b,
    ):
        np.testing.assert_array_equal(a.read(0.0, 12), b.read(0.0, 12))


def test_bad_frames_and_abort(tmp_path):
    encoder = BackgroundVideoEncoder(tmp_path / "x.mp4", fps=10, width=64, height=48)
    with pytest.raises(VideoError, match=r"uint8 \[48, 64, 3\]"):
        encoder.add(np.zeros((48, 64), np.uint8))
    encoder.add(frames(1)[0])
    encoder.abort()
    assert not (tmp_path / "x.mp4").exists()
    with pytest.raises(VideoError, match="after close"):
        encoder.add(frames(1)[0])


def test_a_worker_error_is_raised_to_the_recorder(tmp_path, monkeypatch):
    encoder = BackgroundVideoEncoder(tmp_path / "y.mp4", fps=10, width=64, height=48)

    def broken(frame):
        raise RuntimeError("codec exploded")

    monkeypatch.setattr(encoder._encoder, "add", broken)
    encoder.add(frames(1)[0])
    with pytest.raises(VideoError, match="codec exploded"):
        encoder.close()
    assert not (tmp_path / "y.mp4").exists()
