"""LeRobot feature specs, and how each one maps to a store column and to Arrow.

A feature is one entry of ``info.json["features"]`` (spec section 3). Numeric features
become columns of their dtype (shape ``[1]`` becomes a scalar column); ``image`` and
``video`` features become ``uint8 [H, W, C]`` columns; ``string`` features become
``int64`` codes into a table kept in the store's metadata.

Arrow encodings follow the Hugging Face ``datasets`` conventions LeRobot writes
(spec section 4): scalars plain, vectors ``fixed_size_list``, 2-D to 5-D arrays as the
``datasets`` ArrayND extension (nested lists), images as ``struct<bytes, path>`` of PNG
bytes. Readers accept the variants other writers produce (variable lists, a list of one
for a scalar, JPEG bytes) and check every length against the declared shape.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from torchstore.errors import ColumnError, LeRobotFormatError
from torchstore.io.records.parquet import require_pyarrow

if TYPE_CHECKING:
    from torchstore.data.columns import ColumnSpec

__all__ = [
    "Feature",
    "DEFAULT_FEATURES",
    "CAMERA_DTYPES",
    "parse_features",
    "features_to_json",
    "hf_features_metadata",
    "decode_image",
    "encode_png",
    "cell_text",
]

CAMERA_DTYPES = ("image", "video")
_NUMERIC = {
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
}
_EXTENSION_NAMES = {n: f"datasets.features.features.Array{n}DExtensionType" for n in (2, 3, 4, 5)}


@dataclass(frozen=True)
class Feature:
    """One LeRobot feature: its name, dtype, shape and the rest of its spec.

    ``dtype`` is a numpy dtype name, ``"image"``, ``"video"`` or ``"string"``.
    ``extra`` keeps keys this module does not interpret (``fps``, ``video_info``...) so a
    spec round-trips unchanged.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: Any = None
    info: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, name: str, spec: Any, *, source: str = "info.json") -> Feature:
        if not isinstance(spec, Mapping):
            raise LeRobotFormatError(f"{source}: feature {name!r} must be an object, got {spec!r}")
        if (
            not isinstance(name, str)
            or not name
            or name in (".", "..")
            or any(c in name for c in "/\\\0")
        ):
            raise LeRobotFormatError(
                f"{source}: feature name {name!r} is empty, contains '/', '\\' or NUL, or is "
                "'.' or '..' (LeRobot uses it as a folder name and a column-name part)"
            )
        dtype = spec.get("dtype")
        if dtype not in _NUMERIC and dtype not in (*CAMERA_DTYPES, "string", "language"):
            raise LeRobotFormatError(f"{source}: feature {name!r} has unsupported dtype {dtype!r}")
        shape = spec.get("shape")
        if (
            not isinstance(shape, list | tuple)
            or not shape
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
        ):
            raise LeRobotFormatError(
                f"{source}: feature {name!r} shape must be a list of positive ints, got {shape!r}"
            )
        if dtype in CAMERA_DTYPES and len(shape) != 3:
            raise LeRobotFormatError(
                f"{source}: {dtype} feature {name!r} shape must have 3 axes, got {list(shape)}"
            )
        info = spec.get("info")
        if info is not None and not isinstance(info, Mapping):
            raise LeRobotFormatError(f"{source}: feature {name!r} info must be an object")
        extra = {k: v for k, v in spec.items() if k not in ("dtype", "shape", "names", "info")}
        return cls(
            name,
            dtype,
            tuple(shape),
            spec.get("names"),
            None if info is None else dict(info),
            extra,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info is not None:
            out["info"] = self.info
        out.update(self.extra)
        return out

    # ----------------------------------------------------------------- kinds
    @property
    def is_camera(self) -> bool:
        return self.dtype in CAMERA_DTYPES

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_text(self) -> bool:
        """``string`` features, and ``language`` annotations (lists of message structs)."""
        return self.dtype in ("string", "language")

    @property
    def is_numeric(self) -> bool:
        return self.dtype in _NUMERIC

    @property
    def channels_first(self) -> bool:
        """Whether a camera shape is ``[C, H, W]`` (trust ``names``, else the axis sizes)."""
        names = self.names
        if isinstance(names, list | tuple) and len(names) == 3:
            lowered = [str(n).lower() for n in names]
            if lowered[0] in ("channels", "channel", "c"):
                return True
            if lowered[-1] in ("channels", "channel", "c"):
                return False
        return self.shape[0] in (1, 3, 4) and self.shape[-1] not in (1, 3, 4)

    @property
    def hwc(self) -> tuple[int, int, int]:
        """A camera's frame shape as ``(H, W, C)``."""
        if self.channels_first:
            c, h, w = self.shape
            return h, w, c
        h, w, c = self.shape
        return h, w, c

    @property
    def value_shape(self) -> tuple[int, ...]:
        """The per-frame shape of the store column (``()`` for LeRobot's ``[1]``)."""
        if self.is_camera:
            return self.hwc
        if self.shape == (1,) or self.is_text:
            return ()  # text becomes one code per frame
        return self.shape

    def column_spec(self, name: str | None = None) -> ColumnSpec:
        """The store column this feature imports into."""
        from torchstore.data.columns import ColumnSpec  # (torch: reading a folder needs none)

        if self.is_camera:
            dtype = "uint8"
            info = self.info or {}
            if self.is_video and (info.get("is_depth_map") or info.get("video.is_depth_map")):
                dtype = "float32"  # depth in metres (torchstore.lerobot.depth)
        elif self.is_text:
            dtype = "int64"
        else:
            dtype = self.dtype
        try:
            return ColumnSpec(name or self.name, dtype, self.value_shape)
        except ColumnError as exc:
            raise LeRobotFormatError(
                f"feature {self.name!r} cannot become a column: {exc}"
            ) from exc

    # ----------------------------------------------------------------- arrow
    def arrow_type(self):
        """The Arrow type LeRobot (through ``datasets``) writes for this feature."""
        pa = require_pyarrow()
        if self.dtype == "image":
            return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        if self.dtype == "string":
            return pa.string()
        if not self.is_numeric:
            raise LeRobotFormatError(f"feature {self.name!r} ({self.dtype}) has no data column")
        value = pa.from_numpy_dtype(np.dtype(self.dtype))
        if self.shape == (1,):
            return value
        if len(self.shape) == 1:
            return pa.list_(value, self.shape[0])
        nested = value
        for _ in self.shape:
            nested = pa.list_(nested)
        return nested

    def arrow_field(self):
        """The field, with the ``datasets`` ArrayND extension metadata for 2-D to 5-D features."""
        pa = require_pyarrow()
        metadata = None
        if self.is_numeric and len(self.shape) >= 2:
            if len(self.shape) > 5:
                raise LeRobotFormatError(
                    f"feature {self.name!r}: LeRobot supports up to 5-D arrays"
                )
            metadata = {
                b"ARROW:extension:name": _EXTENSION_NAMES[len(self.shape)].encode(),
                b"ARROW:extension:metadata": json.dumps([list(self.shape), self.dtype]).encode(),
            }
        return pa.field(self.name, self.arrow_type(), metadata=metadata)

    def hf_feature(self) -> dict[str, Any]:
        """This feature in the ``huggingface`` schema metadata (``datasets.Features`` JSON)."""
        if self.dtype == "image":
            return {"_type": "Image"}
        if self.dtype == "string":
            return {"dtype": "string", "_type": "Value"}
        if self.shape == (1,):
            return {"dtype": self.dtype, "_type": "Value"}
        if len(self.shape) == 1:
            return {
                "_type": "List",
                "feature": {"dtype": self.dtype, "_type": "Value"},
                "length": self.shape[0],
            }
        return {"shape": list(self.shape), "dtype": self.dtype, "_type": f"Array{len(self.shape)}D"}

    def to_arrow(self, values: np.ndarray):
        """Numeric rows ``[n, *value_shape]`` (or ``[n, *shape]``) as an Arrow array of
        :meth:`arrow_type`."""
        pa = require_pyarrow()
        arr = np.ascontiguousarray(values, dtype=np.dtype(self.dtype))
        n = arr.shape[0]
        arr = arr.reshape(n, *self.shape)
        if self.shape == (1,):
            return pa.array(arr.reshape(n))
        flat = pa.array(arr.reshape(-1))
        if len(self.shape) == 1:
            return pa.FixedSizeListArray.from_arrays(flat, self.shape[0])
        nested = flat
        for size in reversed(self.shape):
            count = len(nested) // size
            offsets = pa.array(np.arange(count + 1, dtype=np.int32) * size)
            nested = pa.ListArray.from_arrays(offsets, nested)
        return nested

    def from_arrow(self, column, *, source: str) -> np.ndarray:
        """A numeric column back as ``[n, *value_shape]``; every list length is checked."""
        pa = require_pyarrow()
        import pyarrow.compute as pc

        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        n = len(column)
        if column.null_count:
            raise LeRobotFormatError(
                f"{source}: column {self.name!r} has {column.null_count} null values"
            )
        values = column
        depth = 0
        while (
            pa.types.is_list(values.type)
            or pa.types.is_large_list(values.type)
            or pa.types.is_fixed_size_list(values.type)
        ):
            if pa.types.is_fixed_size_list(values.type):
                values = values.flatten()
            else:
                lengths = pc.list_value_length(values)
                want = self.shape[depth] if depth < len(self.shape) else None
                if want is None or (
                    len(lengths)
                    and (pc.min(lengths).as_py() != want or pc.max(lengths).as_py() != want)
                ):
                    raise LeRobotFormatError(
                        f"{source}: column {self.name!r} holds lists whose lengths disagree with "
                        f"the feature shape {list(self.shape)} from info.json"
                    )
                values = values.flatten()
            depth += 1
        if values.null_count:
            raise LeRobotFormatError(f"{source}: column {self.name!r} has null elements")
        try:
            flat = values.to_numpy(zero_copy_only=False)
        except (pa.ArrowException, ValueError) as exc:
            raise LeRobotFormatError(
                f"{source}: column {self.name!r} is not numeric ({values.type})"
            ) from exc
        size = int(np.prod(self.shape))
        if flat.size != n * size:
            raise LeRobotFormatError(
                f"{source}: column {self.name!r} has {flat.size // max(n, 1)} values per frame, "
                f"the feature shape {list(self.shape)} from info.json says {size}"
            )
        want = np.dtype(self.dtype)
        if flat.dtype != want:
            if not np.can_cast(flat.dtype, want, casting="same_kind"):
                raise LeRobotFormatError(
                    f"{source}: column {self.name!r} holds {flat.dtype}, "
                    f"info.json declares {self.dtype}"
                )
            flat = flat.astype(want)
        return flat.reshape(n, *self.value_shape)


DEFAULT_FEATURES: dict[str, Feature] = {
    name: Feature(name, dtype, (1,), None)
    for name, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    )
}


