"""MP4 episodes: encode, probe, append by stream copy, and frame-accurate reads back."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

av = pytest.importorskip("av")

from torchstore.errors import VideoError  # noqa: E402
from torchstore.io.frames.video import (  # noqa: E402
    EncoderSettings,
    EpisodeVideoEncoder,
    VideoFrameReader,
    append_video,
    concat_videos,
    encode_video,
    probe_video,
)

FPS = 10
LENGTHS = (10, 15, 8)  # three episodes -> 33 frames, spans (0, 1), (1, 2.5), (2.5, 3.3)
SPANS = [(0.0, 1.0), (1.0, 2.5), (2.5, 3.3)]
CODECS = {"av1": EncoderSettings(), "h264": EncoderSettings.h264()}


def scene(n: int, height: int, width: int, *, start: int = 0) -> np.ndarray:
    """Deterministic frames: smooth colour gradients and a red square moving across them."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((n, height, width, 3), np.uint8)
    for i in range(n):
        t = start + i
        img = np.stack(
            [
                x / width * 200 + 2 * t,
                y / height * 180 + 30,
                (x + y) / (width + height) * 160 + 40 + t,
            ],
            axis=-1,
        )
        side = 12
        r, c = (3 * t) % (height - side), (5 * t) % (width - side)
        img[r : r + side, c : c + side] = (240, 40, 40)
        frames[i] = np.clip(img, 0, 255).astype(np.uint8)
    return frames


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


def read_all(path, n: int, *, fps: int = FPS) -> np.ndarray:
    with VideoFrameReader(path, fps=fps) as reader:
        return reader.read(0.0, n)


@pytest.fixture(scope="module", params=sorted(CODECS))
def appended(request, tmp_path_factory):
    """Three episodes of one codec appended into one file: (codec, episode paths, file, spans)."""
    root = tmp_path_factory.mktemp(f"append-{request.param}")
    settings = CODECS[request.param]
    current, spans, episodes = None, [], []
    for e, n in enumerate(LENGTHS):
        episode = root / f"episode-{e}.mp4"
        encode_video(episode, scene(n, 48, 64, start=100 * e), fps=FPS, settings=settings)
        out = root / f"file-{e}.mp4"
        spans.append(append_video(current, episode, out))
        current = out
        episodes.append(episode)
    return request.param, episodes, current, spans


# --------------------------------------------------------------------------- encode + decode


# Measured on this scene (96x96, 30 frames): AV1 defaults MAE 2.12, PSNR 33.3 dB;
# H.264 crf 23 MAE 1.73, PSNR 35.7 dB. Bounds leave margin for other CPUs and versions.
@pytest.mark.parametrize(("name", "max_mae", "min_psnr"), [("av1", 3.0, 31.0), ("h264", 2.5, 33.0)])
def test_frames_decode_back_within_tolerance(tmp_path, name, max_mae, min_psnr):
    frames = scene(30, 96, 96)
    info = encode_video(tmp_path / "e.mp4", frames, fps=FPS, settings=CODECS[name])
    back = read_all(tmp_path / "e.mp4", 30)
    assert info.codec == name and back.shape == frames.shape and back.dtype == np.uint8
    assert np.abs(back.astype(int) - frames).mean() <= max_mae
    assert psnr(back, frames) >= min_psnr


def test_encoder_takes_torch_tensors(tmp_path):
    frames = torch.from_numpy(scene(4, 48, 64))
    assert encode_video(tmp_path / "t.mp4", frames, fps=FPS).frames == 4


@pytest.mark.parametrize(("fps", "time_base"), [(10, Fraction(1, 10240)), (30, Fraction(1, 15360))])
def test_probe_reports_stream_facts_and_exact_frame_times(tmp_path, fps, time_base):
    path = tmp_path / "p.mp4"
    info = encode_video(path, scene(12, 48, 64), fps=fps)
    assert (info.codec, info.width, info.height, info.pix_fmt) == ("av1", 64, 48, "yuv420p")
    assert (info.fps, info.frames, info.has_audio) == (fps, 12, False)
    assert info.duration_s == pytest.approx(12 / fps, abs=1e-12)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.time_base == time_base  # the mp4 muxer doubles 1/fps until >= 10000
        packets = sorted((p for p in container.demux(stream) if p.size), key=lambda p: p.pts)
    assert [p.pts * p.time_base for p in packets] == [Fraction(i, fps) for i in range(12)]
    assert packets[0].is_keyframe


