"""What an encoded image column records: how its frames are coded, the stream, the packets.

:class:`FrameCodec` says how a ``uint8 [H, W, C]`` column's frames are kept on disk (raw,
PNG, JPEG, or AV1 / H.264 video) and with which settings; :class:`StreamInfo` holds what a
decoder needs besides the packets (size, channels, pixel format, the codec's
``extradata``); :class:`EncodedFrames` is one episode's packets with their keyframe flags.
Encoding and decoding are :mod:`torchstore.io.frames.codec`'s.

Why AV1 keeps a keyframe every 32 frames by default (LeRobot keeps one every 2): the store
decodes whole runs of a column (a residency block, thousands of rows) in one pass, never one
frame per sample, so a run pays at most ``gop - 1`` frames decoded and thrown away at its
start, and the rest of the cost per frame falls as the keyframes thin out. Measured on
camera-like frames (a photograph panned and zoomed, ``benchmarks/_camera_frames.py``), 150
frames, libsvtav1 crf 30 preset 12, decoded by libdav1d on one thread (into rgb24):

========  =====  ============  ==================  =============
size      gop    KiB / frame   decode frames/s     encode fps
========  =====  ============  ==================  =============
224x224   2      4.41          1450-1700           350-390
224x224   16     0.98          3400                420-635
224x224   32     0.89          3200-3650           520-680
224x224   64     0.83          2800-3800           440-680
480x640   2      11.85         470                 126
480x640   16     2.94          1190                205-240
480x640   32     2.40          1300                233-253
480x640   64     2.20          1210-1300           232-242
========  =====  ============  ==================  =============

GOP 32 is 4.9x (224x224) and 4.9x (480x640) smaller than LeRobot's GOP 2, and its decode
is 2.2-2.8x faster. GOP 64 saves another 7-8 % of bytes but doubles the frames a run that
starts mid-GOP (or a single-row read) decodes for nothing (at most 63, about 50 ms at
480x640), and twice the frames are lost to one damaged packet. So 32, about a second at
30 fps. crf and preset stay LeRobot's, so the only change from its encoding is the keyframe
spacing. H.264 (libx264) defaults to crf 23 (x264's default quality), preset ``veryfast``
(480x640 on one thread: 212 fps and 2.61 KiB/frame, against 83 fps and 2.70 KiB/frame for
``medium``) and the same GOP. JPEG defaults to quality 90 with 4:2:0 chroma (224x224:
10.7 % of raw, PSNR 35.9 dB), PNG to zlib level 1 (level 6 is 3-4x slower to encode and
only 5-6 points smaller on camera frames, whose sensor noise zlib cannot squeeze).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from torchstore.errors import FrameCodecError

__all__ = [
    "FRAME_CODEC_KINDS",
    "VIDEO_KINDS",
    "FrameCodec",
    "StreamInfo",
    "EncodedFrames",
]

#: every kind a column's frames can be kept as
FRAME_CODEC_KINDS = ("raw", "png", "jpeg", "av1", "h264")
#: the kinds kept as a video stream: packets depend on earlier ones, runs start at keyframes
VIDEO_KINDS = ("av1", "h264")
#: the chroma layouts video and JPEG frames can be kept in (4:2:0 is what LeRobot uses)
PIX_FMTS = ("yuv420p", "yuv444p")
X264_PRESETS = (
    "ultrafast superfast veryfast faster fast medium slow slower veryslow placebo".split()
)
_SETTINGS = {  # the settings each kind takes, with their defaults
    "raw": {},
    "png": {"level": 1},
    "jpeg": {"quality": 90, "pix_fmt": "yuv420p"},
    "av1": {"crf": 30, "preset": 12, "gop": 32, "pix_fmt": "yuv420p"},
    "h264": {"crf": 23, "preset": "veryfast", "gop": 32, "pix_fmt": "yuv420p"},
}
_CRF_RANGE = {"av1": (0, 63), "h264": (0, 51)}
#: LeRobot's default camera encoding (lerobot 0.4-0.6: libsvtav1, yuv420p, g=2, crf 30, preset 12)
LEROBOT_AV1 = {"crf": 30, "preset": 12, "gop": 2, "pix_fmt": "yuv420p"}
_CHANNELS = {"raw": (1, 2, 3, 4), "png": (1, 3, 4), "jpeg": (1, 3), "av1": (3,), "h264": (3,)}


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _int_setting(kind: str, name: str, value: object, low: int, high: int) -> int:
    if not _is_int(value) or not low <= value <= high:
        raise FrameCodecError(f"{kind} {name} ({value!r}) must be an int in [{low}, {high}]")
    return int(value)


@dataclass(frozen=True, slots=True)
class FrameCodec:
    """How a camera column's frames are kept: ``kind`` and the settings that kind takes.

    ``kind``: ``"raw"`` (the bytes as they are), ``"png"`` (lossless, per frame), ``"jpeg"``
    (per frame), ``"av1"`` / ``"h264"`` (a video stream per episode). Settings a kind does
    not take must stay None; those left None get the kind's defaults (see the module
    docstring for the numbers behind them):

    - ``level``: PNG zlib level 0-9 (1);
    - ``quality``: JPEG quality 1-100 (90);
    - ``crf``: video quality, lower is better (AV1 0-63: 30, H.264 0-51: 23);
    - ``preset``: SVT-AV1's speed 0-13 (12), x264's preset name (``"veryfast"``);
    - ``gop``: video keyframe spacing in frames (32; LeRobot uses 2);
    - ``pix_fmt``: video / JPEG chroma, ``"yuv420p"`` (default) or ``"yuv444p"`` (libsvtav1
      encodes 4:2:0 only; a 4:4:4 AV1 stream from elsewhere still decodes).

    Examples:
        >>> FrameCodec("av1") == FrameCodec("av1", crf=30, preset=12, gop=32, pix_fmt="yuv420p")
        True
        >>> FrameCodec.from_json(FrameCodec.jpeg(quality=95).to_json()).quality
        95
    """

    kind: str
    level: int | None = None
    quality: int | None = None
    crf: int | None = None
    preset: int | str | None = None
    gop: int | None = None
    pix_fmt: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FRAME_CODEC_KINDS:
            raise FrameCodecError(
                f"frame codec kind ({self.kind!r}) must be one of {', '.join(FRAME_CODEC_KINDS)}"
            )
        allowed = _SETTINGS[self.kind]
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if f.name not in allowed:
                if value is not None:
                    raise FrameCodecError(
                        f"{self.kind} frames take no {f.name} setting (got {value!r}); "
                        f"{self.kind} takes: {', '.join(allowed) or 'no settings'}"
                    )
            elif value is None:
                object.__setattr__(self, f.name, allowed[f.name])
            else:
                object.__setattr__(self, f.name, self._checked(f.name, value))

    def _checked(self, name: str, value: object) -> object:
        kind = self.kind
        if name == "level":
            return _int_setting(kind, name, value, 0, 9)
        if name == "quality":
            return _int_setting(kind, name, value, 1, 100)
        if name == "crf":
            return _int_setting(kind, name, value, *_CRF_RANGE[kind])
        if name == "gop":
            return _int_setting(kind, name, value, 1, 1 << 16)
        if name == "pix_fmt":
            if value not in PIX_FMTS:
                raise FrameCodecError(
                    f"{kind} pix_fmt ({value!r}) must be one of {', '.join(PIX_FMTS)}"
                )
            return value
        if kind == "av1":  # preset
            return _int_setting(kind, name, value, 0, 13)
        if value not in X264_PRESETS:
            raise FrameCodecError(
                f"h264 preset ({value!r}) must be one of x264's: {', '.join(X264_PRESETS)}"
            )
        return value

    # ------------------------------------------------------------------ constructors

    @classmethod
    def raw(cls) -> FrameCodec:
        """Frames kept as their bytes (no codec)."""
        return cls("raw")

    @classmethod
    def png(cls, level: int | None = None) -> FrameCodec:
        """Lossless PNG per frame (zlib ``level``, default 1)."""
        return cls("png", level=level)

    @classmethod
    def jpeg(cls, quality: int | None = None, pix_fmt: str | None = None) -> FrameCodec:
        """JPEG per frame (``quality`` default 90, 4:2:0 chroma unless ``"yuv444p"``)."""
        return cls("jpeg", quality=quality, pix_fmt=pix_fmt)

    @classmethod
    def av1(cls, **settings) -> FrameCodec:
        """AV1 (libsvtav1) with the defaults chosen for run reads (GOP 32); keywords override."""
        return cls("av1", **settings)

    @classmethod
    def h264(cls, **settings) -> FrameCodec:
        """H.264 (libx264) with the defaults (crf 23, veryfast, GOP 32); keywords override."""
        return cls("h264", **settings)

    @classmethod
    def lerobot_av1(cls) -> FrameCodec:
        """LeRobot's default camera encoding: AV1, yuv420p, GOP 2, crf 30, preset 12."""
        return cls("av1", **LEROBOT_AV1)

    @classmethod
    def from_lerobot_info(cls, info: dict) -> FrameCodec:
        """The codec a LeRobot video feature's ``info`` records (``video.codec``,
        ``video.pix_fmt``, and from lerobot 0.6 ``video.g`` / ``video.crf`` /
        ``video.preset``); settings it leaves out are LeRobot's defaults for that codec.
        A codec other than AV1 or H.264 (HEVC, say) raises FrameCodecError."""
        kind = info.get("video.codec")
        if kind not in VIDEO_KINDS:
            raise FrameCodecError(
                f"LeRobot video codec {kind!r} cannot be kept as packets; only "
                f"{' and '.join(VIDEO_KINDS)} can (re-encode the frames instead)"
            )
        base = dict(LEROBOT_AV1) if kind == "av1" else {"crf": 30, "preset": "medium", "gop": 2}
        for key, name in (("video.g", "gop"), ("video.crf", "crf"), ("video.preset", "preset")):
            value = info.get(key)
            if name == "preset" and kind == "h264" and not isinstance(value, str):
                value = None  # SVT's numeric preset recorded for an x264 stream: not x264's
            if value is not None:
                base[name] = value
        base["pix_fmt"] = info.get("video.pix_fmt") or "yuv420p"
        return cls(kind, **base)

    # ------------------------------------------------------------------ facts

    def describe(self) -> str:
        """``av1 crf 30 gop 32 (lossy)`` style text: the kind, its quality settings, lossy
        or not (what ``torchstore info`` shows for an encoded column)."""
        parts = [self.kind]
        for name in ("crf", "gop", "quality", "level"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value}")
        return " ".join(parts) + (" (lossy)" if self.lossy else " (exact)")

    @property
    def lossy(self) -> bool:
        """Whether decoding gives back other pixels than were encoded (JPEG and video)."""
        return self.kind not in ("raw", "png")

    @property
    def is_video(self) -> bool:
        """Whether packets depend on earlier ones (a run must start at a keyframe)."""
        return self.kind in VIDEO_KINDS

    def check_channels(self, channels: int) -> None:
        """Refuse a channel count this kind cannot keep (video: RGB only)."""
        if channels not in _CHANNELS[self.kind]:
            ok = ", ".join(map(str, _CHANNELS[self.kind]))
            raise FrameCodecError(
                f"{self.kind} frames cannot have {channels} channels (C must be {ok})"
            )

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> str:
        """The codec as a JSON object string: ``kind`` and the settings it takes."""
        return json.dumps(
            {"kind": self.kind, **{k: getattr(self, k) for k in _SETTINGS[self.kind]}},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | dict) -> FrameCodec:
        """The codec :meth:`to_json` wrote (a string or the parsed dict); FrameCodecError
        naming what is wrong (not JSON, no kind, an unknown key, a bad setting)."""
        if isinstance(text, str):
            try:
                text = json.loads(text)
            except ValueError as exc:
                raise FrameCodecError(f"a frame codec must be a JSON object: {exc}") from None
        if not isinstance(text, dict) or "kind" not in text:
            raise FrameCodecError(f"a frame codec must be a JSON object with a kind: {text!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(text) - known)
        if unknown:
            raise FrameCodecError(f"unknown frame codec setting {unknown[0]!r} in {text!r}")
        return cls(**text)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What decoding needs besides the packets: frame size, channels, the video pixel
    format (None for per-frame kinds) and the codec's ``extradata`` (video stream
    parameters, e.g. AV1's sequence header or H.264's SPS/PPS; empty otherwise)."""

    width: int
    height: int
    channels: int = 3
    pix_fmt: str | None = None
    extradata: bytes = b""

    def __post_init__(self) -> None:
        for name in ("width", "height", "channels"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise FrameCodecError(f"stream {name} ({value!r}) must be an int >= 1")
        object.__setattr__(self, "extradata", bytes(self.extradata))

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    def to_json(self) -> str:
        """As a JSON object string (``extradata`` in hex)."""
        return json.dumps(
            {
                "width": self.width,
                "height": self.height,
                "channels": self.channels,
                "pix_fmt": self.pix_fmt,
                "extradata": self.extradata.hex(),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | dict) -> StreamInfo:
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
            data["extradata"] = bytes.fromhex(data.get("extradata", ""))
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise FrameCodecError(f"not a stream info JSON object ({exc}): {text!r}") from None


@dataclass(frozen=True, slots=True, eq=False)
class EncodedFrames:
    """One episode's frames as packets: ``packets[i]`` holds frame ``i`` (video: in decode
    order, which is presentation order, as no frame is reordered), ``keyframes[i]`` says
    whether decoding may start there (every packet of a per-frame kind; frame 0 always)."""

    codec: FrameCodec
    info: StreamInfo
    packets: Sequence[bytes]
    keyframes: np.ndarray

    def __len__(self) -> int:
        return len(self.packets)

    @property
    def nbytes(self) -> int:
        """Bytes of all packets (what the column stores per episode, extradata aside)."""
        return sum(len(p) for p in self.packets)

    def packets_for(self, start: int, stop: int) -> tuple[Sequence[bytes], int]:
        """``(packets, first)`` to decode frames ``[start, stop)``: the run from the keyframe
        at or before ``start``, and how many decoded frames to drop (``first=``)."""
        if not 0 <= start < stop <= len(self.packets):
            raise FrameCodecError(
                f"frames [{start}, {stop}) are not a non-empty range of {len(self)} frames"
            )
        keys = np.flatnonzero(np.asarray(self.keyframes[: start + 1]))
        if not len(keys):
            raise FrameCodecError("frame 0 is not a keyframe: nothing here can be decoded", 0)
        key = int(keys[-1])
        return self.packets[key:stop], start - key