def parse_features(spec: Any, *, source: str = "info.json") -> dict[str, Feature]:
    """``info.json["features"]`` as ``{name: Feature}``, in file order."""
    if not isinstance(spec, Mapping) or not spec:
        raise LeRobotFormatError(f"{source}: 'features' must be a non-empty object")
    return {name: Feature.from_json(name, s, source=source) for name, s in spec.items()}


def features_to_json(features: Mapping[str, Feature]) -> dict[str, Any]:
    return {name: f.to_json() for name, f in features.items()}


def hf_features_metadata(features: Mapping[str, Feature]) -> bytes:
    """The ``huggingface`` schema metadata value for a data file with these (non-video) features."""
    return json.dumps(
        {"info": {"features": {n: f.hf_feature() for n, f in features.items() if not f.is_video}}}
    ).encode()


def cell_text(feature: Feature, value: Any) -> str | None:
    """A text feature's cell as the string its code stands for.

    ``string`` cells are themselves; a ``language`` cell (a list of message structs, or
    null) is its JSON, keys sorted, so equal annotations get one code.
    """
    if feature.dtype == "language":
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return value


def encode_png(frame: np.ndarray) -> bytes:
    """One RGB uint8 ``[H, W, 3]`` frame as PNG bytes (compress level 6, like LeRobot)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def decode_image(data: bytes, *, what: str) -> np.ndarray:
    """Image bytes (PNG, JPEG: whatever the content is) as RGB uint8 ``[H, W, 3]``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            if img.mode != "RGB":
                img = img.convert("RGB")
            return np.asarray(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise LeRobotFormatError(f"{what} is not a readable image ({exc})") from exc
