"""uint8 quantisation of an observation column: an affine map of ``[low, high]`` onto 0..255."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from torchstore.errors import ColumnError

__all__ = ["Quantize"]

_LEVELS = 255


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise ColumnError(f"Quantize {name} must be a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ColumnError(f"Quantize {name} must be a number, got {value!r}") from exc


@dataclass(frozen=True, slots=True)
class Quantize:
    """Store a float column as uint8: ``q = round((x - low) / (high - low) * 255)``.

    The round-trip error is at most half a step, ``(high - low) / 510``, for values inside
    ``[low, high]``. NaN is always refused. A value further than half a step outside
    ``[low, high]`` (infinities included) is refused too, unless ``clip=True``, which
    stores it as the nearest end instead.

    Args:
        low: the value code 0 decodes to (finite).
        high: the value code 255 decodes to (finite, greater than ``low``).
        clip: store out-of-range values as the nearest end instead of refusing them.

    Examples:
        >>> q = Quantize(-1.0, 1.0)
        >>> q.encode(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([  0, 128, 255], dtype=torch.uint8)
    """

    low: float
    high: float
    clip: bool = False

    def __post_init__(self) -> None:
        low, high = _as_float("low", self.low), _as_float("high", self.high)
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ColumnError(f"Quantize bounds must be finite, got low={low}, high={high}")
        if not high > low:
            raise ColumnError(f"Quantize high ({high}) must be greater than low ({low})")
        if not np.isfinite(high - low):
            raise ColumnError(
                f"Quantize range [{low}, {high}] is wider than a float64 can hold "
                "(high - low overflows)"
            )
        if not isinstance(self.clip, bool):
            raise ColumnError(f"Quantize clip must be True or False, got {self.clip!r}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def step(self) -> float:
        """Width of one uint8 level."""
        return (self.high - self.low) / _LEVELS

    def check_dtype(self, dtype: torch.dtype, column: str = "a quantised column") -> None:
        """Refuse a range that ``dtype`` (the dtype values decode to) cannot represent.

        Every code must decode to a finite value and neighbouring codes to distinct ones.
        """
        info = torch.finfo(dtype)
        biggest = max(abs(self.low), abs(self.high))
        name = str(dtype).removeprefix("torch.")
        if biggest > info.max or self.high - self.low > info.max:
            raise ColumnError(
                f"column '{column}': Quantize({self.low:g}, {self.high:g}) does not fit in {name} "
                f"(largest finite {name} is {info.max:g}); narrow the range or use a wider dtype"
            )
        spacing = float(np.spacing(np.array(biggest, dtype=str(dtype).removeprefix("torch."))))
        if self.step < spacing:
            raise ColumnError(
                f"column '{column}': Quantize({self.low:g}, {self.high:g}) has a step of "
                f"{self.step:g}, finer than {name} resolves near {biggest:g} ({spacing:g}): "
                "neighbouring codes would decode to the same value"
            )

    def encode(
        self, values: torch.Tensor | np.ndarray, column: str | None = None
    ) -> torch.Tensor | np.ndarray:
        """Floats to uint8 (numpy in, numpy out; tensor in, tensor out).

        Raises :class:`ColumnError` for NaN, and for values beyond half a step outside
        ``[low, high]`` unless ``clip`` is set.
        """
        what = f"column '{column}'" if column else "a quantised column"
        if isinstance(values, np.ndarray):
            scaled = np.rint((values.astype(np.float64, copy=False) - self.low) / self.step)
            lo, hi = (float(scaled.min()), float(scaled.max())) if scaled.size else (0.0, 0.0)
        else:
            scaled = ((values.to(torch.float64) - self.low) / self.step).round_()
            # min and max propagate NaN: one reduction pair, one device synchronisation
            lo, hi = torch.stack(torch.aminmax(scaled)).tolist() if scaled.numel() else (0.0, 0.0)
        bad_nan = lo != lo or hi != hi
        if bad_nan:
            raise ColumnError(f"{what} holds NaN, which uint8 quantisation cannot represent")
        if not self.clip and (lo < 0 or hi > _LEVELS):
            worst = self.low + (lo if lo < 0 else hi) * self.step
            raise ColumnError(
                f"{what} holds {worst:g}, outside its quantisation range "
                f"[{self.low:g}, {self.high:g}] by more than half a step; widen the range, or "
                "pass Quantize(..., clip=True) to store out-of-range values as the nearest end"
            )
        if isinstance(scaled, np.ndarray):
            return np.clip(scaled, 0, _LEVELS).astype(np.uint8)
        return scaled.clamp_(0, _LEVELS).to(torch.uint8)

    def decode(self, codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """uint8 codes to floats, on the device the codes live on."""
        return codes.to(dtype).mul_(self.step).add_(self.low)

    def to_dict(self) -> dict[str, float | bool]:
        out: dict[str, float | bool] = {"low": self.low, "high": self.high}
        if self.clip:
            out["clip"] = True
        return out
