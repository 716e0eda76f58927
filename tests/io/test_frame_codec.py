"""Encoded image columns at the io level: frames to packets and back, runs, MP4s, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

av = pytest.importorskip("av")
pytest.importorskip("simplejpeg")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _camera_frames import camera_frames  # noqa: E402

from torchstore.errors import ArgumentError, FrameCodecError, VideoError  # noqa: E402
from torchstore.io.frames.codec import (  # noqa: E402
    FrameCodec,
    FrameDecoder,
    FrameEncoder,
    StreamInfo,
    check_image_bytes,
    decode_frames,
    encode_frames,
    packets_from_mp4,
    probe_image_bytes,
    write_mp4,
)
from torchstore.io.frames.video import EncoderSettings, concat_videos, encode_video  # noqa: E402

FPS = 30
H, W = 48, 64
# (max MAE, min PSNR dB) on these camera-like frames (a photograph panned and zoomed, mild
# sensor noise; small 48x64 crops code worse than camera sizes). Measured: jpeg q90 5.84 /
# 29.7, av1 GOP 8 5.19 / 30.1, h264 GOP 8 7.43 / 27.7. A decode off by a frame or a colour
# plane is far outside.
BOUNDS = {"jpeg": (7.0, 28.0), "av1": (6.5, 28.5), "h264": (9.0, 26.0)}
CODECS = {
    "raw": FrameCodec.raw(),
    "png": FrameCodec.png(),
    "jpeg": FrameCodec.jpeg(),
    "av1": FrameCodec.av1(gop=8),
    "h264": FrameCodec.h264(gop=8),
}


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return camera_frames(20, H, W, episode=1)


@pytest.fixture(scope="module")
def encoded(frames):
    return {name: encode_frames(codec, frames) for name, codec in CODECS.items()}


def decode_file(path) -> np.ndarray:
    """What PyAV itself decodes from an MP4, as LeRobot reads it."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def flipped(data: bytes) -> bytes:
    damaged = bytearray(data)
    for j in range(len(damaged) // 3, len(damaged)):
        damaged[j] ^= 0x5A
    return bytes(damaged)


# --------------------------------------------------------------------------- FrameCodec


def test_codec_defaults_json_round_trip_and_lossy():
    assert FrameCodec("av1") == FrameCodec.av1()
    assert (FrameCodec.av1().gop, FrameCodec.lerobot_av1().gop) == (32, 2)
    for codec in [*CODECS.values(), FrameCodec.lerobot_av1(), FrameCodec.jpeg(95, "yuv444p")]:
        assert FrameCodec.from_json(codec.to_json()) == codec
    assert [c.lossy for c in CODECS.values()] == [False, False, True, True, True]


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"kind": "hevc"}, "hevc"),
        ({"kind": "av1", "crf": 99}, "crf"),
        ({"kind": "png", "quality": 5}, "quality"),
        ({"kind": "h264", "preset": "fastest"}, "preset"),
        ({"kind": "jpeg", "pix_fmt": "yuv422p"}, "pix_fmt"),
        ({"kind": "av1", "gop": True}, "gop"),
    ],
)
def test_a_bad_kind_or_setting_is_named(settings, named):
    with pytest.raises(FrameCodecError, match=named):
        FrameCodec(**settings)


@pytest.mark.parametrize(
    "text, named",
    [('{"kind": "av1", "gopp": 3}', "gopp"), ("nope", "JSON"), ('{"crf": 3}', "kind")],
)
def test_from_json_refuses_what_it_cannot_read(text, named):
    with pytest.raises(FrameCodecError, match=named):
        FrameCodec.from_json(text)


