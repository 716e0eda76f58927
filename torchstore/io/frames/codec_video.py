"""AV1 / H.264 frames as bare codec packets: encode an episode, decode a run (no container).

The packets are what an MP4 would hold, without the MP4: the store keeps them in its own
file and decodes a run of them with a codec context fed the stream's ``extradata``, no
demuxer, no seeking. Rules the layer keeps so that packet ``i`` is frame ``i``:

- nothing is reordered: libx264 runs without B-frames; SVT-AV1's hidden frames travel
  inside the temporal unit of a shown frame, so each packet still shows exactly one;
- every episode's encoder starts on a keyframe, and keyframes are closed: a run that
  starts at one decodes to the same pixels as decoding from the episode's start;
- AV1 packets lose their leading temporal delimiter OBU (2 bytes), as the MP4 muxer does:
  at LeRobot's settings they are then byte for byte the packets of the MP4 that
  :class:`~torchstore.io.frames.video_encode.EpisodeVideoEncoder` (torchstore's LeRobot writer)
  makes of the same frames. lerobot's own MP4s hold other bytes (another SVT-AV1 build,
  SVT's default threads), which decode the same way through :func:`packets_from_mp4`.

Encoding is deterministic for a given input, build and settings: SVT-AV1 runs with
``lp=1`` (one thread of work; several threads deadlocked in multi-process recording, see
:class:`~torchstore.io.frames.video_encode.EncoderSettings`) and libx264 with one thread (its
output depends on its thread count, which would otherwise follow the machine's cores).

Decoding: libdav1d for AV1 (what PyAV picks for an AV1 stream), FFmpeg's h264 decoder,
on ``threads`` threads (1 by default: per CPU-second, 1 thread decoded 1241 frames/s at
480x640 against 1056 with FFmpeg's automatic frame threads, which also delay output by
2 frames; the refill runs several decoders at once instead). Both release the GIL, and so
does the rgb24 conversion (swscale through one ``VideoReformatter`` per decoder: the same
pixels as ``frame.to_ndarray(format="rgb24")``, which builds a converter per frame and
decoded 746 against 967 frames/s at 480x640). Frames dropped by ``first`` are decoded but
not converted. A damaged packet raises FrameCodecError naming its frame: libdav1d
refuses what does not parse (reporting it at that packet or the next); FFmpeg's h264
decoder conceals the damage it finds unless ``err_detect`` has ``explode``, which it is
given (and any frame still flagged corrupt is refused). Neither format carries a
checksum: damage made before the store's checksums (an import of a damaged file) that
still parses decodes to other pixels; ``benchmarks/source_damage.py`` counts how often.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from torchstore.errors import FrameCodecError
from torchstore.io.frames.codec_types import FrameCodec, StreamInfo
from torchstore.io.frames.decode_device import HARDWARE_DECODERS, hardware_decode
from torchstore.io.frames.resize import FrameResize
from torchstore.io.frames.scheduling import restore_scheduling, thread_scheduling
from torchstore.io.frames.video_container import _av_errors, _reason, require_av

__all__ = ["VideoPacketEncoder", "VideoPacketDecoder", "ENCODERS", "DECODERS"]

ENCODERS = {"av1": "libsvtav1", "h264": "libx264"}
DECODERS = {"av1": "libdav1d", "h264": "h264"}
#: Decoder options that turn damage the decoder notices into an error instead of frames it
#: patched over: FFmpeg's h264 decoder conceals a damaged slice (guessing its macroblocks
#: from its neighbours) unless ``err_detect`` has ``explode``; libdav1d conceals nothing.
DECODER_OPTIONS = {"av1": {}, "h264": {"err_detect": "crccheck+bitstream+buffer+explode"}}
_TEMPORAL_DELIMITER = b"\x12\x00"  # an AV1 OBU header (type 2, has_size) with size 0
_SVTAV1_MIN_SIZE = 4


def _encoder_options(codec: FrameCodec) -> dict[str, str]:
    options = {"crf": str(codec.crf), "preset": str(codec.preset)}
    if codec.kind == "av1":
        options["svtav1-params"] = "lp=1"
    return options


def check_video_size(codec: FrameCodec, width: int, height: int) -> None:
    """Refuse a frame size the encoder or the chroma layout cannot take."""
    if codec.kind == "av1" and min(width, height) < _SVTAV1_MIN_SIZE:
        raise FrameCodecError(
            f"frame size {width}x{height} is too small for libsvtav1 (width and height "
            f"must be >= {_SVTAV1_MIN_SIZE})"
        )
    if codec.pix_fmt == "yuv420p" and (width % 2 or height % 2):
        raise FrameCodecError(
            f"frame size {width}x{height} cannot be kept as yuv420p video, whose chroma is "
            "subsampled: width and height must be even (crop or pad the frames, or use "
            "pix_fmt='yuv444p' with h264)"
        )
    if codec.kind == "av1" and codec.pix_fmt != "yuv420p":
        raise FrameCodecError(
            f"libsvtav1 encodes yuv420p only, not {codec.pix_fmt} (use h264 for 4:4:4)"
        )


class VideoPacketEncoder:
    """Encodes one episode's RGB frames into packets, one per frame, keyframe first.

    :meth:`encode` takes one uint8 ``[H, W, 3]`` frame and returns the packets the encoder
    has finished meanwhile (it runs a few frames behind); :meth:`flush` returns the rest.
    Each packet comes as ``(bytes, is_keyframe)``. ``extradata`` is set once the encoder
    is open (in the constructor).
    """

    def __init__(self, codec: FrameCodec, width: int, height: int) -> None:
        check_video_size(codec, width, height)
        self.codec, self.width, self.height = codec, width, height
        self.frames = 0  # frames given
        self.packets = 0  # packets returned
        av = require_av()
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints ~20 lines per encoder otherwise
        ctx = av.CodecContext.create(ENCODERS[codec.kind], "w")
        ctx.width, ctx.height, ctx.pix_fmt = width, height, codec.pix_fmt
        ctx.time_base = Fraction(1, 30)  # frame numbers as timestamps; the rate is nominal
        ctx.framerate = Fraction(30)
        ctx.gop_size = codec.gop
        ctx.max_b_frames = 0
        ctx.thread_count = 1
        ctx.flags |= av.codec.context.Flags.global_header  # parameters in extradata
        ctx.options = _encoder_options(codec)
        scheduling = thread_scheduling()
        try:
            ctx.open()
        except _av_errors() as exc:
            raise FrameCodecError(
                f"{ENCODERS[codec.kind]} refused {width}x{height} {codec.pix_fmt} with "
                f"{codec.to_json()}: {_reason(exc)}"
            ) from exc
        finally:
            restore_scheduling(scheduling)  # SVT-AV1 as root leaves its threads realtime
        self._ctx = ctx
        self.extradata = bytes(ctx.extradata or b"")

    def encode(self, frame: np.ndarray) -> list[tuple[bytes, bool]]:
        """Encode one contiguous uint8 ``[H, W, 3]`` frame; the packets finished so far."""
        video_frame = require_av().VideoFrame.from_ndarray(frame, format="rgb24")
        video_frame.pts = self.frames
        self.frames += 1
        return self._packets(video_frame)

    def flush(self) -> list[tuple[bytes, bool]]:
        """Finish the episode: the packets still inside the encoder."""
        out = self._packets(None)
        if self.packets != self.frames:
            raise FrameCodecError(
                f"{ENCODERS[self.codec.kind]} gave {self.packets} packets for {self.frames} "
                "frames (one packet per frame expected)"
            )
        return out

    def _packets(self, frame) -> list[tuple[bytes, bool]]:
        try:
            packets = self._ctx.encode(frame)
        except _av_errors() as exc:
            raise FrameCodecError(
                f"encoding frame {self.frames - 1} failed: {_reason(exc)}", self.frames - 1
            ) from exc
        out = []
        for packet in packets:
            if packet.pts != self.packets:  # packet i must be frame i (no reordering)
                raise FrameCodecError(
                    f"{ENCODERS[self.codec.kind]} reordered frames: packet {self.packets} "
                    f"holds frame {packet.pts}",
                    self.packets,
                )
            data = bytes(packet)
            if self.codec.kind == "av1" and data.startswith(_TEMPORAL_DELIMITER):
                data = data[len(_TEMPORAL_DELIMITER) :]
            if self.packets == 0 and not packet.is_keyframe:
                raise FrameCodecError("the encoder's first packet is not a keyframe", 0)
            out.append((data, bool(packet.is_keyframe)))
            self.packets += 1
        return out


class VideoPacketDecoder:
    """Decodes runs of packets that start at a keyframe into uint8 ``[n, H, W, 3]`` RGB.

    One codec context, reused run after run (flushed in between), so a refill thread
    keeps one decoder per column. Not thread-safe: one decoder per thread.
    """

    def __init__(
        self,
        codec: FrameCodec,
        info: StreamInfo,
        threads: int = 1,
        resize: FrameResize | None = None,
        device: str = "cpu",
    ) -> None:
        if not codec.is_video:
            raise FrameCodecError(f"{codec.kind} frames are not a video stream")
        if info.channels != 3:
            raise FrameCodecError(f"video frames are RGB: 3 channels, not {info.channels}")
        if info.pix_fmt not in ("yuv420p", "yuv444p"):
            raise FrameCodecError(
                f"{codec.kind} pix_fmt {info.pix_fmt!r} is not one these frames can be "
                "decoded from (yuv420p or yuv444p)"
            )
        av = require_av()
        self.codec, self.info = codec, info
        self._av = av
        self._errors = _av_errors()
        hwaccel = hardware_decode(codec.kind, device)
        #: the FFmpeg decoder in use, and the pixel formats its frames may come in (NVDEC
        #: hands 4:2:0 frames back as NV12, the same samples interleaved)
        self.decoder = DECODERS[codec.kind] if hwaccel is None else HARDWARE_DECODERS[codec.kind]
        self._formats = {info.pix_fmt} if hwaccel is None else {info.pix_fmt, "nv12", "yuv444p"}
        # (PyAV before 14 takes no hwaccel argument: passed only for a GPU decode)
        extra = {} if hwaccel is None else {"hwaccel": hwaccel}
        self._ctx = av.CodecContext.create(self.decoder, "r", **extra)
        self._ctx.options = dict(DECODER_OPTIONS[codec.kind])
        if info.extradata:
            self._ctx.extradata = info.extradata
        self._ctx.thread_count = threads
        if threads != 1:
            self._ctx.thread_type = "AUTO"
        self._rgb = av.video.reformatter.VideoReformatter()
        # the one sws pass per frame: YUV to RGB, scaled when there is a resize and no crop
        # (sws cannot crop); one thread, as every decode thread runs its own
        self._resize = resize
        self._convert: dict = {"format": "rgb24", "threads": 1}
        if resize is not None and resize.crop is None:
            self._convert.update(
                width=resize.width, height=resize.height, interpolation=resize.sws_interpolation
            )
            self._resize = None  # done in the conversion
        self._used = False

    def decode_into(
        self, packets: Sequence, out: np.ndarray, first: int, frame_base: int = 0
    ) -> None:
        """Decode ``packets`` (a run from a keyframe) into ``out``: frame ``first + k`` of
        the run goes to ``out[k]``. ``frame_base`` is the number of ``packets[0]``'s frame,
        for messages."""
        if self._used:
            self._ctx.flush_buffers()  # forget the previous run (and leave draining mode)
        self._used = True
        self._got = 0
        self._want = len(packets)
        for i, data in enumerate(packets):
            if not len(data):  # an empty packet would mean "end of stream" to the decoder
                raise FrameCodecError(
                    f"frame {frame_base + i}: its packet is empty", frame_base + i
                )
            self._take(self._send(self._av.Packet(data), frame_base + i), out, first, frame_base)
        self._take(self._send(None, frame_base + len(packets) - 1), out, first, frame_base)
        if self._got != len(packets):
            at = frame_base + self._got
            raise FrameCodecError(
                f"frame {at}: {len(packets)} packets decoded to {self._got} frames (a "
                "corrupt packet, or a run that does not start at a keyframe)",
                at,
            )

    def _send(self, packet, at: int) -> list:
        try:
            return self._ctx.decode(packet)
        except self._errors as exc:
            late = "" if self._ctx.thread_count == 1 else "; threaded decoders report it late"
            raise FrameCodecError(
                f"frame {at}: the {self.decoder} decoder refused its packet "
                f"({_reason(exc)}): a corrupt or truncated packet here, or a damaged or "
                f"missing one just before it{late}",
                at,
            ) from exc

    def _take(self, frames: list, out: np.ndarray, first: int, frame_base: int) -> None:
        for frame in frames:
            k, at = self._got, frame_base + self._got
            if k >= self._want:
                raise FrameCodecError(
                    f"frame {at}: {self._want} packets decoded to more frames than packets", at
                )
            if frame.is_corrupt:
                raise FrameCodecError(
                    f"frame {at}: the decoder found its data damaged (corrupt or truncated "
                    "packet, here or in a frame it refers to)",
                    at,
                )
            if (frame.width, frame.height) != (self.info.width, self.info.height):
                raise FrameCodecError(
                    f"frame {at} decodes to {frame.width}x{frame.height}, not the stream's "
                    f"{self.info.width}x{self.info.height}",
                    at,
                )
            if frame.format.name not in self._formats:
                raise FrameCodecError(
                    f"frame {at} decodes as {frame.format.name}, not the stream's "
                    f"{self.info.pix_fmt}",
                    at,
                )
            if k >= first:
                rgb = self._rgb.reformat(frame, **self._convert).to_ndarray()
                if self._resize is None:
                    out[k - first] = rgb
                else:
                    self._resize.apply(rgb, out[k - first])
            self._got += 1
