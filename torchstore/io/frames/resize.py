"""Frames at training resolution: a crop and a resize applied once, where a frame is decoded.

Policies train at 96x96 to 224x224 from 480x640 cameras. Resizing a decoded block once,
as it enters memory, keeps the resident frames at the size the policy sees (a 224x224 RGB
row is 6.1x smaller than a 480x640 one: 6.1x the rows per byte of budget) and costs each
frame once instead of once per draw.

Where the resize is done, by codec (each the cheapest place measured):

- AV1 / H.264: in the ``sws_scale`` pass that converts the decoder's YUV to RGB anyway
  (``VideoReformatter.reformat(width=, height=)``). 480x640 to 224x224 costs 0.46 ms of
  one core with ``area`` against 0.17 ms for the full-size conversion, while Pillow's
  resize of the full-size RGB frame costs 2.2 ms; libdav1d's decode is 1.7 ms;
- JPEG: libjpeg-turbo decodes at 1/2, 1/4 or 1/8 scale in the DCT domain (simplejpeg's
  ``min_height`` / ``min_width``: the smallest scale still at least the target), then
  Pillow resizes the smaller image to the exact size;
- PNG and raw columns: Pillow (which releases the GIL) on the decoded frame; floating
  point frames (a simulator's renders in [0, 1], say) through ``torch`` (antialiased).

A crop (``crop=(top, left, height, width)`` in source pixels) comes first, then the resize;
with a crop, video frames are converted at full size, cropped and resized by Pillow (sws
cannot crop).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchstore.errors import ArgumentError

__all__ = ["FrameResize", "INTERPOLATIONS", "frame_resizes", "is_camera_shape"]

#: interpolation name -> (PyAV/sws name, Pillow filter name, torch mode)
INTERPOLATIONS = {
    "area": ("AREA", "BOX", "area"),
    "bilinear": ("BILINEAR", "BILINEAR", "bilinear"),
    "bicubic": ("BICUBIC", "BICUBIC", "bicubic"),
    "nearest": ("POINT", "NEAREST", "nearest"),
}
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _positive(name: str, value: Any, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ArgumentError(f"{name} ({value!r}) must be an int >= {least}")
    return int(value)


@dataclass(frozen=True)
class FrameResize:
    """Crop then resize each frame of a camera column to ``[height, width]``.

    Args:
        height, width: the size frames are kept and served at.
        crop: ``(top, left, height, width)`` of the source frame to keep first, or None.
        interpolation: ``"area"`` (the default: the mean over each output pixel's
            footprint, the right filter to shrink by), ``"bilinear"``, ``"bicubic"`` or
            ``"nearest"``.
    """

    height: int
    width: int
    crop: tuple[int, int, int, int] | None = None
    interpolation: str = "area"

    def __post_init__(self) -> None:
        object.__setattr__(self, "height", _positive("resize height", self.height))
        object.__setattr__(self, "width", _positive("resize width", self.width))
        if self.crop is not None:
            crop = tuple(self.crop)
            if len(crop) != 4:
                raise ArgumentError(f"crop {self.crop!r} must be (top, left, height, width)")
            crop = (
                _positive("crop top", crop[0], 0),
                _positive("crop left", crop[1], 0),
                _positive("crop height", crop[2]),
                _positive("crop width", crop[3]),
            )
            object.__setattr__(self, "crop", crop)
        if self.interpolation not in INTERPOLATIONS:
            raise ArgumentError(
                f"interpolation {self.interpolation!r} is not one of {sorted(INTERPOLATIONS)}"
            )

    @classmethod
    def of(cls, value: Any) -> FrameResize:
        """A :class:`FrameResize` from what a config holds: ``[H, W]``, a mapping of the
        fields (``{"height": 224, "width": 224, "crop": [0, 80, 480, 480]}``) or one."""
        if isinstance(value, FrameResize):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"height", "width", "crop", "interpolation"}
            if unknown:
                raise ArgumentError(f"resize {dict(value)!r}: unknown keys {sorted(unknown)}")
            crop = value.get("crop")
            return cls(
                value.get("height"),
                value.get("width"),
                None if crop is None else tuple(crop),
                value.get("interpolation", "area"),
            )
        if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
            return cls(value[0], value[1])
        raise ArgumentError(
            f"resize {value!r} must be [height, width] or {{height, width, crop, interpolation}}"
        )

    def check_source(self, shape: Sequence[int], what: str) -> None:
        """Refuse a crop that does not fit the source frames ``[H, W, C]`` of ``what``."""
        if len(shape) != 3:
            raise ArgumentError(f"{what} is {list(shape)}, not a camera column [H, W, C]")
        if self.crop is not None:
            top, left, h, w = self.crop
            if top + h > shape[0] or left + w > shape[1]:
                raise ArgumentError(
                    f"{what}: crop {list(self.crop)} (top, left, height, width) does not fit "
                    f"its {shape[0]}x{shape[1]} frames"
                )

    def shape(self, source: Sequence[int]) -> tuple[int, int, int]:
        """The shape ``[H, W, C]`` frames of shape ``source`` are kept at."""
        return (self.height, self.width, int(source[-1]))

    @property
    def sws_interpolation(self) -> str:
        return INTERPOLATIONS[self.interpolation][0]

    def cropped(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` (``[..., H, W, C]``) cut to the crop (a view), or as they are."""
        if self.crop is None:
            return frames
        top, left, h, w = self.crop
        return frames[..., top : top + h, left : left + w, :]

    def apply(self, frames: Any, out: Any = None) -> Any:
        """Crop and resize ``frames`` (``[H, W, C]`` or ``[n, H, W, C]``, a numpy array or
        a tensor: uint8 through Pillow, floats through torch) into ``out`` (returned) or a
        new array of the same kind."""
        if hasattr(frames, "detach"):  # a torch tensor
            return self._apply_torch(frames, out)
        frames = np.asarray(frames)
        if frames.ndim == 3:
            done = self.apply(frames[None], None if out is None else out[None])
            return done[0] if out is None else out
        src = self.cropped(frames)
        if out is None:
            out = np.empty((len(src), *self.shape(src.shape)), src.dtype)
        if src.dtype == np.uint8 and src.shape[-1] in _PIL_MODES:
            self._pillow(src, out)
        else:
            import torch

            out[...] = self._resize_torch(torch.from_numpy(np.ascontiguousarray(src))).numpy()
        return out

    def _pillow(self, src: np.ndarray, out: np.ndarray) -> None:
        from PIL import Image

        resample = getattr(Image.Resampling, INTERPOLATIONS[self.interpolation][1])
        channels = src.shape[-1]
        for k in range(len(src)):
            frame = src[k, ..., 0] if channels == 1 else src[k]
            image = Image.fromarray(np.ascontiguousarray(frame), _PIL_MODES[channels])
            if image.size != (self.width, self.height):
                image = image.resize((self.width, self.height), resample)
            out[k] = np.asarray(image).reshape(out.shape[1:])

    def _apply_torch(self, frames: Any, out: Any) -> Any:
        single = frames.dim() == 3
        x = frames[None] if single else frames
        if self.crop is not None:
            top, left, h, w = self.crop
            x = x[..., top : top + h, left : left + w, :]
        y = self._resize_torch(x)
        y = y[0] if single else y
        if out is None:
            return y
        out.copy_(y)
        return out

    def _resize_torch(self, x: Any) -> Any:
        """``x`` (a ``[n, H, W, C]`` tensor) resized, in its dtype (integers rounded)."""
        import torch
        import torch.nn.functional as F

        mode = INTERPOLATIONS[self.interpolation][2]
        y = x.permute(0, 3, 1, 2).float()
        if tuple(y.shape[-2:]) != (self.height, self.width):
            extra = (
                {} if mode in ("area", "nearest") else {"align_corners": False, "antialias": True}
            )
            y = F.interpolate(y, size=(self.height, self.width), mode=mode, **extra)
        y = y.permute(0, 2, 3, 1)
        if not x.dtype.is_floating_point:
            info = torch.iinfo(x.dtype)
            y = y.round().clamp(info.min, info.max)
        return y.to(x.dtype).contiguous()


