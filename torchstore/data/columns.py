"""Declared columns: name, dtype, per-row shape, optional uint8 quantisation or frame codec.

A store declares its columns instead of inheriting a fixed five. Names may be nested with
``/`` (``next/obs``), which becomes the nested TensorDict key ``("next", "obs")``. A
camera column (``uint8 [H, W, C]``) may keep its frames encoded on disk (PNG, JPEG, AV1 or
H.264, see :class:`~torchstore.io.frames.codec_types.FrameCodec`); it reads back as the same
``uint8`` frames.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchstore.data.quantize import Quantize
from torchstore.errors import ColumnError, FrameCodecError
from torchstore.io.frames.codec_types import FrameCodec

__all__ = [
    "ColumnSpec",
    "RESERVED_COLUMNS",
    "column_key",
    "name_from_key",
    "set_nested",
    "validate_columns",
    "torch_dtype",
    "numpy_dtype",
]

#: Reserved leaf names and the dtype rule each keeps (``None``: any dtype).
RESERVED_COLUMNS: dict[str, str | None] = {
    "action": None,
    "reward": "floating",
    "done": "bool",
    "truncated": "bool",
    "terminated": "bool",
}

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")

_TORCH_BY_NAME: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NUMPY_BY_TORCH: dict[torch.dtype, np.dtype] = {t: np.dtype(n) for n, t in _TORCH_BY_NAME.items()}
_TORCH_BY_NUMPY: dict[np.dtype, torch.dtype] = {v: k for k, v in _NUMPY_BY_TORCH.items()}


def torch_dtype(dtype: Any) -> torch.dtype:
    """Canonical torch dtype from a torch dtype, numpy dtype or name.

    Rejects what HDF5 can't hold."""
    if isinstance(dtype, torch.dtype):
        result = dtype
    else:
        try:
            result = _TORCH_BY_NUMPY.get(np.dtype(dtype))
        except (TypeError, ValueError):
            result = None
    if result not in _NUMPY_BY_TORCH:
        supported = ", ".join(_TORCH_BY_NAME)
        raise ColumnError(f"dtype ({dtype!r}) is not supported; use one of {supported}")
    return result


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a torch dtype is written as."""
    return _NUMPY_BY_TORCH[torch_dtype(dtype)]


def column_key(name: str) -> str | tuple[str, ...]:
    """``"next/obs"`` -> ``("next", "obs")``; a flat name stays a string."""
    parts = tuple(name.split("/"))
    return parts[0] if len(parts) == 1 else parts


def set_nested(tree: dict, key: str | tuple[str, ...], value: Any) -> None:
    """``tree[key] = value`` where a tuple key walks (and makes) nested dicts."""
    if isinstance(key, str):
        tree[key] = value
        return
    node = tree
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value


def name_from_key(key: str | tuple[str, ...]) -> str:
    """Inverse of :func:`column_key`."""
    return key if isinstance(key, str) else "/".join(key)


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One declared column.

    Args:
        name: column name; ``/`` nests (``"next/obs"``).
        dtype: the logical dtype a batch holds (torch dtype, numpy dtype or name).
        shape: per-row shape, ``()`` for a scalar per row.
        quantize: store as uint8 through this affine map (floating columns only).
        codec: keep the frames of a ``uint8 [H, W, C]`` column encoded on disk (a
            :class:`~torchstore.io.frames.codec_types.FrameCodec`, its kind name such as
            ``"av1"``, or its dict); readers get ``uint8`` frames back. PNG is exact, JPEG and
            video are lossy. ``"raw"`` (or None) keeps the bytes as they are.

    Examples:
        >>> ColumnSpec("obs", torch.float32, (26,))
        ColumnSpec(name='obs', dtype=torch.float32, shape=(26,), quantize=None, codec=None)
        >>> ColumnSpec("cam", torch.uint8, (96, 96, 3), codec="av1").describe()
        'uint8[96, 96, 3] as av1 crf 30 gop 32 (lossy)'
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...] = ()
    quantize: Quantize | None = None
    codec: FrameCodec | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        dtype = torch_dtype(self.dtype)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", _checked_shape(self.name, self.shape))
        if self.quantize is not None:
            object.__setattr__(self, "quantize", _checked_quantize(self.name, self.quantize, dtype))
        if self.codec is not None:
            object.__setattr__(self, "codec", _checked_codec(self))
        rule = RESERVED_COLUMNS.get(self.name.split("/")[-1], None)
        if rule == "bool" and dtype != torch.bool:
            raise ColumnError(f"reserved column '{self.name}' must be bool, got {dtype}")
        if rule == "floating" and not dtype.is_floating_point:
            raise ColumnError(f"reserved column '{self.name}' must be floating, got {dtype}")

    @property
    def key(self) -> str | tuple[str, ...]:
        """The TensorDict key: a string, or a tuple for nested names."""
        return column_key(self.name)

    @property
    def encoded(self) -> bool:
        """Whether the frames are kept encoded on disk (a codec other than raw)."""
        return self.codec is not None

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype held in memory and on disk (uint8 when quantised)."""
        return torch.uint8 if self.quantize is not None else self.dtype

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row in memory (decoded, for an encoded column)."""
        return (
            int(np.prod(self.shape, dtype=np.int64))
            * torch.empty((), dtype=self.storage_dtype).element_size()
        )

    def describe(self) -> str:
        """``float32[26]`` style text, with the quantisation when there is one."""
        text = f"{str(self.dtype).removeprefix('torch.')}{list(self.shape) if self.shape else ''}"
        if self.quantize is not None:
            text += f" as uint8 in [{self.quantize.low:g}, {self.quantize.high:g}]"
        if self.codec is not None:
            text += f" as {self.codec.describe()}"
        return text

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "dtype": str(self.dtype).removeprefix("torch."),
            "shape": list(self.shape),
            "quantize": None if self.quantize is None else self.quantize.to_dict(),
        }
        if self.codec is not None:  # absent for raw columns: their manifests stay as before
            out["codec"] = json.loads(self.codec.to_json())
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ColumnSpec:
        """The inverse of :meth:`to_dict`; anything malformed is a :class:`ColumnError`."""
        if not isinstance(data, Mapping):
            raise ColumnError(f"a column spec must be a mapping, got {data!r:.80}")
        if "name" not in data or "dtype" not in data:
            raise ColumnError(
                f"a column spec needs 'name' and 'dtype', got keys {sorted(map(str, data))}"
            )
        q = data.get("quantize")
        if q is not None and not isinstance(q, Mapping):
            raise ColumnError(f"column {data['name']!r} quantize must be a mapping, got {q!r:.80}")
        shape = data.get("shape", ())
        if not isinstance(shape, list | tuple):
            raise ColumnError(
                f"column {data['name']!r} shape must be a list of ints, got {shape!r:.80}"
            )
        codec = data.get("codec")
        if codec is not None and not isinstance(codec, Mapping):
            raise ColumnError(f"column {data['name']!r} codec must be a mapping, got {codec!r:.80}")
        return cls(
            name=data["name"], dtype=data["dtype"], shape=tuple(shape), quantize=q, codec=codec
        )

    def check_rows(self, value: Any, *, rows: int | None = None) -> np.ndarray | torch.Tensor:
        """Validate one column's rows and return them in the storage dtype.

        Accepts a tensor or anything numpy can hold, with a leading row dimension. Safe
        casts (int32 to int64, float32 to float64) are applied; casts that can lose
        information are refused. Quantised columns take floats and return uint8 codes.
        """
        is_tensor = isinstance(value, torch.Tensor)
        if is_tensor:
            if value.is_meta:
                raise ColumnError(
                    f"column '{self.name}' got a tensor on the meta device, which holds no data"
                )
            src = value.dtype
        else:
            value = np.asarray(value)
            if value.dtype == object:
                raise ColumnError(f"column '{self.name}' got an object array; pass numbers")
            try:
                src = torch_dtype(value.dtype)
            except ColumnError as exc:
                raise ColumnError(
                    f"column '{self.name}' got unsupported dtype {value.dtype}"
                ) from exc
        if tuple(value.shape[1:]) != self.shape or value.ndim != 1 + len(self.shape):
            raise ColumnError(
                f"column '{self.name}' expects rows of shape {list(self.shape)}, "
                f"got {list(value.shape[1:]) if value.ndim else 'a scalar'} "
                f"(full shape {list(value.shape)})"
            )
        if rows is not None and value.shape[0] != rows:
            raise ColumnError(
                f"column '{self.name}' has {value.shape[0]} rows, other columns have {rows}"
            )
        if self.quantize is not None:
            if not src.is_floating_point:
                raise ColumnError(
                    f"column '{self.name}' is quantised and takes floating values, got {src}"
                )
            return self.quantize.encode(value, self.name)
        if src != self.dtype and not _safe_cast(src, self.dtype):
            raise ColumnError(
                f"column '{self.name}' expects {self.describe()}, got "
                f"{str(src).removeprefix('torch.')}{list(value.shape[1:])}; casting would lose "
                "information, so convert it explicitly"
            )
        if is_tensor:
            return value.to(self.dtype)
        return value.astype(numpy_dtype(self.dtype), copy=False)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ColumnError(f"column name must be a non-empty string, got {name!r}")
    for part in name.split("/"):
        if not _SEGMENT.match(part):
            raise ColumnError(
                f"column name ({name!r}) must be '/'-separated parts of letters, "
                "digits, '_', '-' or '.', each starting with a letter or digit"
            )


def _checked_shape(name: str, shape: Any) -> tuple[int, ...]:
    try:
        if isinstance(shape, str | bytes) or any(isinstance(s, bool) for s in shape):
            raise TypeError("not a sequence of ints")
        result = tuple(int(s) for s in shape)
    except (TypeError, ValueError) as exc:
        raise ColumnError(f"column '{name}' shape must be a tuple of ints, got {shape!r}") from exc
    if any(s <= 0 for s in result):
        raise ColumnError(f"column '{name}' shape ({result}) must have positive sizes")
    return result


def _checked_quantize(name: str, quantize: Any, dtype: torch.dtype) -> Quantize:
    if isinstance(quantize, Mapping):
        try:
            quantize = Quantize(**quantize)
        except TypeError as exc:
            raise ColumnError(
                f"column '{name}' quantize ({quantize!r}) is malformed: {exc}"
            ) from exc
    elif not isinstance(quantize, Quantize):
        raise ColumnError(f"column '{name}' quantize must be a Quantize, got {quantize!r}")
    if not dtype.is_floating_point:
        raise ColumnError(
            f"column '{name}' is quantised, so its dtype must be floating, got {dtype}"
        )
    quantize.check_dtype(dtype, name)
    return quantize


def _checked_codec(spec: ColumnSpec) -> FrameCodec | None:
    codec = spec.codec
    try:
        if isinstance(codec, str):
            codec = FrameCodec(codec)
        elif isinstance(codec, Mapping):
            codec = FrameCodec.from_json(dict(codec))
        elif not isinstance(codec, FrameCodec):
            raise ColumnError(
                f"column '{spec.name}' codec must be a FrameCodec or a kind name, got {codec!r:.80}"
            )
        if codec.kind == "raw":
            return None
        if spec.dtype != torch.uint8 or spec.quantize is not None or len(spec.shape) != 3:
            raise ColumnError(
                f"column '{spec.name}' has a frame codec ({codec.kind}), so it must be uint8 "
                f"[H, W, C] frames, not {str(spec.dtype).removeprefix('torch.')}"
                f"{list(spec.shape)}{' quantised' if spec.quantize is not None else ''}"
            )
        codec.check_channels(spec.shape[2])
    except FrameCodecError as exc:
        raise ColumnError(f"column '{spec.name}': {exc}") from exc
    return codec


def _safe_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    return bool(np.can_cast(numpy_dtype(src), numpy_dtype(dst), casting="safe"))


def validate_columns(columns: Iterable[ColumnSpec] | Mapping[str, Any]) -> tuple[ColumnSpec, ...]:
    """Check a column set: specs, unique names, no name that is also a group of another."""
    if isinstance(columns, Mapping):
        columns = [
            spec if isinstance(spec, ColumnSpec) else ColumnSpec(name, **spec)
            for name, spec in columns.items()
        ]
    specs = tuple(columns)
    if not specs:
        raise ColumnError("a store needs at least one column")
    names: set[str] = set()
    for spec in specs:
        if not isinstance(spec, ColumnSpec):
            raise ColumnError(f"columns must be ColumnSpec, got {type(spec).__name__}")
        if spec.name in names:
            raise ColumnError(f"column '{spec.name}' is declared twice")
        names.add(spec.name)
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in names:
                raise ColumnError(
                    f"column '{prefix}' is also the group of column '{name}'; rename one"
                )
    return specs