def test_lerobot_info_has_stream_facts_and_encoder_settings(tmp_path):
    from torchstore.lerobot.info import video_feature_info

    info = encode_video(tmp_path / "i.mp4", scene(3, 48, 64), fps=FPS)
    assert info.channels == 3
    assert video_feature_info(info) == {
        "video.height": 48,
        "video.width": 64,
        "video.codec": "av1",
        "video.pix_fmt": "yuv420p",
        "video.fps": 10,
        "video.channels": 3,
        "has_audio": False,
    }
    extra = video_feature_info(info, encoder=EncoderSettings())
    assert extra["video.g"] == 2 and extra["video.crf"] == 30 and extra["video.preset"] == 12
    assert extra["video.fast_decode"] == 0 and extra["video.video_backend"] == "pyav"
    assert extra["video.extra_options"] == {} and extra["is_depth_map"] is False


# --------------------------------------------------------------------------- append


def test_append_returns_lerobot_timestamps(appended):
    _, _, path, spans = appended
    assert spans == SPANS
    info = probe_video(path)
    assert info.frames == 33 and info.duration_s == pytest.approx(3.3)


def test_appended_file_has_a_keyframe_at_each_episode_start(appended):
    _, _, path, _ = appended
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        keys = {p.pts * p.time_base for p in container.demux(stream) if p.size and p.is_keyframe}
    assert {Fraction(0), Fraction(1), Fraction(5, 2)} <= keys


def test_episodes_read_back_exactly_in_order_without_seeking(appended):
    _, episodes, path, spans = appended
    own = [read_all(ep, n) for ep, n in zip(episodes, LENGTHS)]
    with VideoFrameReader(path, fps=FPS) as reader:
        for frames, (start, _) in zip(own, spans):
            np.testing.assert_array_equal(reader.read(start, len(frames)), frames)
        assert reader.seeks == 0
        for frames, (start, _) in reversed(list(zip(own, spans))):
            np.testing.assert_array_equal(reader.read(start, len(frames)), frames)
        assert reader.seeks == 3


def test_forward_jump_over_a_second_seeks(appended):
    _, episodes, path, spans = appended
    with VideoFrameReader(path, fps=FPS) as reader:
        reader.read(0.0, 1)
        np.testing.assert_array_equal(reader.read(spans[2][0], 8), read_all(episodes[2], 8))
        assert reader.seeks == 1


def test_append_to_a_missing_file_starts_a_new_one(tmp_path):
    encode_video(tmp_path / "ep.mp4", scene(10, 48, 64), fps=FPS)
    assert append_video(tmp_path / "absent.mp4", tmp_path / "ep.mp4", tmp_path / "out.mp4") == (
        0.0,
        1.0,
    )
    assert probe_video(tmp_path / "out.mp4").frames == 10


def test_concat_gives_the_same_file_as_appending_one_by_one(appended, tmp_path):
    _, episodes, appended_file, spans = appended
    out = tmp_path / "all.mp4"
    assert concat_videos(episodes, out) == spans == SPANS
    n = sum(LENGTHS)
    np.testing.assert_array_equal(read_all(out, n), read_all(appended_file, n))


def test_concat_refuses_mismatched_streams_and_its_own_output(tmp_path):
    a, b = _episode(tmp_path, "a.mp4"), _episode(tmp_path, "b.mp4", size=(96, 96))
    with pytest.raises(VideoError, match="width differs"):
        concat_videos([a, b], tmp_path / "out.mp4")
    assert not (tmp_path / "out.mp4").exists()
    with pytest.raises(VideoError, match="must differ"):
        concat_videos([a, a], a)
    with pytest.raises(VideoError, match="at least one"):
        concat_videos([], tmp_path / "out.mp4")


def _episode(tmp_path, name, *, size=(48, 64), fps=FPS, settings=None):
    path = tmp_path / name
    encode_video(path, scene(5, *size), fps=fps, settings=settings)
    return path


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"settings": EncoderSettings.h264()}, "codec differs"),
        ({"size": (96, 96)}, "width differs"),
        ({"fps": 30}, "fps differs"),
        ({"settings": EncoderSettings(crf=45)}, None),  # same AV1 headers: appendable
    ],
)
def test_append_refuses_mismatched_streams(tmp_path, kwargs, match):
    current = _episode(tmp_path, "current.mp4")
    episode = _episode(tmp_path, "episode.mp4", **kwargs)
    out = tmp_path / "out.mp4"
    if match is None:
        assert append_video(current, episode, out) == (0.5, 1.0)
        return
    with pytest.raises(VideoError, match=match):
        append_video(current, episode, out)
    assert not out.exists()


def test_append_refuses_h264_encoded_with_other_settings(tmp_path):
    current = _episode(tmp_path, "current.mp4", settings=EncoderSettings.h264())
    other = EncoderSettings(codec="libx264", crf=40, preset=None)
    episode = _episode(tmp_path, "episode.mp4", settings=other)
    with pytest.raises(VideoError, match="stream headers differ"):
        append_video(current, episode, tmp_path / "out.mp4")


