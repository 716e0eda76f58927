"""Encoding camera episodes into MP4 files: the encoder settings, the frame checks, the encoder.

:class:`EpisodeVideoEncoder` / :func:`encode_video` stream uint8 RGB frames into a new MP4
with LeRobot's defaults (:class:`EncoderSettings`: AV1 via libsvtav1, yuv420p, GOP 2, crf
30, preset 12); frame ``i`` gets the presentation time ``i / fps`` exactly. Opening,
probing and joining the files is :mod:`torchstore.io.frames.video_container`'s; reading frames
back is :mod:`torchstore.io.frames.video`'s, which re-exports every public name here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import VideoError
from torchstore.io.frames.scheduling import restore_scheduling, thread_scheduling
from torchstore.io.frames.video_container import (
    _MUX_OPTIONS,
    VideoInfo,
    _av_errors,
    _check_fps,
    _check_int,
    _reason,
    probe_video,
    require_av,
)

__all__ = ["EncoderSettings", "ENCODER_NAMES", "EpisodeVideoEncoder", "encode_video"]

# Common video encoders (those LeRobot accepts); listed in errors when they are available.
_KNOWN_ENCODERS = """libsvtav1 libaom-av1 libx264 h264 libx265 hevc h264_nvenc hevc_nvenc
    h264_vaapi h264_qsv h264_videotoolbox hevc_videotoolbox""".split()
ENCODER_NAMES = ("av1", "h264")  # the short names EncoderSettings.named knows
_SVTAV1_MIN_SIZE = 4  # SVT-AV1 refuses frames narrower or lower than this


def _encoder_available(name: str) -> bool:
    av = require_av()
    try:
        codec = av.codec.Codec(name, "w")
    except (av.codec.codec.UnknownCodecError, ValueError):
        return False
    return codec.type == "video"


def _check_encoder(name: str) -> None:
    if not isinstance(name, str) or not _encoder_available(name):
        known = [n for n in _KNOWN_ENCODERS if _encoder_available(n)]
        raise VideoError(
            f"video codec {name!r} is not an encoder this PyAV build has; "
            f"available: {', '.join(known) or 'none'}"
        )


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    """How episodes are encoded; defaults are LeRobot's (AV1 via libsvtav1, GOP 2, crf 30).

    ``preset`` is a number for libsvtav1 (0 slowest .. 13 fastest) and a name for other
    encoders (x264: ``"medium"``); ``fast_decode`` is svtav1's ``fast-decode`` level, or
    ``tune=fastdecode`` for other encoders when non-zero. The encoder must exist in this
    PyAV build (checked here, so a typo fails before any recording).

    ``svt_lp`` is SVT-AV1's level of parallelism, 1 by default: with SVT's default
    threading the encoder (libSvtAv1Enc 4.1 in PyAV 18.1) deadlocked inside
    ``svt_av1_enc_send_picture`` in 4 of 12 recording processes run four at a time on two
    cores, and in 0 of 12 with ``lp=1``. ``None`` leaves SVT's default.
    """

    codec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    g: int | None = 2
    crf: int | None = 30
    preset: int | str | None = 12
    fast_decode: int = 0
    svt_lp: int | None = 1

    def __post_init__(self) -> None:
        _check_encoder(self.codec)
        try:
            require_av().VideoFormat(self.pix_fmt)
        except (TypeError, ValueError) as exc:
            raise VideoError(f"pix_fmt ({self.pix_fmt!r}) is not a pixel format") from exc
        _check_int("g", self.g, 1)
        _check_int("crf", self.crf, 0)
        _check_int("fast_decode", self.fast_decode, 0, optional=False)
        _check_int("svt_lp", self.svt_lp, 0)
        if self.preset is not None and not isinstance(self.preset, int | str):
            raise VideoError(f"preset ({self.preset!r}) must be None, an int or a name")
        if isinstance(self.preset, int) and self.encoder != "libsvtav1":
            raise VideoError(
                f"preset ({self.preset!r}) is a number, but {self.encoder} takes a named "
                "preset such as 'medium' (or None)"
            )

    @classmethod
    def h264(cls) -> EncoderSettings:
        """H.264 via libx264 with GOP 2 (as LeRobot) and x264's default quality (crf 23)."""
        return cls(codec="libx264", g=2, crf=23, preset=None)

    @classmethod
    def named(cls, name: str) -> EncoderSettings:
        """The settings a short name stands for: ``"av1"`` (the defaults) or ``"h264"``
        (:meth:`h264`), as a command line spells them; VideoError for any other name."""
        if name == "av1":
            return cls()
        if name == "h264":
            return cls.h264()
        raise VideoError(f"video codec name ({name!r}) must be one of {', '.join(ENCODER_NAMES)}")

    @property
    def encoder(self) -> str:
        """The FFmpeg encoder ``codec`` resolves to (``"h264"`` -> ``"libx264"``)."""
        return require_av().codec.Codec(self.codec, "w").name

    def options(self) -> dict[str, str]:
        """The encoder options, spelled as LeRobot passes them to PyAV."""
        options = {}
        for key in ("g", "crf", "preset"):
            if (value := getattr(self, key)) is not None:
                options[key] = str(value)
        svt = []
        if self.fast_decode:
            if self.encoder == "libsvtav1":
                svt.append(f"fast-decode={self.fast_decode}")
            else:
                options["tune"] = "fastdecode"
        if self.svt_lp is not None and self.encoder == "libsvtav1":
            svt.append(f"lp={self.svt_lp}")
        if svt:
            options["svtav1-params"] = ":".join(svt)
        return options