def test_from_lerobot_info_reads_the_recorded_settings():
    info = {"video.codec": "av1", "video.pix_fmt": "yuv420p", "video.g": 2, "video.crf": 30}
    assert FrameCodec.from_lerobot_info(info) == FrameCodec.lerobot_av1()
    with pytest.raises(FrameCodecError, match="hevc"):
        FrameCodec.from_lerobot_info({"video.codec": "hevc"})


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(CODECS))
def test_round_trip(name, frames, encoded):
    enc = encoded[name]
    assert len(enc) == len(frames) and enc.keyframes[0]
    got = decode_frames(enc.codec, enc.info, enc.packets)
    assert got.shape == frames.shape and got.dtype == np.uint8
    if name in ("raw", "png"):
        np.testing.assert_array_equal(got, frames)
        return
    err = got.astype(np.float64) - frames
    mae, psnr = np.abs(err).mean(), 10 * np.log10(255**2 / (err**2).mean())
    max_mae, min_psnr = BOUNDS[name]
    assert mae <= max_mae and psnr >= min_psnr, (mae, psnr)
    assert enc.nbytes < frames.nbytes / 3  # measured: jpeg 25 %, av1 3.8 %, h264 2.4 % of raw


@pytest.mark.parametrize("name", ["av1", "h264"])
def test_video_packets_are_one_per_frame_with_keyframes_every_gop(name, encoded):
    enc = encoded[name]
    assert np.flatnonzero(enc.keyframes).tolist() == [0, 8, 16]
    assert enc.info.extradata and enc.info.pix_fmt == "yuv420p"


@pytest.mark.parametrize("name", list(CODECS))
def test_encoding_is_deterministic_and_chunking_does_not_matter(name, frames, encoded):
    streamed = FrameEncoder(CODECS[name], height=H, width=W)
    streamed.add(frames[0])  # one frame, then chunks, as a recorder writes
    streamed.add(frames[1:7])
    streamed.add(torch.from_numpy(frames[7:]))
    again = streamed.finish()
    assert [bytes(p) for p in again.packets] == [bytes(p) for p in encoded[name].packets]
    assert again.info == encoded[name].info


def test_one_channel_png_and_jpeg(frames):
    gray = frames[:4, :, :, :1].copy()
    png = encode_frames(FrameCodec.png(), gray)
    np.testing.assert_array_equal(decode_frames(png.codec, png.info, png.packets), gray)
    jpeg = encode_frames(FrameCodec.jpeg(), gray)
    assert np.abs(decode_frames(jpeg.codec, jpeg.info, jpeg.packets) - gray.astype(int)).mean() < 4


# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("name", list(CODECS))
def test_a_run_starting_mid_gop_decodes_the_same_frames(name, encoded):
    enc = encoded[name]
    whole = decode_frames(enc.codec, enc.info, enc.packets)
    packets, first = enc.packets_for(11, 19)
    if enc.codec.is_video:
        assert (len(packets), first) == (11, 3)  # from the keyframe at 8
    part = decode_frames(enc.codec, enc.info, packets, first=first)
    np.testing.assert_array_equal(part, whole[11:19])


@pytest.mark.parametrize("name", ["png", "av1", "h264"])
def test_decode_into_a_slot_slice_numpy_or_tensor(name, encoded):
    enc = encoded[name]
    whole = decode_frames(enc.codec, enc.info, enc.packets)
    slot = np.zeros((30, H, W, 3), np.uint8)
    packets, first = enc.packets_for(9, 20)
    assert decode_frames(enc.codec, enc.info, packets, out=slot[5:16], first=first) is not None
    np.testing.assert_array_equal(slot[5:16], whole[9:20])
    assert not slot[:5].any() and not slot[16:].any()
    tensor = torch.zeros((11, H, W, 3), dtype=torch.uint8)
    assert decode_frames(enc.codec, enc.info, packets, out=tensor, first=first) is tensor
    np.testing.assert_array_equal(tensor.numpy(), whole[9:20])


def test_a_decoder_is_reused_run_after_run(encoded):
    enc = encoded["av1"]
    whole = decode_frames(enc.codec, enc.info, enc.packets)
    decoder = FrameDecoder(enc.codec, enc.info)
    for start, stop in [(16, 20), (0, 5), (10, 12), (16, 20)]:
        packets, first = enc.packets_for(start, stop)
        np.testing.assert_array_equal(decoder.decode(packets, first=first), whole[start:stop])


