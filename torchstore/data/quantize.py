"""uint8 quantisation of an observation column: an affine map of ``[low, high]`` onto 0..255."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from torchstore.errors import ColumnError

__all__ = ["Quantize"]

_LEVELS = 255


@dataclass(frozen=True, slots=True)
class Quantize:
    """Store a float column as uint8: ``q = round((x - low) / (high - low) * 255)``, clipped.

    The round-trip error is at most half a step, ``(high - low) / 510``, for values inside
    ``[low, high]``; values outside are clipped to the nearest end.

    Examples:
        >>> q = Quantize(-1.0, 1.0)
        >>> q.encode(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([  0, 128, 255], dtype=torch.uint8)
    """

    low: float
    high: float

    def __post_init__(self) -> None:
        low, high = float(self.low), float(self.high)
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ColumnError(f"Quantize bounds must be finite, got low={low}, high={high}")
        if not high > low:
            raise ColumnError(f"Quantize high ({high}) must be greater than low ({low})")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def step(self) -> float:
        """Width of one uint8 level."""
        return (self.high - self.low) / _LEVELS

    def encode(self, values: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Floats to uint8 (numpy in, numpy out; tensor in, tensor out)."""
        if isinstance(values, np.ndarray):
            scaled = (values.astype(np.float64, copy=False) - self.low) / self.step
            return np.clip(np.rint(scaled), 0, _LEVELS).astype(np.uint8)
        scaled = (values.to(torch.float64) - self.low) / self.step
        return scaled.round().clamp_(0, _LEVELS).to(torch.uint8)

    def decode(self, codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """uint8 codes to floats, on the device the codes live on."""
        return codes.to(dtype).mul_(self.step).add_(self.low)

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high}
