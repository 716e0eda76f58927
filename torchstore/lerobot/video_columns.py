"""LeRobot video features as encoded store columns: the MP4's packets kept, never re-encoded.

An import keeps each video feature as an encoded column (a
:class:`~torchstore.data.ColumnSpec` with a video ``codec``) holding, for every episode,
the packets of its span of the camera's MP4, byte for byte: no decode at import, no quality
lost, and the store about the size of the dataset instead of hundreds of times larger
(raw ``uint8 [H, W, 3]``). The column's codec is the one the feature's ``info`` records
(:meth:`~torchstore.io.frames.codec.FrameCodec.from_lerobot_info`), else the stream's.

A stream that cannot be kept as packets is decoded to raw frames as before, and why is
said (a warning, and the import summary): HEVC or another codec than AV1 / H.264, a pixel
format other than ``yuv420p`` / ``yuv444p``, reordered frames (B-frames), or any other
reason the first imported episode's packets cannot be taken out of its file as they are.
A file that cannot be read at all (not a video, no video stream, a codec FFmpeg does not
know, cut short) is refused at once, with the error that says so: decoding it would fail
the same way.
A later episode whose packets cannot be kept (one that does not start on a keyframe, in a
file encoded in one piece rather than an episode at a time as LeRobot does) is decoded and
encoded into the column with its codec, also said. Either way the frames are then read by
the decoding path, whose errors name the file, episode and camera (a file short of an
episode's frames, another frame rate). Depth maps (``is_depth_map``) are always decoded
(to metres, :mod:`torchstore.lerobot.depth`).

An export (:func:`packet_camera_info`) writes such a column's packets back into MP4s as
they are, when the codec asked for is the stored one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torchstore.errors import (
    ArgumentError,
    ColumnError,
    FrameCodecError,
    LeRobotFormatError,
    VideoError,
)

__all__ = [
    "VIDEO_MODES",
    "check_video_mode",
    "plan_video_columns",
    "episode_video",
    "keeps_packets",
    "packet_camera_info",
]

#: what an import does with video features: keep the MP4 packets, or decode to raw frames
VIDEO_MODES = ("packets", "decode")


def check_video_mode(video: Any) -> str:
    if video not in VIDEO_MODES:
        raise ArgumentError(
            f"video ({video!r}) must be 'packets' (keep the MP4 packets) or 'decode' "
            "(raw uint8 frames)"
        )
    return video


def plan_video_columns(
    src, names: Sequence[str], specs: Sequence, first, video: str, tolerance_s: float | None
) -> tuple[list, dict[str, str]]:
    """The store columns of ``names`` with each video feature's codec decided.

    ``first``: the first episode imported, whose packets are taken out of their file as a
    trial. Returns ``(specs, decoded)``: ``decoded`` says, for each video feature kept as
    raw frames although packets were asked for, why.
    """
    from torchstore.lerobot.depth import is_depth

    out, decoded = [], {}
    for name, spec in zip(names, specs, strict=True):
        feature = src.features[name]
        if not feature.is_video or is_depth(feature):
            out.append(spec)
            continue
        if video == "decode":
            out.append(_with_codec(spec, None))
            continue
        try:
            out.append(_with_codec(spec, _stream_codec(src, feature, first, tolerance_s)))
        except (FrameCodecError, LeRobotFormatError, ColumnError) as exc:
            decoded[name] = str(exc)  # the packets cannot be kept as they are: decode them
            out.append(_with_codec(spec, None))
        # any other VideoError: the file cannot be read at all, and decoding it fails alike
    return out, decoded


def _stream_codec(src, feature, first, tolerance_s: float | None):
    """The codec ``feature``'s packets are kept with, checked on episode ``first``."""
    from torchstore.io.frames.codec import FrameCodec

    info = feature.info or {}
    codec = FrameCodec.from_lerobot_info(info) if info.get("video.codec") else None
    trial = src.video_packets(first, feature, codec, tolerance_s=tolerance_s)
    return trial.codec


def episode_video(src, entry, name: str, spec, tolerance_s: float | None):
    """Camera ``name``'s value for episode ``entry`` in a packet column: its packets, or,
    where they cannot be kept, its decoded frames (which the store encodes with the
    column's codec). Returns ``(value, why the frames were decoded or None)``."""
    try:
        return src.video_packets(
            entry, src.features[name], spec.codec, tolerance_s=tolerance_s
        ), None
    except (VideoError, LeRobotFormatError) as exc:
        frames = src.read_episode(entry, [name], tolerance_s=tolerance_s)[name]  # errors of its own
        return frames.reshape(entry.length, *spec.shape), str(exc)


def _with_codec(spec, codec):
    if spec.codec == codec:
        return spec
    return dataclasses.replace(spec, codec=codec)


def keeps_packets(spec, feature: Mapping[str, Any], requested) -> bool:
    """Whether an export writes column ``spec``'s packets into the MP4 as they are: it is
    exported as video, its frames are stored as AV1 / H.264 packets, and the codec asked
    for (``requested``: None for the stored one, else an EncoderSettings) is that kind
    with the same pix_fmt."""
    codec = spec.codec
    if feature.get("dtype") != "video" or codec is None or not codec.is_video:
        return False
    if requested is None:
        return True
    kind = {"libsvtav1": "av1", "libaom-av1": "av1", "libx264": "h264"}.get(requested.encoder)
    return kind == codec.kind and requested.pix_fmt == codec.pix_fmt


def packet_camera_info(spec, fps: int, imported: Mapping[str, Any] | None) -> dict[str, Any]:
    """info.json's ``info`` of a camera whose stored packets are exported as they are: the
    stream as stored (codec, pix_fmt, size, fps) and its encoder settings where known. For
    a column imported from LeRobot, the settings its dataset recorded (the others were
    LeRobot's defaults assumed at import, not known); for the store's own encoding, all."""
    codec = spec.codec
    height, width, channels = spec.shape
    info: dict[str, Any] = {
        "video.height": height,
        "video.width": width,
        "video.codec": codec.kind,
        "video.pix_fmt": codec.pix_fmt,
        "video.fps": int(fps),
        "video.channels": channels,
        "has_audio": False,
    }
    settings = {"video.g": codec.gop, "video.crf": codec.crf, "video.preset": codec.preset}
    if imported is None:
        info |= settings | {
            "video.fast_decode": 0,
            "video.video_backend": "pyav",
            "video.extra_options": {},
            "is_depth_map": False,
        }
        return info
    for key, value in imported.items():  # what the source said, stream facts excepted
        if key not in info:
            info[key] = settings.get(key, value)
    return info
