"""Encoded image columns at the io level: camera frames kept as codec packets, decoded in runs.

A ``uint8 [H, W, C]`` camera column kept raw is hundreds of times larger than the same
frames as video. This layer turns an episode's frames into packets and a run of packets
back into frames, with no container in between:

- :class:`FrameCodec` (how: raw, PNG, JPEG, AV1, H.264 and their settings),
  :class:`StreamInfo` (what a decoder needs besides the packets) and
  :class:`EncodedFrames` (an episode's packets and keyframe flags), from
  :mod:`torchstore.io.frames.codec_types`, where the default settings are justified;
- :class:`FrameEncoder` (an episode, frame by frame or in chunks, as recorders write) and
  :func:`encode_frames` (a whole episode at once);
- :class:`FrameDecoder` (reused run after run by a refill thread) and
  :func:`decode_frames`: a run of packets starting at a keyframe, into a caller's buffer,
  dropping the ``first`` frames before the wanted ones;
- :func:`packets_from_mp4` / :func:`write_mp4` (:mod:`torchstore.io.frames.codec_mp4`):
  an episode's packets out of a LeRobot MP4 and back in, bytes untouched;
- :func:`probe_image_bytes` / :func:`check_image_bytes`
  (:mod:`torchstore.io.frames.codec_images`): keep RLDS JPEG / PNG bytes as they are.

Video kinds are in :mod:`torchstore.io.frames.codec_video` (why packet ``i`` is frame
``i``, threads, the GIL, determinism), per-frame kinds in
:mod:`torchstore.io.frames.codec_images`. Every failure is a
:class:`~torchstore.errors.FrameCodecError` (a ``VideoError``) whose message names the
frame (``exc.frame``); the caller adds the column and episode.

Examples:
    >>> import numpy as np
    >>> frames = np.zeros((4, 16, 16, 3), np.uint8)
    >>> encoded = encode_frames(FrameCodec.png(), frames)
    >>> bool((decode_frames(encoded.codec, encoded.info, encoded.packets) == frames).all())
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from torchstore.errors import ArgumentError, FrameCodecError
from torchstore.io.frames.codec_images import (
    ImageDecoder,
    ImageHeader,
    check_image_bytes,
    encode_image,
    probe_image_bytes,
)
from torchstore.io.frames.codec_mp4 import packets_from_mp4, write_mp4
from torchstore.io.frames.codec_types import (
    FRAME_CODEC_KINDS,
    VIDEO_KINDS,
    EncodedFrames,
    FrameCodec,
    StreamInfo,
)
from torchstore.io.frames.codec_video import VideoPacketDecoder, VideoPacketEncoder
from torchstore.io.frames.resize import FrameResize

__all__ = [
    "FRAME_CODEC_KINDS",
    "VIDEO_KINDS",
    "FrameCodec",
    "StreamInfo",
    "EncodedFrames",
    "FrameEncoder",
    "FrameDecoder",
    "encode_frames",
    "decode_frames",
    "packets_from_mp4",
    "write_mp4",
    "ImageHeader",
    "probe_image_bytes",
    "check_image_bytes",
]


def _as_frames(frames: Any, shape: tuple[int, int, int] | None) -> np.ndarray:
    """``frames`` (numpy or torch, ``[H, W, C]`` or ``[N, H, W, C]`` uint8) as a contiguous
    4-d numpy array; FrameCodecError naming what is wrong."""
    if hasattr(frames, "detach"):  # a torch tensor, on any device
        frames = frames.detach().cpu().numpy()
    if not isinstance(frames, np.ndarray):
        raise FrameCodecError(f"frames must be a numpy array or a torch tensor, not {type(frames)}")
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.dtype != np.uint8:
        raise FrameCodecError(
            f"frames must be uint8 [N, H, W, C] (or one [H, W, C] frame), got "
            f"{frames.dtype}{list(frames.shape)}"
        )
    if shape is not None and frames.shape[1:] != shape:
        raise FrameCodecError(
            f"frames must be [{', '.join(map(str, shape))}] like the episode's first, got "
            f"{list(frames.shape[1:])}"
        )
    return np.ascontiguousarray(frames)


class FrameEncoder:
    """Encodes one episode's frames into an :class:`EncodedFrames`, as they arrive.

    :meth:`add` takes one ``[H, W, C]`` frame or a chunk ``[N, H, W, C]`` (uint8, numpy or
    torch); the first frame fixes the size (or give ``height``/``width``/``channels`` to
    open the encoder, and refuse bad settings, before any frame). :meth:`finish` flushes
    and returns the episode. One encoder per episode: every episode starts on a keyframe.

    Examples:
        >>> enc = FrameEncoder(FrameCodec.jpeg())
        >>> enc.add(np.zeros((8, 8, 3), np.uint8)); enc.add(np.zeros((2, 8, 8, 3), np.uint8))
        >>> len(enc.finish())
        3
    """

    def __init__(
        self,
        codec: FrameCodec,
        *,
        height: int | None = None,
        width: int | None = None,
        channels: int = 3,
    ) -> None:
        if not isinstance(codec, FrameCodec):
            raise FrameCodecError(f"codec must be a FrameCodec, not {type(codec).__name__}")
        self.codec = codec
        self._packets: list[bytes] = []
        self._keys: list[bool] = []
        self._video: VideoPacketEncoder | None = None
        self._shape: tuple[int, int, int] | None = None
        self._done = False
        self.frames = 0
        if height is not None or width is not None:
            if height is None or width is None:
                raise ArgumentError("give both height and width, or neither")
            self._open((height, width, channels))

    def _open(self, shape: tuple[int, int, int]) -> None:
        height, width, channels = StreamInfo(shape[1], shape[0], shape[2]).frame_shape
        self.codec.check_channels(channels)
        if self.codec.is_video:
            self._video = VideoPacketEncoder(self.codec, width, height)
        self._shape = (height, width, channels)

    def add(self, frames: Any) -> None:
        """Encode one frame ``[H, W, C]`` or a chunk ``[N, H, W, C]`` of uint8 frames."""
        if self._done:
            raise FrameCodecError("the episode is finished: start a new FrameEncoder")
        frames = _as_frames(frames, self._shape)
        if self._shape is None:
            self._open(frames.shape[1:])
        for frame in frames:
            if self._video is not None:
                self._collect(self._video.encode(frame))
            else:
                self._collect([(encode_image(self.codec, frame), True)])
            self.frames += 1

    def _collect(self, packets: list[tuple[bytes, bool]]) -> None:
        for data, key in packets:
            self._packets.append(data)
            self._keys.append(key)

    def finish(self) -> EncodedFrames:
        """Flush the encoder and return the episode (at least one frame must be added)."""
        if self._done:
            raise FrameCodecError("finish() was already called for this episode")
        if self._shape is None or not self.frames:
            raise FrameCodecError("no frames were added: an episode needs at least one")
        self._done = True
        extradata = b""
        if self._video is not None:
            self._collect(self._video.flush())
            extradata = self._video.extradata
        height, width, channels = self._shape
        info = StreamInfo(
            width,
            height,
            channels,
            pix_fmt=self.codec.pix_fmt if self.codec.is_video else None,
            extradata=extradata,
        )
        return EncodedFrames(self.codec, info, self._packets, np.array(self._keys, bool))


def encode_frames(codec: FrameCodec, frames: Any) -> EncodedFrames:
    """One episode of uint8 ``[N, H, W, C]`` frames as packets (see :class:`FrameEncoder`)."""
    encoder = FrameEncoder(codec)
    encoder.add(frames)
    return encoder.finish()


def _out_array(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``out`` as a numpy view of the same memory, checked against ``shape``."""
    view = out
    if hasattr(out, "detach"):  # a CPU torch tensor: decode into its memory
        if out.device.type != "cpu":
            raise ArgumentError(f"out must be in CPU memory, not on {out.device}")
        view = out.detach().numpy()
    if not isinstance(view, np.ndarray) or view.dtype != np.uint8 or view.shape != shape:
        got = f"{getattr(view, 'dtype', type(view))}{list(getattr(view, 'shape', []))}"
        raise ArgumentError(f"out must be uint8 {list(shape)}, got {got}")
    if not view.flags.writeable:
        raise ArgumentError("out must be writable")
    return view


