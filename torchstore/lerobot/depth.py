"""Depth-map videos as lerobot 0.6 records them: 12-bit codes, back to metres.

A video feature whose ``info`` says ``is_depth_map`` (``video.is_depth_map`` in lerobot
0.4) holds depth quantised to codes ``0..4095`` in a high-bit-depth grey (or luma) plane,
lossless HEVC by default. The codes map linearly, or logarithmically (``video.use_log``),
onto ``[video.depth_min, video.depth_max]`` metres, with ``video.shift`` metres added
before the logarithm. The import reads the codes as stored (no colour conversion) and
turns them into float32 metres, ``[H, W, 1]`` per frame, with lerobot's own arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.features import Feature

__all__ = ["DEPTH_QMAX", "DepthCoding", "is_depth", "depth_coding"]

DEPTH_QMAX = 4095  # 12-bit codes


def is_depth(feature: Feature) -> bool:
    """Whether a video feature holds a depth map (either library version's key)."""
    info = feature.info or {}
    return feature.is_video and bool(info.get("is_depth_map") or info.get("video.is_depth_map"))


@dataclass(frozen=True)
class DepthCoding:
    depth_min: float
    depth_max: float
    shift: float
    use_log: bool

    def metres(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[..., H, W, 1]`` as float32 metres, clipped to ``[depth_min, depth_max]``."""
        if self.use_log:
            low = math.log(self.depth_min + self.shift)
            scale, offset = (math.log(self.depth_max + self.shift) - low) / DEPTH_QMAX, low
        else:
            scale, offset = (self.depth_max - self.depth_min) / DEPTH_QMAX, self.depth_min
        out = np.empty(codes.shape, dtype=np.float32)
        np.multiply(codes, scale, out=out)
        np.add(out, offset, out=out)
        if self.use_log:
            np.exp(out, out=out)
            np.subtract(out, self.shift, out=out)
        np.clip(out, self.depth_min, self.depth_max, out=out)
        return out


def depth_coding(feature: Feature, *, source: str) -> DepthCoding:
    """The quantisation a depth feature's ``info`` records; every key checked."""
    info = feature.info or {}
    values = {}
    for key in ("video.depth_min", "video.depth_max", "video.shift"):
        value = info.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise LeRobotFormatError(
                f"{source}: depth feature {feature.name!r} needs a number for "
                f"info[{key!r}], got {value!r}"
            )
        values[key] = float(value)
    use_log = info.get("video.use_log")
    if not isinstance(use_log, bool):
        raise LeRobotFormatError(
            f"{source}: depth feature {feature.name!r} needs true/false for "
            f"info['video.use_log'], got {use_log!r}"
        )
    coding = DepthCoding(
        values["video.depth_min"], values["video.depth_max"], values["video.shift"], use_log
    )
    if not coding.depth_min < coding.depth_max or (
        use_log and coding.depth_min + coding.shift <= 0
    ):
        raise LeRobotFormatError(
            f"{source}: depth feature {feature.name!r} has depth_min {coding.depth_min}, depth_max "
            f"{coding.depth_max}, shift {coding.shift}: needs depth_min < depth_max and, for the "
            "logarithm, depth_min + shift > 0"
        )
    return coding