def test_a_wrong_out_buffer_is_refused(encoded):
    enc = encoded["png"]
    with pytest.raises(ArgumentError, match="out must be uint8"):
        decode_frames(enc.codec, enc.info, enc.packets, out=np.zeros((3, H, W, 3), np.uint8))
    with pytest.raises(ArgumentError, match="first"):
        decode_frames(enc.codec, enc.info, enc.packets, first=21)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ["png", "jpeg", "av1", "h264"])
@pytest.mark.parametrize("damage", ["corrupt", "truncated", "empty"])
def test_a_damaged_packet_raises_naming_its_frame(name, damage, encoded):
    enc = encoded[name]
    packets = list(enc.packets)
    packets[5] = {
        "corrupt": flipped(packets[5]),
        "truncated": packets[5][: len(packets[5]) // 2],
        "empty": b"",
    }[damage]
    with pytest.raises(FrameCodecError, match="frame 105") as caught:
        decode_frames(enc.codec, enc.info, packets, frame_base=100)
    assert caught.value.frame == 105 and isinstance(caught.value, VideoError)


def test_a_truncated_raw_frame_raises_naming_it(encoded):
    enc = encoded["raw"]
    packets = list(enc.packets)
    packets[2] = packets[2][:-1]
    with pytest.raises(FrameCodecError, match="frame 2: a raw packet of"):
        decode_frames(enc.codec, enc.info, packets)


def test_a_run_that_does_not_start_at_a_keyframe_is_a_count_mismatch(encoded):
    enc = encoded["h264"]
    with pytest.raises(FrameCodecError, match="packets decoded to .* frames") as caught:
        decode_frames(enc.codec, enc.info, enc.packets[1:], frame_base=1)
    assert caught.value.frame is not None


def test_unsupported_codecs_pixel_formats_and_sizes_are_refused(frames):
    with pytest.raises(FrameCodecError, match="channels"):
        FrameDecoder(FrameCodec.av1(), StreamInfo(W, H, 1, "yuv420p"))
    with pytest.raises(FrameCodecError, match="pix_fmt"):
        FrameDecoder(FrameCodec.av1(), StreamInfo(W, H, 3, "yuv420p10le"))
    with pytest.raises(FrameCodecError, match="even"):
        encode_frames(FrameCodec.h264(), frames[:2, :47])
    with pytest.raises(FrameCodecError, match="yuv420p only"):
        encode_frames(FrameCodec.av1(pix_fmt="yuv444p"), frames[:2])
    with pytest.raises(FrameCodecError, match="like the episode's first"):
        encoder = FrameEncoder(FrameCodec.png())
        encoder.add(frames[0])
        encoder.add(frames[0, :10])


def test_h264_yuv444p_round_trips(frames):
    enc = encode_frames(FrameCodec.h264(pix_fmt="yuv444p", gop=4), frames[:6])
    got = decode_frames(enc.codec, enc.info, enc.packets)
    assert np.abs(got - frames[:6].astype(int)).mean() < 9  # measured 7.3


# --------------------------------------------------------------------------- MP4s


@pytest.fixture(scope="module")
def lerobot_mp4(tmp_path_factory, frames):
    """A LeRobot-style camera file as torchstore's LeRobot writer makes it: two episodes
    encoded on their own with LeRobot's defaults, joined by stream copy."""
    folder = tmp_path_factory.mktemp("mp4")
    second = camera_frames(9, H, W, episode=2)
    encode_video(folder / "a.mp4", frames, fps=FPS, settings=EncoderSettings())
    encode_video(folder / "b.mp4", second, fps=FPS, settings=EncoderSettings())
    spans = concat_videos([folder / "a.mp4", folder / "b.mp4"], folder / "file-000.mp4")
    return folder / "file-000.mp4", spans


def test_packets_from_mp4_decode_to_what_pyav_decodes(lerobot_mp4):
    path, spans = lerobot_mp4
    reference = decode_file(path)
    decoded = []
    for begin, end in spans:
        enc = packets_from_mp4(path, begin, end, FPS)
        assert enc.codec == FrameCodec.lerobot_av1() and enc.keyframes[::2].all()
        decoded.append(decode_frames(enc.codec, enc.info, enc.packets))
        packets, first = enc.packets_for(len(enc) - 3, len(enc))  # a run from a late keyframe
        np.testing.assert_array_equal(
            decode_frames(enc.codec, enc.info, packets, first=first), decoded[-1][-3:]
        )
    np.testing.assert_array_equal(np.concatenate(decoded), reference)


def test_our_lerobot_default_packets_are_lerobot_mp4_packets(lerobot_mp4, frames):
    path, spans = lerobot_mp4
    theirs = packets_from_mp4(path, *spans[0], FPS)
    ours = encode_frames(FrameCodec.lerobot_av1(), frames)
    assert [bytes(p) for p in ours.packets] == [bytes(p) for p in theirs.packets]


def test_write_mp4_of_imported_packets_redecodes_bit_for_bit(lerobot_mp4, tmp_path):
    path, spans = lerobot_mp4
    episodes = [packets_from_mp4(path, begin, end, FPS) for begin, end in spans]
    written = write_mp4(tmp_path / "out.mp4", episodes, FPS)
    assert np.allclose(written, spans)
    np.testing.assert_array_equal(decode_file(tmp_path / "out.mp4"), decode_file(path))
    again = packets_from_mp4(tmp_path / "out.mp4", *written[1], FPS)
    assert [bytes(p) for p in again.packets] == [bytes(p) for p in episodes[1].packets]
    assert again.info.extradata == episodes[1].info.extradata


@pytest.mark.parametrize("name", ["av1", "h264"])
def test_write_mp4_of_our_packets_decodes_as_the_packets_do(name, encoded, tmp_path):
    enc = encoded[name]
    write_mp4(tmp_path / "ours.mp4", enc, FPS)
    np.testing.assert_array_equal(
        decode_file(tmp_path / "ours.mp4"), decode_frames(enc.codec, enc.info, enc.packets)
    )


def test_mp4_errors(lerobot_mp4, encoded, tmp_path):
    path, spans = lerobot_mp4
    with pytest.raises(FrameCodecError, match="keyframe"):  # LeRobot's GOP 2: frame 1 is not
        packets_from_mp4(path, 1 / FPS, spans[0][1], FPS)
    with pytest.raises(FrameCodecError, match="ends after frame"):
        packets_from_mp4(path, spans[1][0], spans[1][1] + 1.0, FPS)
    with pytest.raises(FrameCodecError, match="h264"):
        packets_from_mp4(path, *spans[0], FPS, codec=FrameCodec.h264())
    with pytest.raises(FrameCodecError, match="only video packets"):
        write_mp4(tmp_path / "x.mp4", encoded["png"], FPS)
    with pytest.raises(FrameCodecError, match="episode 1 cannot share"):
        write_mp4(tmp_path / "x.mp4", [encoded["av1"], encoded["h264"]], FPS)
    assert not (tmp_path / "x.mp4").exists()


# --------------------------------------------------------------------------- kept bytes


def test_image_headers_are_read_without_decoding(encoded):
    jpeg, png = encoded["jpeg"].packets[0], encoded["png"].packets[0]
    assert check_image_bytes(jpeg, H, W, 3, frame=0) == "jpeg"
    assert check_image_bytes(png, H, W, 3) == "png"
    assert probe_image_bytes(png[:40]).width == W  # the header alone is enough
    with pytest.raises(FrameCodecError, match=r"frame 7: the PNG is 48x64 with 3 channels"):
        check_image_bytes(png, H, W, 4, frame=7)
    with pytest.raises(FrameCodecError, match="not a JPEG or PNG"):
        check_image_bytes(b"GIF89a....", H, W, 3)
    with pytest.raises(FrameCodecError, match="IHDR"):
        probe_image_bytes(png[:12])