def _check_frame_size(settings: EncoderSettings, width: int, height: int) -> None:
    """Refuse sizes the pixel format cannot hold (odd sizes with subsampled chroma)."""
    _check_int("frame width", width, 1, optional=False)
    _check_int("frame height", height, 1, optional=False)
    if settings.encoder == "libsvtav1" and min(width, height) < _SVTAV1_MIN_SIZE:
        raise VideoError(
            f"frame size {width}x{height} is too small for libsvtav1: width and height "
            f"must be >= {_SVTAV1_MIN_SIZE}"
        )
    fmt = require_av().VideoFormat(settings.pix_fmt)
    if (fmt.chroma_width(2) == 1 and width % 2) or (fmt.chroma_height(2) == 1 and height % 2):
        raise VideoError(
            f"frame size {width}x{height} cannot be encoded as {settings.pix_fmt}, whose "
            "chroma is subsampled: width and height must be even (crop or pad the frames)"
        )


def _as_rgb(frame: Any, height: int, width: int) -> np.ndarray:
    """``frame`` as a contiguous uint8 [H, W, 3] numpy array, or VideoError."""
    if hasattr(frame, "detach"):  # a torch tensor, on any device
        frame = frame.detach().cpu().numpy()
    if not isinstance(frame, np.ndarray):
        raise VideoError(f"a frame must be a numpy array or a torch tensor, got {type(frame)}")
    if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
        raise VideoError(
            f"a frame must be uint8[{height}, {width}, 3] (RGB, height x width x channels), "
            f"got {frame.dtype}{list(frame.shape)}"
        )
    return np.ascontiguousarray(frame)