def test_append_refuses_writing_over_an_input(tmp_path):
    current = _episode(tmp_path, "current.mp4")
    episode = _episode(tmp_path, "episode.mp4")
    with pytest.raises(VideoError, match="must differ"):
        append_video(current, episode, current)
    with pytest.raises(VideoError, match="must differ"):
        append_video(None, episode, episode)


# --------------------------------------------------------------------------- broken files


@pytest.mark.parametrize("fraction", [0.5, 0.1])
def test_truncated_file_raises_video_error_naming_it(appended, tmp_path, fraction):
    _, _, path, _ = appended
    data = path.read_bytes()
    cut = tmp_path / f"cut-{fraction}.mp4"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(VideoError, match=f"cut-{fraction}.mp4.*(truncated|not a readable)"):
        probe_video(cut)
    with pytest.raises(VideoError, match=f"cut-{fraction}.mp4.*(truncated|not a readable)"):
        read_all(cut, 33)


def test_random_bytes_and_missing_files_raise_video_error(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(VideoError, match="junk.mp4 is not a readable video file"):
        probe_video(junk)
    with pytest.raises(VideoError, match="junk.mp4 is not a readable video file"):
        VideoFrameReader(junk, fps=FPS)
    with pytest.raises(VideoError, match="absent.mp4 is missing"):
        probe_video(tmp_path / "absent.mp4")
    with pytest.raises(VideoError, match="absent.mp4 is missing"):
        append_video(None, tmp_path / "absent.mp4", tmp_path / "out.mp4")


def test_reader_reports_a_gap_in_frame_times(tmp_path):
    path = tmp_path / "gap.mp4"
    frames = scene(8, 48, 64)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for frame, pts in zip(frames, (0, 1, 2, 5, 6, 7, 8, 9)):  # frames 3 and 4 dropped
            video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
            video_frame.pts = pts
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode(None))
    with VideoFrameReader(path, fps=FPS) as reader:
        assert reader.read(0.0, 3).shape == (3, 48, 64, 3)
        with pytest.raises(VideoError, match=r"gap: expected frame 3 \(0.3 s\), found frame 5"):
            reader.read(0.3, 2)
        assert reader.read(0.5, 5).shape[0] == 5  # seeks and reads on after the error


# --------------------------------------------------------------------------- reader arguments


def test_reader_refuses_times_off_the_frame_grid_and_past_the_end(appended):
    _, _, path, _ = appended
    with VideoFrameReader(path, fps=FPS) as reader:
        with pytest.raises(VideoError, match="not on the 10 fps frame grid"):
            reader.read(0.25, 1)
        with pytest.raises(VideoError, match="must be a time >= 0"):
            reader.read(-1.0, 1)
        with pytest.raises(VideoError, match="count"):
            reader.read(0.0, -1)
        with pytest.raises(VideoError, match="needs 2 frames, the file ends after 1"):
            reader.read(3.2, 2)
        assert reader.read(1.0 + 0.03, 2, tolerance_s=0.04).shape[0] == 2
        assert reader.read(1.0 + 1e-9, 0).shape == (0, 48, 64, 3)
    with pytest.raises(VideoError, match="closed"):
        reader.read(0.0, 1)


def test_reader_refuses_the_wrong_fps(appended):
    _, _, path, _ = appended
    with pytest.raises(VideoError, match="runs at 10 fps, not the 30 fps"):
        VideoFrameReader(path, fps=30)
    with pytest.raises(VideoError, match="fps"):
        VideoFrameReader(path, fps=0)


# --------------------------------------------------------------------------- encoder arguments


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (np.zeros((48, 64, 4), np.uint8), r"uint8\[48, 64, 3\].*got uint8\[48, 64, 4\]"),
        (np.zeros((48, 64, 3), np.float32), r"got float32\[48, 64, 3\]"),
        (np.zeros((3, 48, 64), np.uint8), r"got uint8\[3, 48, 64\]"),
        ([[0, 0, 0]], "numpy array or a torch tensor"),
    ],
)
def test_add_refuses_bad_frames(tmp_path, frame, match):
    with EpisodeVideoEncoder(tmp_path / "b.mp4", fps=FPS, width=64, height=48) as encoder:
        with pytest.raises(VideoError, match=match):
            encoder.add(frame)
        encoder.add(np.zeros((48, 64, 3), np.uint8))
    assert probe_video(tmp_path / "b.mp4").frames == 1


def test_abort_and_errors_delete_the_partial_file(tmp_path):
    path = tmp_path / "partial.mp4"
    encoder = EpisodeVideoEncoder(path, fps=FPS, width=64, height=48)
    for frame in scene(30, 48, 64):  # the file appears with the encoder's first packet
        encoder.add(frame)
    assert path.exists()
    encoder.abort()
    assert not path.exists()
    with pytest.raises(RuntimeError), EpisodeVideoEncoder(path, fps=FPS, width=64, height=48) as e:
        e.add(np.zeros((48, 64, 3), np.uint8))
        raise RuntimeError("recording failed")
    assert not path.exists()


