"""The MP4 container side of camera videos: open, probe, check packets, copy streams.

Everything here works on packets and stream facts, never on pixels, so it needs no codec:
:func:`probe_video` states a file's stream facts and refuses a file cut short;
:func:`append_video` / :func:`concat_videos` join episode files by stream copy (no
re-encode), shifting each one to start right after the previous one's last frame. The
codec sides build on it: :mod:`torchstore.io.frames.video_encode` writes the episode files and
:mod:`torchstore.io.frames.video` reads frames back (and re-exports every public name here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from torchstore.errors import VideoError
from torchstore.extras import install_hint
from torchstore.validation import int_at_least, positive_int

__all__ = ["VideoInfo", "require_av", "probe_video", "append_video", "concat_videos"]

_MUX_OPTIONS = {"movflags": "faststart"}  # index first, as LeRobot writes its files


def require_av():
    """The ``av`` module (PyAV), or an ImportError naming the extra to install."""
    try:
        import av
    except ImportError as exc:
        raise ImportError(f"video files need PyAV: {install_hint('video', 'lerobot')}") from exc
    return av


def _av_errors() -> tuple[type[BaseException], ...]:
    """The exceptions PyAV raises for bad files and bad arguments (never our own)."""
    return (require_av().error.FFmpegError, OSError, EOFError)


def _reason(exc: BaseException) -> str:
    """A PyAV error as a short phrase, without errno noise."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


# --------------------------------------------------------------------------- probing


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """Stream facts of a video file's first video stream."""

    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    frames: int
    duration_s: float
    has_audio: bool

    @property
    def channels(self) -> int:
        """Colour channels of the pixel format (gray 1, with alpha 4, else 3)."""
        return _channels(self.pix_fmt)


def _channels(pix_fmt: str) -> int:
    """Colour channels a pixel format carries (gray 1, with alpha 4, else 3)."""
    if pix_fmt.startswith(("gray", "y8", "y16")):
        return 1
    if pix_fmt.startswith(("yuva", "rgba", "bgra", "argb", "abgr", "ya")):
        return 4
    return 3


def _open_input(path: Path):
    """``(container, first video stream)`` of an existing, parseable file, or VideoError."""
    av = require_av()
    if not path.is_file():
        raise VideoError(f"{path} is missing")
    try:
        container = av.open(str(path), "r")
    except _av_errors() as exc:
        raise VideoError(f"{path} is not a readable video file: {_reason(exc)}") from exc
    if not container.streams.video:
        container.close()
        raise VideoError(f"{path} has no video stream (truncated or not a video file)")
    stream = container.streams.video[0]
    if stream.codec_context is None:  # the sample entry names a codec FFmpeg does not know
        container.close()
        raise VideoError(
            f"{path}: its video stream is in a codec FFmpeg does not know (the file's sample "
            "entry names none it decodes), so its frames cannot be read"
        )
    return container, stream


def _stream_facts(path: Path, container, stream) -> dict[str, Any]:
    """Codec, size, pixel format and rate of ``stream`` (what appending must keep equal)."""
    ctx = stream.codec_context
    if not ctx.pix_fmt or not ctx.width or not ctx.height:
        raise VideoError(f"{path} has a video stream without size or pixel format")
    rate = _nominal_rate(stream)
    if not rate:
        raise VideoError(f"{path} does not state its frame rate")
    return {
        "codec": ctx.codec.canonical_name,
        "width": ctx.width,
        "height": ctx.height,
        "pix_fmt": ctx.pix_fmt,
        "fps": Fraction(rate),
    }


