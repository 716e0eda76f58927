"""The video cameras of a :class:`~torchstore.lerobot.writer.LeRobotWriter`: encoding an
episode on a worker thread, staging its MP4 at save, and the encoder settings.

Each video feature has a current MP4 (``videos/<key>/chunk-XXX/file-YYY.mp4``) and, while
an episode is recorded, a scratch MP4 under the writer's scratch folder that a
:class:`~torchstore.io.frames.background_encoder.BackgroundVideoEncoder` fills, or that the
episode's packets, already encoded, are muxed into as they are (an export of a store that
keeps them, :func:`~torchstore.io.frames.codec.write_mp4`). At save the
scratch file is appended to (or becomes) the camera's next file under a temporary name;
the writer renames it into place with the rest of the episode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.features import Feature
from torchstore.lerobot.info import video_feature_info
from torchstore.lerobot.layout import SCRATCH_DIR, video_path

__all__ = ["CameraFile", "CamerasMixin", "PacketsWritten", "encoder_settings"]


def encoder_settings(video_encoder: Any = None):
    """An :class:`~torchstore.io.frames.video.EncoderSettings` from what a caller passed: one
    itself, a short name (``"av1"``, ``"h264"``), or None for LeRobot's defaults (AV1)."""
    from torchstore.io.frames.video import EncoderSettings

    if video_encoder is None:
        return EncoderSettings()
    if isinstance(video_encoder, str):
        return EncoderSettings.named(video_encoder)
    if not isinstance(video_encoder, EncoderSettings):
        raise LeRobotFormatError(
            "video_encoder must be an EncoderSettings, 'av1', 'h264' or None, "
            f"got {type(video_encoder).__name__}"
        )
    return video_encoder


class CameraFile:
    """One video feature: its current MP4 and the scratch MP4 of the episode in progress."""

    def __init__(self, key: str):
        self.key = key
        self.chunk = 0  # where its next file goes
        self.file = 0
        self.encoder = None  # a BackgroundVideoEncoder (or PacketsWritten) while recording
        self.scratch: Path | None = None
        self.copied = False  # some episode came as packets: its stream may differ from others'


class PacketsWritten:
    """An episode whose packets were muxed into its scratch MP4 at once: the encoder's
    ``close`` / ``abort`` for the save and discard steps."""

    def __init__(self, scratch: Path, frames: int):
        self.scratch, self.frames = scratch, frames

    def close(self) -> int:
        return self.frames

    def abort(self) -> None:
        self.scratch.unlink(missing_ok=True)


class CamerasMixin:
    """The writer's camera steps; it keeps ``self._cameras`` ``{key: CameraFile}``."""

    def _encode(self, name: str, frames: np.ndarray) -> None:
        from torchstore.io.frames.background_encoder import BackgroundVideoEncoder

        cam = self._cameras[name]
        if cam.encoder is None:
            scratch = self.root / SCRATCH_DIR / name
            scratch.mkdir(parents=True, exist_ok=True)
            cam.scratch = scratch / f"episode-{self._num_episodes:06d}.mp4"
            h, w, _ = self.features[name].hwc
            cam.encoder = BackgroundVideoEncoder(
                cam.scratch, fps=self.fps, width=w, height=h, settings=self._encoder
            )
        for frame in frames:
            cam.encoder.add(frame)

    def _copy_packets(self, name: str, encoded) -> None:
        """Camera ``name``'s episode from packets already encoded (an EncodedFrames):
        muxed into its scratch MP4 as they are, no re-encode."""
        from torchstore.io.frames.codec import write_mp4

        cam = self._cameras[name]
        scratch = self.root / SCRATCH_DIR / name
        scratch.mkdir(parents=True, exist_ok=True)
        cam.scratch = scratch / f"episode-{self._num_episodes:06d}.mp4"
        write_mp4(cam.scratch, encoded, self.fps)
        cam.encoder = PacketsWritten(cam.scratch, len(encoded))
        cam.copied = True

    def _abort_encoders(self) -> None:
        """Drop the episode in progress of every camera (its scratch file is left to close)."""
        for cam in self._cameras.values():
            if cam.encoder is not None:
                cam.encoder.abort()
            cam.encoder, cam.scratch = None, None

    def _finish_encoding(self, key: str, cam: CameraFile, n: int) -> None:
        """Wait for ``cam``'s encoder; refuse an episode whose video lacks frames."""
        frames = cam.encoder.close()
        if frames != n:
            raise LeRobotFormatError(f"camera {key!r} encoded {frames} frames, the episode has {n}")

    def _stage_videos(
        self, n: int, staged: list[Path]
    ) -> dict[str, tuple[Path, Path, tuple[int, int], float, float]]:
        """Each camera's episode as its next MP4 under a temporary name (added to ``staged``):
        ``{key: (tmp, target, (chunk, file), from_timestamp, to_timestamp)}``."""
        from torchstore.io.frames.video import append_video, probe_video

        videos = {}
        for key, cam in self._cameras.items():
            self._finish_encoding(key, cam, n)
            pos = (cam.chunk, cam.file)
            target = self.root / video_path(key, *pos)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
            staged.append(tmp)
            start, end = append_video(None, cam.scratch, tmp)
            videos[key] = (tmp, target, pos, start, end)
            if self.features[key].info is None:  # stream facts go into info.json with episode 0
                self._set_video_info(key, probe_video(tmp))
        return videos

    def _set_video_info(self, key: str, probed) -> None:
        feature = self.features[key]
        info = video_feature_info(probed, encoder=self._encoder)
        self.features[key] = Feature(
            feature.name, feature.dtype, feature.shape, feature.names, info, feature.extra
        )
        self.info["features"][key]["info"] = info
