"""LeRobot MP4s as packets and back, with no re-encode: import keeps the bytes, export muxes them.

:func:`packets_from_mp4` demuxes one episode's span of a camera's MP4 (LeRobot v3 files
hold many episodes back to back, located by ``from_timestamp`` / ``to_timestamp``) into an
:class:`~torchstore.io.frames.codec_types.EncodedFrames`: every packet's bytes exactly as
stored, its keyframe flag, and the stream's ``extradata`` (AV1's ``av1C`` box, H.264's
``avcC``), which a bare decoder accepts as they are. Decoding them gives the frames PyAV
decodes from the file (same decoder, same bytes).

:func:`write_mp4` muxes episodes of packets (imported ones, or the store's own) into one
new MP4, frame ``i`` of the file shown at ``i / fps``, as LeRobot lays its files out
(``movflags=faststart``, the muxer's time base, e.g. 1/15360 at 30 fps). PyAV has no call
that sets a packet-only stream's extradata, so the first packet carries it as
``new_extradata`` side data, which the MP4 muxer takes as the stream's. The file then holds
the packets as they were given, extradata included (AV1's temporal delimiters are dropped
and Annex B H.264 is rewritten length-prefixed, as the muxer always does), and decodes bit
for bit to the frames the packets decode to.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from torchstore.errors import FrameCodecError
from torchstore.io.frames.codec_types import (
    PIX_FMTS,
    VIDEO_KINDS,
    EncodedFrames,
    FrameCodec,
    StreamInfo,
)
from torchstore.io.frames.video_container import (
    _MUX_OPTIONS,
    _av_errors,
    _check_fps,
    _check_packet,
    _nominal_rate,
    _open_input,
    _reason,
    require_av,
)

__all__ = ["packets_from_mp4", "write_mp4"]

_FPS_LEEWAY = 0.01  # relative difference allowed between the file's frame rate and fps


def _frame_number(path: Path, t: float, fps: int, what: str) -> int:
    """The frame shown at ``t`` seconds; FrameCodecError if ``t`` is off the frame grid."""
    tolerance = 0.25 / fps
    number = max(math.floor(t * fps + 0.5), 0) if t == t else -1
    if number < 0 or t < -tolerance or abs(t - number / fps) > tolerance:
        raise FrameCodecError(f"{path}: {what} ({t!r} s) is not a time on the {fps} fps frame grid")
    return number


def packets_from_mp4(
    path: str | os.PathLike,
    from_timestamp: float,
    to_timestamp: float,
    fps: int,
    *,
    codec: FrameCodec | None = None,
) -> EncodedFrames:
    """The packets of frames ``[from_timestamp, to_timestamp)`` (seconds) of ``path``.

    The span must start on a keyframe (every LeRobot episode does: each is encoded on its
    own) and its packets must be in presentation order (no B-frames: LeRobot's AV1 has
    none; an H.264 file with reordered frames raises, re-encode it instead). ``codec``
    describes the packets to the store (``FrameCodec.from_lerobot_info`` of the feature's
    info.json entry); its kind and pix_fmt must be the stream's. Default: the stream's
    codec and pix_fmt with LeRobot's other settings (GOP 2, crf 30).
    """
    path, fps = Path(path), _check_fps(fps)
    container, stream = _open_input(path)
    try:
        ctx = stream.codec_context
        kind, pix_fmt = ctx.codec.canonical_name, ctx.pix_fmt
        codec = _stream_codec(path, kind, pix_fmt, codec)
        rate = _nominal_rate(stream)
        if rate and abs(float(rate) / fps - 1) > _FPS_LEEWAY:
            raise FrameCodecError(f"{path} runs at {float(rate):g} fps, not {fps}")
        first = _frame_number(path, float(from_timestamp), fps, "from_timestamp")
        stop = _frame_number(path, float(to_timestamp), fps, "to_timestamp")
        if stop <= first:
            raise FrameCodecError(
                f"{path}: the span [{from_timestamp}, {to_timestamp}) s holds no frame"
            )
        packets, keys = _demux(path, container, stream, fps, first, stop)
        info = StreamInfo(
            ctx.width, ctx.height, 3, pix_fmt=pix_fmt, extradata=bytes(ctx.extradata or b"")
        )
    except _av_errors() as exc:
        raise FrameCodecError(f"{path} cannot be read: {_reason(exc)}") from exc
    finally:
        container.close()
    return EncodedFrames(codec, info, packets, np.array(keys, bool))


def _stream_codec(path: Path, kind: str, pix_fmt: str, codec: FrameCodec | None) -> FrameCodec:
    if kind not in VIDEO_KINDS:
        raise FrameCodecError(
            f"{path} is {kind} video: only {' and '.join(VIDEO_KINDS)} packets can be kept "
            "(decode and re-encode it instead)"
        )
    if pix_fmt not in PIX_FMTS:
        raise FrameCodecError(
            f"{path} is {pix_fmt}: only {', '.join(PIX_FMTS)} packets can be kept"
        )
    if codec is None:
        if kind == "av1":
            return FrameCodec("av1", crf=30, preset=12, gop=2, pix_fmt=pix_fmt)
        return FrameCodec("h264", crf=30, preset="medium", gop=2, pix_fmt=pix_fmt)
    if (codec.kind, codec.pix_fmt) != (kind, pix_fmt):
        raise FrameCodecError(
            f"{path} is {kind} {pix_fmt}, not the {codec.kind} {codec.pix_fmt} of codec"
        )
    return codec


def _demux(path: Path, container, stream, fps: int, first: int, stop: int):
    """Packets and keyframe flags of frames ``[first, stop)``, checked to be contiguous."""
    tb = stream.time_base
    start_pts = stream.start_time or 0
    target = start_pts + math.floor(Fraction(first, fps) / tb)
    container.seek(target, stream=stream, backward=True, any_frame=False)
    packets: list[bytes] = []
    keys: list[bool] = []
    for packet in container.demux(stream):
        if not packet.size:
            continue
        _check_packet(path, packet)
        t = float((packet.pts - start_pts) * tb)
        number = _frame_number(path, t, fps, "a packet's time")
        if number < first and not packets:
            continue  # before the span: the seek landed on an earlier keyframe
        expected = first + len(packets)
        if number != expected:
            what = "reordered frames (B-frames)" if number < expected else "a gap"
            raise FrameCodecError(
                f"{path} has {what}: packet {len(packets)} of the span holds frame {number}, "
                f"not {expected}; such a stream cannot be kept as packets (re-encode it)",
                len(packets),
            )
        if not packets and not packet.is_keyframe:
            raise FrameCodecError(
                f"{path}: the span starting at frame {first} does not start on a keyframe",
                0,
            )
        packets.append(bytes(packet))
        keys.append(bool(packet.is_keyframe))
        if first + len(packets) == stop:
            return packets, keys
    raise FrameCodecError(
        f"{path} ends after frame {first + len(packets) - 1}: the span needs frames "
        f"[{first}, {stop})",
        len(packets),
    )


def write_mp4(
    path: str | os.PathLike,
    episodes: EncodedFrames | Sequence[EncodedFrames],
    fps: int,
) -> list[tuple[float, float]]:
    """Write ``episodes`` (one, or several back to back) as a new MP4 at ``path``, no
    re-encode; returns each episode's ``(from_timestamp, to_timestamp)`` in seconds.

    Every episode must be video of the same kind, size, pix_fmt and extradata (what one
    stream can hold; episodes encoded with the same settings and size share their
    extradata). An existing file is replaced; a failed write leaves no file.
    """
    path, fps = Path(path), _check_fps(fps)
    episodes = [episodes] if isinstance(episodes, EncodedFrames) else list(episodes)
    _check_muxable(episodes)
    av = require_av()
    from av.packet import PacketSideData, packet_sidedata_type_from_literal

    head, info = episodes[0], episodes[0].info
    try:
        container = av.open(str(path), "w", format="mp4", options=_MUX_OPTIONS)
    except _av_errors() as exc:
        raise FrameCodecError(f"cannot create {path}: {_reason(exc)}") from exc
    spans, number = [], 0
    try:
        stream = container.add_mux_stream(
            head.codec.kind, rate=fps, width=info.width, height=info.height
        )
        stream.time_base = Fraction(1, fps)
        for episode in episodes:
            begin = number
            for data, key in zip(episode.packets, episode.keyframes):
                packet = av.Packet(bytes(data))
                packet.stream = stream
                packet.time_base = Fraction(1, fps)
                packet.pts = packet.dts = number
                packet.duration = 1
                packet.is_keyframe = bool(key)
                if number == 0 and info.extradata:
                    side = PacketSideData(
                        packet_sidedata_type_from_literal("new_extradata"), len(info.extradata)
                    )
                    memoryview(side)[:] = info.extradata
                    packet.set_sidedata(side)
                container.mux(packet)
                number += 1
            spans.append((begin / fps, number / fps))
        container.close()
    except BaseException as exc:
        try:
            container.close()
        except _av_errors():
            pass  # an unfinished file may fail to close; it is deleted next anyway
        path.unlink(missing_ok=True)
        if isinstance(exc, _av_errors()):
            raise FrameCodecError(f"cannot write {path}: {_reason(exc)}") from exc
        raise
    return spans


def _check_muxable(episodes: list[EncodedFrames]) -> None:
    if not episodes:
        raise FrameCodecError("write_mp4 needs at least one episode")
    head = episodes[0]
    for e, episode in enumerate(episodes):
        if not isinstance(episode, EncodedFrames):
            raise FrameCodecError(f"episode {e} is a {type(episode).__name__}, not EncodedFrames")
        if not episode.codec.is_video:
            raise FrameCodecError(
                f"episode {e} is {episode.codec.kind} frames: only video packets go into "
                "an MP4 without re-encoding"
            )
        if not len(episode) or not episode.keyframes[0]:
            raise FrameCodecError(f"episode {e} is empty or does not start on a keyframe")
        ours, theirs = episode.info, head.info
        for key in ("width", "height", "pix_fmt", "extradata"):
            if getattr(ours, key) != getattr(theirs, key) or episode.codec.kind != head.codec.kind:
                raise FrameCodecError(
                    f"episode {e} cannot share episode 0's stream: its "
                    f"{key if episode.codec.kind == head.codec.kind else 'codec'} differs "
                    "(encode every episode with the same settings and size)"
                )