class EpisodeVideoEncoder:
    """Streams one episode's frames (uint8 RGB HWC numpy arrays, or torch tensors) into a new MP4.

    Frame ``i`` is shown at ``i / fps`` seconds. The encoder opens in the constructor, so
    settings the encoder refuses fail before the first frame.

    Examples:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "episode.mp4"
        >>> with EpisodeVideoEncoder(out, fps=10, width=64, height=48) as enc:
        ...     for _ in range(4):
        ...         enc.add(np.zeros((48, 64, 3), np.uint8))
        >>> probe_video(out).frames
        4
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fps: int,
        width: int,
        height: int,
        settings: EncoderSettings | None = None,
    ) -> None:
        self.path = Path(path)
        self.settings = settings if settings is not None else EncoderSettings()
        self.fps = _check_fps(fps)
        _check_frame_size(self.settings, width, height)
        self.width, self.height = width, height
        self.frames = 0
        self._closed = False
        self._container = self._stream = None
        self._open()

    def _open(self) -> None:
        av = require_av()
        # SVT-AV1 prints ~20 info/warning lines on stderr per encoder it opens, i.e. per
        # episode; errors only, unless the user chose a level (SVT_LOG is read at open).
        os.environ.setdefault("SVT_LOG", "1")
        if not self.path.parent.is_dir():  # the muxer only creates the file at its first packet
            self._closed = True
            raise VideoError(f"cannot create {self.path}: its folder does not exist")
        try:
            self._container = av.open(str(self.path), "w", format="mp4", options=_MUX_OPTIONS)
        except _av_errors() as exc:
            self._closed = True
            raise VideoError(f"cannot create {self.path}: {_reason(exc)}") from exc
        settings = self.settings
        scheduling = thread_scheduling()
        try:
            stream = self._container.add_stream(
                settings.encoder, rate=self.fps, options=settings.options()
            )
            stream.width, stream.height, stream.pix_fmt = self.width, self.height, settings.pix_fmt
            stream.codec_context.time_base = Fraction(1, self.fps)
            stream.codec_context.open()
        except _av_errors() as exc:
            self.abort()
            raise VideoError(
                f"{self.path}: {settings.encoder} refused {self.width}x{self.height} "
                f"{settings.pix_fmt} at {self.fps} fps with options {settings.options()}: "
                f"{_reason(exc)}"
            ) from exc
        finally:
            restore_scheduling(scheduling)  # SVT-AV1 as root leaves its threads realtime
        self._stream = stream

    def add(self, frame: Any) -> None:
        """Encode one frame (uint8 [H, W, 3] RGB); it is shown at ``frames_so_far / fps`` s."""
        if self._closed:
            raise VideoError(f"{self.path}: the encoder is closed, no frame can be added")
        av = require_av()
        video_frame = av.VideoFrame.from_ndarray(
            _as_rgb(frame, self.height, self.width), format="rgb24"
        )
        video_frame.pts = self.frames
        self._encode(video_frame)
        self.frames += 1

    def _encode(self, video_frame) -> None:
        """Encode ``video_frame`` (None: flush) and mux what the encoder hands back."""
        try:
            for packet in self._stream.encode(video_frame):
                self._container.mux(packet)
        except _av_errors() as exc:
            raise VideoError(f"{self.path}: encoding failed: {_reason(exc)}") from exc

    def close(self) -> int:
        """Flush the encoder and finish the file; returns the frames written (idempotent)."""
        if self._closed:
            return self.frames
        if self.frames == 0:
            self.abort()
            raise VideoError(f"{self.path}: no frames were added; an episode video needs one")
        try:
            self._encode(None)
            self._container.close()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, _av_errors()):
                raise VideoError(f"{self.path}: finishing the file failed: {_reason(exc)}") from exc
            raise
        self._closed = True
        return self.frames

    def abort(self) -> None:
        """Close without finishing and delete the file (partial, or finished: the episode goes)."""
        self._closed = True
        if self._container is not None:
            try:
                self._container.close()
            except _av_errors():
                pass  # an unfinished file may fail to close; it is deleted next anyway
            self._container = None
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> EpisodeVideoEncoder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def encode_video(
    path: str | os.PathLike,
    frames: Any,
    *,
    fps: int,
    settings: EncoderSettings | None = None,
) -> VideoInfo:
    """Encode ``frames`` (uint8 [N, H, W, 3], numpy or torch) into a new MP4 and probe it."""
    shape = tuple(getattr(frames, "shape", ()))
    if len(shape) != 4 or shape[0] == 0:
        raise VideoError(f"frames must be a non-empty [N, H, W, 3] array, got shape {list(shape)}")
    with EpisodeVideoEncoder(
        path, fps=fps, width=shape[2], height=shape[1], settings=settings
    ) as enc:
        for frame in frames:
            enc.add(frame)
    return probe_video(path)