def test_close_is_idempotent_and_refuses_an_empty_episode(tmp_path):
    encoder = EpisodeVideoEncoder(tmp_path / "c.mp4", fps=FPS, width=64, height=48)
    for frame in scene(3, 48, 64):
        encoder.add(frame)
    assert encoder.close() == 3 and encoder.close() == 3
    with pytest.raises(VideoError, match="closed"):
        encoder.add(np.zeros((48, 64, 3), np.uint8))
    empty = EpisodeVideoEncoder(tmp_path / "empty.mp4", fps=FPS, width=64, height=48)
    with pytest.raises(VideoError, match="no frames"):
        empty.close()
    assert not (tmp_path / "empty.mp4").exists()
    with pytest.raises(VideoError, match="non-empty"):
        encode_video(tmp_path / "none.mp4", np.zeros((0, 48, 64, 3), np.uint8), fps=FPS)


@pytest.mark.parametrize(
    ("size", "settings", "match"),
    [
        ((63, 48), None, "63x48 cannot be encoded as yuv420p.*must be even"),
        ((2, 2), None, "too small for libsvtav1"),
        ((0, 48), None, "width"),
        ((64, 48), EncoderSettings(crf=99), "libsvtav1 refused 64x48"),
        ((64, 48), EncoderSettings(codec="libx264", preset="bogus"), "libx264 refused"),
    ],
)
def test_encoder_refuses_sizes_and_settings_it_cannot_encode(tmp_path, size, settings, match):
    path = tmp_path / "s.mp4"
    with pytest.raises(VideoError, match=match):
        EpisodeVideoEncoder(path, fps=FPS, width=size[0], height=size[1], settings=settings)
    assert not path.exists()


def test_encoder_refuses_a_missing_folder(tmp_path):
    with pytest.raises(VideoError, match="absent/e.mp4: its folder does not exist"):
        EpisodeVideoEncoder(tmp_path / "absent" / "e.mp4", fps=FPS, width=64, height=48)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codec": "nope"}, r"'nope' is not an encoder.*available: libsvtav1, libx264"),
        ({"codec": "mp3"}, "'mp3' is not an encoder"),
        ({"codec": "libx264", "preset": 12}, "libx264 takes a named preset"),
        ({"pix_fmt": "yuv999"}, "not a pixel format"),
        ({"g": 0}, r"g \(0\) must be"),
        ({"crf": -1}, r"crf \(-1\) must be"),
        ({"fast_decode": None}, "fast_decode"),
    ],
)
def test_encoder_settings_are_validated(kwargs, match):
    with pytest.raises(VideoError, match=match):
        EncoderSettings(**kwargs)


def test_encoder_settings_by_short_name():
    assert EncoderSettings.named("av1") == EncoderSettings()
    assert EncoderSettings.named("h264") == EncoderSettings.h264()
    with pytest.raises(VideoError, match=r"video codec name \('vp9'\) must be one of av1, h264"):
        EncoderSettings.named("vp9")


def test_encoder_options_follow_lerobot():
    assert EncoderSettings().options() == {
        "g": "2",
        "crf": "30",
        "preset": "12",
        "svtav1-params": "lp=1",  # SVT's default threading deadlocked under load
    }
    assert EncoderSettings(svt_lp=None).options() == {"g": "2", "crf": "30", "preset": "12"}
    fast = EncoderSettings(fast_decode=1).options()
    assert fast["svtav1-params"] == "fast-decode=1:lp=1"
    assert EncoderSettings.h264().encoder == "libx264"
    assert EncoderSettings(codec="h264", preset="fast", fast_decode=1).options() == {
        "g": "2",
        "crf": "30",
        "preset": "fast",
        "tune": "fastdecode",
    }


def test_raw_luma_reads_high_bit_depth_codes_exactly(tmp_path):
    """Depth maps: gray12le codes come back as stored (uint16), not converted to RGB."""
    import av

    codes = [
        ((np.arange(48 * 64).reshape(48, 64) * 7 + 13 * i) % 4096).astype(np.uint16)
        for i in range(6)
    ]
    path = tmp_path / "depth.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "gray12le"
        stream.options = {"x265-params": "lossless=1:log-level=none"}
        for frame in codes:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="gray12le")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with VideoFrameReader(path, fps=FPS, raw_luma=True) as reader:
        got = reader.read(0.2, 3)
    assert got.dtype == np.uint16 and got.shape == (3, 48, 64, 1)
    np.testing.assert_array_equal(got[..., 0], np.stack(codes[2:5]))