class FrameDecoder:
    """Decodes runs of a column's packets, reusing one decoder (one per thread).

    ``threads``: decoder threads for video (1 by default; 0 lets FFmpeg pick), see
    :mod:`torchstore.io.frames.codec_video`. Per-frame kinds ignore it. ``resize``: a
    :class:`~torchstore.io.frames.resize.FrameResize` the frames are cropped and resized by
    as they are decoded (see :mod:`torchstore.io.frames.resize` for where each codec does
    it); then frames come out as ``resize.shape(...)``. ``device``: ``"cuda"`` decodes video
    on the GPU's decoder where there is one, else on the CPU after one warning (see
    :mod:`torchstore.io.frames.decode_device`).
    """

    def __init__(
        self,
        codec: FrameCodec,
        info: StreamInfo,
        *,
        threads: int = 1,
        resize: FrameResize | None = None,
        device: str = "cpu",
    ) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise ArgumentError(f"threads ({threads!r}) must be an int >= 0")
        codec.check_channels(info.channels)
        if resize is not None:
            resize.check_source(info.frame_shape, f"a {codec.kind} stream")
        self.codec, self.info, self.resize = codec, info, resize
        #: the shape of one decoded frame
        self.frame_shape = info.frame_shape if resize is None else resize.shape(info.frame_shape)
        if codec.is_video:
            self._impl = VideoPacketDecoder(codec, info, threads, resize, device)
        else:
            self._impl = ImageDecoder(codec, info, resize)

    def decode(
        self,
        packets: Sequence[bytes | memoryview],
        out: Any = None,
        first: int = 0,
        *,
        frame_base: int = 0,
    ) -> Any:
        """Frames ``first ..`` of the run ``packets`` as uint8 ``[len(packets) - first, H, W, C]``.

        For video the run must start at a keyframe (:meth:`EncodedFrames.packets_for`
        finds it); the ``first`` frames are decoded and dropped. ``out``: a uint8 numpy
        array or CPU tensor of exactly that shape (a slice of a resident slot, say) to
        decode into, and return; otherwise a new array is returned. ``frame_base``: the
        frame number of ``packets[0]`` in its episode, used in error messages.
        """
        count = len(packets)
        if not isinstance(first, int) or isinstance(first, bool) or not 0 <= first <= count:
            raise ArgumentError(f"first ({first!r}) must be an int in [0, {count}]")
        shape = (count - first, *self.frame_shape)
        target = np.empty(shape, np.uint8) if out is None else _out_array(out, shape)
        if count:
            self._impl.decode_into(packets, target, first, frame_base)
        return target if out is None else out


def decode_frames(
    codec: FrameCodec,
    info: StreamInfo,
    packets: Sequence[bytes | memoryview],
    out: Any = None,
    first: int = 0,
    *,
    threads: int = 1,
    frame_base: int = 0,
    resize: FrameResize | None = None,
) -> Any:
    """Decode one run of packets with a decoder of its own (see :meth:`FrameDecoder.decode`)."""
    return FrameDecoder(codec, info, threads=threads, resize=resize).decode(
        packets, out, first, frame_base=frame_base
    )