def is_camera_shape(shape: Sequence[int]) -> bool:
    """Whether a column of rows ``shape`` holds frames: ``[H, W, C]`` with 1, 3 or 4 channels."""
    return len(shape) == 3 and int(shape[-1]) in _PIL_MODES


def frame_resizes(
    resize: Any, shapes: Mapping[str, Sequence[int]], *, what: str = "resize"
) -> dict[str, FrameResize]:
    """``{column: FrameResize}`` from what a DataModule or window is given: ``None``; one
    size for every camera column of ``shapes`` (``[H, W]``, a mapping of its fields, or a
    :class:`FrameResize`); or ``{column: size}``. A column named that is not read here or
    is not a camera column (:func:`is_camera_shape`) is refused, naming it."""
    if resize is None:
        return {}
    if isinstance(resize, Mapping) and not {"height", "width"} & set(resize):
        out = {}
        for name, value in resize.items():
            if name not in shapes:
                raise ArgumentError(
                    f"{what}: {name!r} is not a column read here ({sorted(shapes)})"
                )
            if not is_camera_shape(shapes[name]):
                raise ArgumentError(
                    f"{what}: {name!r} holds {list(shapes[name])} rows, not camera frames [H, W, C]"
                )
            spec = FrameResize.of(value)
            spec.check_source(shapes[name], f"{what} of {name!r}")
            out[name] = spec
        return out
    spec = FrameResize.of(resize)
    cameras = {name: shape for name, shape in shapes.items() if is_camera_shape(shape)}
    if not cameras:
        raise ArgumentError(
            f"{what} {resize!r}: none of the columns read ({sorted(shapes)}) holds camera "
            "frames [H, W, C]"
        )
    for name, shape in cameras.items():
        spec.check_source(shape, f"{what} of {name!r}")
    return dict.fromkeys(cameras, spec)
