"""Per-batch image augmentation on the batch's device: random shift (DrQ) and colour jitter.

A DataModule's ``augment=`` names, per camera column, what is applied to every training
batch (never to validation batches) after the frames are gathered, on the device they are
gathered on. An augmentation is any callable taking and returning a tensor of frames
``[..., C, H, W]`` (channels first, the layout torchvision v2 transforms take, so a
``torchvision.transforms.v2`` transform works as it is); the batch's ``[B, (T,) H, W, C]``
frames are handed over as a channels-first view and put back as they came.

The two here are the ones pixel-based RL and imitation learning use most, written for
whole batches: every sample draws its own shift and its own jitter (a torchvision v2
transform called on a batch draws one for all), and the frames of one sample's history
share them, so a history stays one consistent view. Both take a ``generator``: the
DataModule seeds one per batch from its seed, rank and stream position, so a resumed run
augments exactly as the original did.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchstore.errors import ArgumentError

__all__ = ["BatchAugment", "ColorJitter", "RandomShift", "batch_augments", "apply_augments"]


class BatchAugment(abc.ABC):
    """An augmentation drawn per sample (dim 0) from a ``generator`` the caller seeds."""

    @abc.abstractmethod
    def __call__(
        self, frames: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``frames`` (``[B, ..., C, H, W]``) augmented, each sample by its own draw."""

    def _per_sample(self, frames: torch.Tensor, generator, low: float, high: float):
        """Uniform ``[B, 1, ..., 1]`` factors in ``[low, high)``, broadcast over a sample."""
        shape = (frames.shape[0],) + (1,) * (frames.dim() - 1)
        u = torch.rand(shape, generator=generator, device=frames.device)
        return low + (high - low) * u


class RandomShift(BatchAugment):
    """DrQ's random shift: each sample's frames moved by up to ``pad`` pixels in each
    direction, the border pixels repeated where the frame is moved away (the same as
    replicate-padding by ``pad`` and cropping back at a random place), size unchanged."""

    def __init__(self, pad: int = 4):
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            raise ArgumentError(f"pad ({pad!r}) must be an int >= 0")
        self.pad = pad

    def __call__(self, frames: torch.Tensor, generator: torch.Generator | None = None):
        if self.pad == 0:
            return frames
        b, (h, w) = frames.shape[0], frames.shape[-2:]
        shift = torch.randint(
            -self.pad, self.pad + 1, (2, b), generator=generator, device=frames.device
        )
        rows = (torch.arange(h, device=frames.device) + shift[0, :, None]).clamp_(0, h - 1)
        cols = (torch.arange(w, device=frames.device) + shift[1, :, None]).clamp_(0, w - 1)
        lead = (b,) + (1,) * (frames.dim() - 3)
        rows = rows.reshape(*lead, h, 1).expand(*frames.shape[:-2], h, w)
        shifted = frames.gather(-2, rows)
        cols = cols.reshape(*lead, 1, w).expand(*frames.shape[:-2], h, w)
        return shifted.gather(-1, cols)

    def __repr__(self) -> str:
        return f"RandomShift(pad={self.pad})"


class ColorJitter(BatchAugment):
    """Brightness, contrast and saturation each scaled by a factor drawn per sample from
    ``[1 - x, 1 + x]`` (torchvision's definitions, without hue). uint8 frames stay uint8
    (rounded, clipped to 0..255); float frames are taken to lie in ``[0, 1]``."""

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0):
        for name, value in (
            ("brightness", brightness),
            ("contrast", contrast),
            ("saturation", saturation),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 1
            ):
                raise ArgumentError(f"{name} ({value!r}) must be a number in [0, 1]")
        self.brightness, self.contrast, self.saturation = (
            float(brightness),
            float(contrast),
            float(saturation),
        )

    def __call__(self, frames: torch.Tensor, generator: torch.Generator | None = None):
        integer = not frames.dtype.is_floating_point
        x = frames.float() / 255.0 if integer else frames
        if self.brightness:
            x = x * self._per_sample(x, generator, 1 - self.brightness, 1 + self.brightness)
        if self.contrast or self.saturation:
            gray = _gray(x)
            if self.contrast:
                mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
                f = self._per_sample(x, generator, 1 - self.contrast, 1 + self.contrast)
                x = mean + f * (x - mean)
                gray = _gray(x) if self.saturation else gray
            if self.saturation:
                f = self._per_sample(x, generator, 1 - self.saturation, 1 + self.saturation)
                x = gray + f * (x - gray)
        x = x.clamp(0.0, 1.0)
        return (x * 255.0).round_().to(frames.dtype) if integer else x.to(frames.dtype)

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation})"
        )


def _gray(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma of ``[..., C, H, W]`` frames, ``[..., 1, H, W]`` (1 channel: itself)."""
    if x.shape[-3] == 1:
        return x
    r, g, b = x[..., 0:1, :, :], x[..., 1:2, :, :], x[..., 2:3, :, :]
    return 0.299 * r + 0.587 * g + 0.114 * b


def _pipeline(value: Any, what: str) -> list[Callable]:
    fns = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    for fn in fns:
        if not callable(fn):
            raise ArgumentError(f"{what}: {fn!r} is not callable (an augmentation takes frames)")
    return fns


def batch_augments(
    augment: Any, cameras: Sequence[str], *, what: str = "augment"
) -> dict[str, list[Callable]]:
    """``{column: [augmentation, ...]}`` from ``augment=``: None; a callable or a list of
    them (for every camera column in ``cameras``); or ``{column: callable or list}``, each
    column one of ``cameras`` (another is refused, naming it)."""
    if augment is None:
        return {}
    if isinstance(augment, Mapping):
        out = {}
        for name, value in augment.items():
            if name not in cameras:
                raise ArgumentError(
                    f"{what}: {name!r} is not a camera column of the batch ({list(cameras)})"
                )
            out[name] = _pipeline(value, f"{what} of {name!r}")
        return out
    if not cameras:
        raise ArgumentError(f"{what} {augment!r}: the batch has no camera column [H, W, C]")
    fns = _pipeline(augment, what)
    return dict.fromkeys(cameras, fns)


def apply_augments(
    fns: Sequence[Callable], frames: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """``frames`` (``[B, ..., H, W, C]``) through ``fns`` in order, channels first while they
    run; a :class:`BatchAugment` gets ``generator``, any other callable the frames alone."""
    x = frames.movedim(-1, -3)
    for fn in fns:
        x = fn(x, generator) if isinstance(fn, BatchAugment) else fn(x)
        if not isinstance(x, torch.Tensor) or x.shape[:-3] != frames.shape[:-3]:
            raise ArgumentError(
                f"augmentation {fn!r} returned {type(x).__name__} "
                f"{list(getattr(x, 'shape', []))}, not frames [..., C, H, W] of "
                f"{list(frames.shape[:-3])} samples"
            )
    return x.movedim(-3, -1).contiguous()