def _nominal_rate(stream) -> Fraction | None:
    """The rate the frames are timed on (a dropped frame lowers the average rate, not this)."""
    return stream.guessed_rate or stream.average_rate


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Stream facts of ``path``, checking that its last frame is actually in the file.

    The check seeks to the last keyframe and reads the packets from there to the end, so a
    file cut short (a crashed copy, a partial download) is refused here, cheaply.
    """
    path = Path(path)
    container, stream = _open_input(path)
    try:
        facts = _stream_facts(path, container, stream)
        frames, duration = _frames_and_duration(path, container, stream, facts["fps"])
        return VideoInfo(
            codec=facts["codec"],
            width=facts["width"],
            height=facts["height"],
            pix_fmt=facts["pix_fmt"],
            fps=float(stream.average_rate or facts["fps"]),
            frames=frames,
            duration_s=float(duration),
            has_audio=bool(container.streams.audio),
        )
    except _av_errors() as exc:
        raise VideoError(f"{path} cannot be probed: {_reason(exc)}") from exc
    finally:
        container.close()


def _frames_and_duration(path: Path, container, stream, fps: Fraction) -> tuple[int, Fraction]:
    """Frame count and duration (seconds) the container states, verified against its data."""
    tb = stream.time_base
    start = stream.start_time or 0
    if not stream.frames or not stream.duration:
        count, end = _scan(path, container, stream, fps)  # nothing stated: count the packets
        if not count:
            raise VideoError(f"{path} holds no video frames")
        return count, end - start * tb
    end = (start + stream.duration) * tb
    container.seek(start + stream.duration - 1, stream=stream, backward=True, any_frame=False)
    count, tail_end = _scan(path, container, stream, fps)
    if not count or tail_end < end:
        raise VideoError(
            f"{path} is truncated: the container lists {stream.frames} frames "
            f"({float(end):.3f} s) but the data of the last ones is missing"
        )
    return stream.frames, end - start * tb


def _packets(path: Path, container, stream) -> Iterator:
    """The remaining packets of ``stream``, refusing partial (cut-off) ones."""
    for packet in container.demux(stream):
        if packet.size == 0:  # the demuxer's end-of-stream marker
            continue
        _check_packet(path, packet)
        yield packet


def _scan(path: Path, container, stream, fps: Fraction) -> tuple[int, Fraction]:
    """How many packets remain, and when the last of their frames ends (seconds)."""
    count, end = 0, Fraction(0)
    for packet in _packets(path, container, stream):
        count += 1
        end = max(end, _packet_end(packet, fps))
    return count, end


def _check_packet(path: Path, packet) -> None:
    """Refuse a packet the demuxer flagged as cut off, or one without timestamps."""
    if packet.is_corrupt:
        at = f"{float(packet.pts * packet.time_base):.3f} s" if packet.pts is not None else "?"
        raise VideoError(f"{path} is truncated or corrupt: the packet at {at} is incomplete")
    if packet.pts is None or packet.dts is None:
        raise VideoError(f"{path} has a video packet without timestamps")


def _packet_end(packet, fps: Fraction) -> Fraction:
    """When ``packet``'s frame ends, in seconds (one frame period if the file does not say)."""
    tb = packet.time_base
    return packet.pts * tb + (packet.duration * tb if packet.duration else 1 / fps)


# --------------------------------------------------------------------------- shared checks
# argument checks the encoder and the reader share; failures are VideoError


def _check_int(name: str, value: object, low: int, *, optional: bool = True) -> None:
    int_at_least(name, value, low, allow_none=optional, error=VideoError)


def _check_fps(fps: object) -> int:
    return positive_int("fps", fps, error=VideoError)


# --------------------------------------------------------------------------- appending


def append_video(current: Path | None, episode: Path, out: Path) -> tuple[float, float]:
    """Write ``out`` = the packets of ``current`` (None or missing: a new file) then ``episode``.

    Stream copy, no re-encode: ``current`` keeps its timestamps and ``episode``'s are shifted
    to start right after ``current``'s last frame. Returns the episode's ``(from_timestamp,
    to_timestamp)`` inside ``out`` in seconds: from = the end of ``current`` (its duration;
    0.0 for a new file), to = from + the episode's duration. Refuses files that differ in
    codec, size, pix_fmt, fps or codec headers. ``out`` must differ from both inputs (the
    caller renames it into place); it is deleted again if writing fails.
    """
    episode, out = Path(episode), Path(out)
    current = Path(current) if current is not None and Path(current).exists() else None
    for source in (current, episode):
        if source is not None and source.resolve() == out.resolve():
            raise VideoError(f"append_video: out ({out}) must differ from its input {source}")
    sources = [p for p in (current, episode) if p is not None]
    inputs = []
    try:
        for source in sources:
            inputs.append(_open_input(source))
        facts = [_append_facts(p, c, s) for p, (c, s) in zip(sources, inputs)]
        if current is not None:
            _check_appendable(current, episode, facts[0], facts[1])
        begin, end = _remux(out, sources, inputs, facts[-1]["fps"])
    finally:
        for container, _ in inputs:
            container.close()
    return float(begin), float(end)


def concat_videos(
    sources: Sequence[str | os.PathLike], out: str | os.PathLike
) -> list[tuple[float, float]]:
    """Write ``out`` = the packets of every file in ``sources``, back to back (stream copy).

    Like :func:`append_video` for many files, one open at a time: the first keeps its
    timestamps, each next one starts where the previous ended. Returns each source's
    ``(from_timestamp, to_timestamp)`` inside ``out`` in seconds. Refuses files that differ
    from the first in codec, size, pix_fmt, fps or codec headers; ``out`` must not be one
    of the sources, and is deleted again if writing fails.
    """
    paths, out = [Path(p) for p in sources], Path(out)
    if not paths:
        raise VideoError("concat_videos needs at least one source")
    if any(p.resolve() == out.resolve() for p in paths):
        raise VideoError(f"concat_videos: out ({out}) must differ from its inputs")
    remuxer, first, spans = None, None, []
    try:
        for path in paths:
            container, stream = _open_input(path)
            try:
                facts = _append_facts(path, container, stream)
                if first is None:
                    first = facts
                    remuxer = _Remuxer(out, facts["fps"])
                else:
                    _check_appendable(paths[0], path, first, facts)
                begin, end = remuxer.copy(path, container, stream)
            finally:
                container.close()
            spans.append((float(begin), float(end)))
        remuxer.close()
    except BaseException as exc:
        if remuxer is not None:
            remuxer.discard()
        if isinstance(exc, _av_errors()):
            raise VideoError(f"cannot write {out} from {len(paths)} files: {_reason(exc)}") from exc
        raise
    return spans


def _append_facts(path: Path, container, stream) -> dict[str, Any]:
    facts = _stream_facts(path, container, stream)
    facts["extradata"] = bytes(stream.codec_context.extradata or b"")
    return facts


def _check_appendable(current: Path, episode: Path, a: dict, b: dict) -> None:
    """Refuse to concatenate streams a decoder could not read as one."""
    for key in ("codec", "width", "height", "pix_fmt", "fps"):
        if a[key] != b[key]:
            raise VideoError(
                f"cannot append {episode} to {current}: {key} differs "
                f"({b[key]} in the episode, {a[key]} in the file)"
            )
    if a["extradata"] != b["extradata"]:
        raise VideoError(
            f"cannot append {episode} to {current}: the {a['codec']} stream headers differ "
            "(encoded with other settings); encode the episode with the file's settings"
        )


def _remux(
    out: Path, sources: list[Path], inputs: list, fps: Fraction
) -> tuple[Fraction, Fraction]:
    """Copy every input into ``out``, one after the other; returns the last one's span (s)."""
    remuxer = None
    try:
        remuxer = _Remuxer(out, fps)
        for path, (container, stream) in zip(sources, inputs):
            span = remuxer.copy(path, container, stream)
        remuxer.close()
        return span
    except BaseException as exc:
        if remuxer is not None:
            remuxer.discard()
        if isinstance(exc, _av_errors()):
            names = " + ".join(map(str, sources))
            raise VideoError(f"cannot write {out} from {names}: {_reason(exc)}") from exc
        raise


class _Remuxer:
    """Copies the packets of several inputs into one output stream, back to back."""

    def __init__(self, out: Path, fps: Fraction) -> None:
        self.out, self.fps = out, fps
        self.container = require_av().open(str(out), "w", format="mp4", options=_MUX_OPTIONS)
        self.stream = None
        self.end: Fraction | None = None  # seconds: where the next input starts
        self.last_dts: Fraction | None = None

    def copy(self, path: Path, container, stream) -> tuple[Fraction, Fraction]:
        """Append ``stream``'s packets; returns where they start and end in the output (s)."""
        start = (stream.start_time or 0) * stream.time_base
        if self.stream is None:  # the first input keeps its timestamps
            self.stream = self.container.add_stream_from_template(stream, opaque=True)
            self.end = start
        begin, end, count = self.end, self.end, 0
        for packet in _packets(path, container, stream):
            end = max(end, _packet_end(packet, self.fps) - start + begin)
            self._mux(path, packet, begin - start)
            count += 1
        if not count:
            raise VideoError(f"{path} holds no video frames")
        self.end = end
        return begin, end

    def _mux(self, path: Path, packet, shift_s: Fraction) -> None:
        shift = round(shift_s / packet.time_base)
        packet.pts += shift
        packet.dts += shift
        dts = packet.dts * packet.time_base
        if self.last_dts is not None and dts <= self.last_dts:
            raise VideoError(
                f"cannot append {path}: its decode timestamps would overlap the file's "
                "(another B-frame delay); encode the episode with the file's settings"
            )
        self.last_dts = dts
        packet.stream = self.stream
        self.container.mux(packet)

    def close(self) -> None:
        self.container.close()

    def discard(self) -> None:
        """Close and delete the unfinished output."""
        try:
            self.container.close()
        except _av_errors():
            pass  # an unfinished file may fail to close; it is deleted next anyway
        self.out.unlink(missing_ok=True)
