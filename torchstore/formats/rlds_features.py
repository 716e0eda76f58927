"""The schema of a TFDS dataset (``features.json``) and the decoding of its feature values.

TFDS writes one ``tf.train.Example`` per episode. Each leaf feature is stored under its
path joined with ``/``; the leaves of the ``steps`` sequence hold every step at once:

- ``Tensor``/``Scalar`` (encoding ``none``): a FloatList (any floating dtype: float64 is
  kept only to float32 precision, and tfds casts it back) or an Int64List (integers and
  bool), all steps flattened; ``bytes``/``zlib`` encodings: one byte string per step,
  the raw little-endian array (zlib-compressed);
- ``Image``: one encoded PNG/JPEG per step, decoded to ``uint8`` HWC (``uint16`` for
  16-bit PNG, ``float32`` for a float image bit-cast into RGBA PNG);
- ``Text`` (and string tensors): one UTF-8 byte string per step;
- ``ClassLabel``: an int64 scalar.

Both forms of ``features.json`` are read: the proto-JSON one tfds writes now
(``{"pythonClassName": ..., "featuresDict": {...}}``) and the older
``{"type": ..., "content": ...}``.
"""

from __future__ import annotations

import io
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchstore.errors import DatasetFormatError, UnsupportedError

__all__ = ["Leaf", "Schema", "read_schema", "decode_image", "image_shape"]

#: dtypes a store cannot hold, widened losslessly (the original is recorded in metadata).
_WIDEN = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64)}
_TENSORS = ("Tensor", "Scalar", "ClassLabel")
_LEAVES = (*_TENSORS, "Image", "Text")


@dataclass(frozen=True)
class Leaf:
    """One leaf feature.

    Attributes:
        key: its key in the Example (``steps/observation/image``).
        name: its path below ``steps`` (or from the top, for an episode feature).
        kind: ``tensor``, ``image`` or ``text``.
        dtype: the dtype tfds decodes it to (None for text).
        shape: the shape of one value (one step's, for a step feature); None where free.
        encoding: ``none``/``bytes``/``zlib`` for a tensor, the format for an image.
        optional: tfds may leave it out of an episode (a None value).
    """

    key: str
    name: str
    kind: str
    dtype: np.dtype | None
    shape: tuple[int | None, ...]
    encoding: str = "none"
    optional: bool = False

    @property
    def size(self) -> int:
        """Values in one step (shape fully known)."""
        return math.prod(self.shape)  # type: ignore[arg-type]

    @property
    def store_dtype(self) -> np.dtype:
        """The dtype a store column holds (text: int64 codes)."""
        if self.kind == "text":
            return np.dtype(np.int64)
        return _WIDEN.get(self.dtype, self.dtype)


@dataclass(frozen=True)
class Schema:
    """The step leaves (under ``steps``) and the episode-level leaves of a dataset."""

    steps: tuple[Leaf, ...]
    episode: tuple[Leaf, ...]


def _class(node: dict) -> tuple[str, dict, bool]:
    """``(short class name, content, legacy)`` of a features.json node."""
    if "type" in node and "content" in node:  # tfds < 4.6
        content = node["content"]
        return (
            str(node["type"]).rsplit(".", 1)[-1],
            content if isinstance(content, dict) else {},
            True,
        )
    name = str(node.get("pythonClassName", "")).rsplit(".", 1)[-1]
    for field in ("featuresDict", "sequence", "tensor", "image", "text", "classLabel"):
        if field in node:
            return name, node[field] or {}, False
    return name, {}, False


def _shape(content: dict) -> tuple[int | None, ...]:
    shape = content.get("shape", ())
    dims = shape.get("dimensions", []) if isinstance(shape, dict) else shape
    return tuple(None if d is None or int(d) < 0 else int(d) for d in dims)


def _dtype(text: Any, where: str) -> np.dtype:
    try:
        return np.dtype("O" if text in ("string", "object") else text)
    except TypeError:
        raise DatasetFormatError(f"{where}: dtype {text!r} is not a numpy dtype") from None


def _leaf(key: str, name: str, cls: str, content: dict, where: str, step: bool) -> Leaf:
    if cls == "Text":
        return Leaf(key, name, "text", None, ())
    if cls == "ClassLabel":
        return Leaf(key, name, "tensor", np.dtype(np.int64), ())
    if cls == "Image":
        dtype = _dtype(content.get("dtype") or "uint8", where)
        shape = _shape(content) or (None, None, 3)
        fmt = content.get("encodingFormat", content.get("encoding_format")) or ""
        _check_image(name, dtype, shape, where)
        return Leaf(key, name, "image", dtype, shape, str(fmt).lower())
    dtype = _dtype(content.get("dtype", "float32"), where)
    shape = _shape(content) if cls == "Tensor" else ()
    encoding = str(content.get("encoding") or "none").lower()
    optional = bool(content.get("optional", False))
    if dtype.kind == "O":
        if shape != () or encoding != "none":
            raise UnsupportedError(f"{where}: '{name}' is a string tensor of shape {shape}")
        return Leaf(key, name, "text", None, (), optional=optional)
    if dtype == np.uint64 or dtype.kind not in "fiub":
        raise UnsupportedError(f"{where}: '{name}' has dtype {dtype}, which a store cannot hold")
    if encoding not in ("none", "bytes", "zlib"):
        raise UnsupportedError(f"{where}: '{name}' has the tensor encoding {encoding!r}")
    if None in shape and (step or shape.count(None) > 1 or encoding != "none"):
        raise UnsupportedError(
            f"{where}: '{name}' has the dynamic shape {shape}; a store column needs a fixed one"
        )
    return Leaf(key, name, "tensor", dtype, shape, encoding, optional)


def _check_image(name: str, dtype: np.dtype, shape: tuple, where: str) -> None:
    channels = shape[-1] if len(shape) == 3 else None
    ok = len(shape) == 3 and (
        (dtype == np.uint8 and channels in (1, 3, 4))
        or (dtype == np.uint16 and channels == 1)
        or (dtype == np.float32 and channels == 1)
    )
    if not ok:
        raise UnsupportedError(
            f"{where}: '{name}' is an image of dtype {dtype} and shape {shape}; supported: "
            "uint8 with 1, 3 or 4 channels, uint16 or float32 with 1"
        )


def _walk(node: dict, path: str, where: str, out: dict) -> None:
    """Collect the leaves and sequences below ``node``: ``out[path] = (class, content)``."""
    cls, content, legacy = _class(node)
    if cls == "FeaturesDict":
        children = content if legacy else content.get("features", {})
        for child, sub in children.items():
            _walk(sub, f"{path}/{child}" if path else child, where, out)
    elif cls in _LEAVES:
        if not path:
            raise DatasetFormatError(f"{where}: the top-level feature is a {cls}, not a dict")
        out[path] = (cls, content)
    elif cls in ("Dataset", "Sequence"):
        out[path] = (cls, content)
    else:
        raise UnsupportedError(f"{where}: '{path}' is a {cls or 'feature of no known class'}")


def read_schema(features: dict, where: str) -> Schema:
    """The :class:`Schema` of a parsed ``features.json``.

    Raises:
        DatasetFormatError: no ``steps`` sequence, or a node that is not a feature.
        UnsupportedError: a feature a store cannot hold (video, nested sequences,
            dynamic shapes, uint64).
    """
    if not isinstance(features, dict):
        raise DatasetFormatError(f"{where}: not a JSON object")
    top: dict = {}
    _walk(features, "", where, top)
    steps = top.pop("steps", None)
    if steps is None or steps[0] not in ("Dataset", "Sequence"):
        raise DatasetFormatError(
            f"{where}: no 'steps' Dataset feature, so not an RLDS dataset "
            f"(top-level features: {sorted(top)})"
        )
    inner = steps[1].get("feature", {})
    found: dict = {}
    _walk(inner, "", where, found)
    step_leaves = []
    for name, (cls, content) in found.items():
        if cls in ("Dataset", "Sequence"):
            raise UnsupportedError(f"{where}: 'steps/{name}' is a sequence inside the steps")
        step_leaves.append(_leaf(f"steps/{name}", name, cls, content, where, True))
    episode = []
    for name, (cls, content) in top.items():
        if cls in ("Dataset", "Sequence", "Image"):
            raise UnsupportedError(f"{where}: the episode feature '{name}' is a {cls}")
        episode.append(_leaf(name, name, cls, content, where, False))
    if not step_leaves:
        raise DatasetFormatError(f"{where}: the 'steps' feature has no leaves")
    return Schema(tuple(step_leaves), tuple(episode))


# ---------------------------------------------------------------------------------------
# values


def _numbers(leaf: Leaf, value: Any, what: str) -> np.ndarray:
    """The numeric values of an unencoded tensor, as tfds casts them."""
    if isinstance(value, list):
        if value:
            raise DatasetFormatError(f"{what}: holds byte strings, expected numbers")
        value = np.empty(0, np.float32 if leaf.dtype.kind == "f" else np.int64)
    if (value.dtype.kind == "f") != (leaf.dtype.kind == "f"):
        got = "floats" if value.dtype.kind == "f" else "integers"
        raise DatasetFormatError(f"{what}: holds {got}, expected {leaf.dtype}")
    return value.astype(leaf.dtype)


def _raw_tensor(leaf: Leaf, blob: bytes, what: str) -> np.ndarray:
    if leaf.encoding == "zlib":
        try:
            blob = zlib.decompress(blob)
        except zlib.error as exc:
            raise DatasetFormatError(f"{what}: the zlib data cannot be read ({exc})") from None
    dtype = leaf.dtype.newbyteorder("<")
    if len(blob) != leaf.size * dtype.itemsize:
        raise DatasetFormatError(
            f"{what}: {len(blob)} bytes, expected {leaf.size * dtype.itemsize} for {leaf.shape} "
            f"{leaf.dtype}"
        )
    return np.frombuffer(blob, dtype).reshape(leaf.shape)


def step_count(leaf: Leaf, value: Any, what: str) -> int:
    """How many steps a step feature's raw value holds."""
    if leaf.kind == "tensor" and leaf.encoding == "none":
        n = len(value)
        if leaf.size == 0:
            return -1  # an empty tensor per step says nothing of the length
        if n % leaf.size:
            raise DatasetFormatError(
                f"{what}: {n} values are not whole steps of shape {leaf.shape}"
            )
        return n // leaf.size
    if isinstance(value, np.ndarray):
        if value.size:
            raise DatasetFormatError(f"{what}: holds numbers, expected byte strings")
        return 0
    return len(value)


def step_values(leaf: Leaf, value: Any, steps: int, what: str) -> np.ndarray | list[bytes]:
    """A step feature's ``steps`` rows (an array), or its byte strings for images and text."""
    if leaf.kind != "tensor":
        return value if isinstance(value, list) else []
    if leaf.encoding == "none":
        return _numbers(leaf, value, what).reshape(steps, *leaf.shape)
    out = np.empty((steps, *leaf.shape), leaf.dtype)
    for t, blob in enumerate(value):
        out[t] = _raw_tensor(leaf, blob, f"{what} step {t}")
    return out


def episode_value(leaf: Leaf, value: Any, what: str) -> Any:
    """An episode-level feature as a JSON value (None where an optional one is absent)."""
    if value is None:
        if leaf.optional:
            return None
        raise DatasetFormatError(f"{what}: missing from the episode")
    if leaf.kind == "text":
        if not isinstance(value, list) or len(value) != 1:
            raise DatasetFormatError(f"{what}: expected one string")
        return decode_text(value[0], what)
    if leaf.encoding != "none":
        if not isinstance(value, list) or len(value) != 1:
            raise DatasetFormatError(f"{what}: expected one encoded tensor")
        return _raw_tensor(leaf, value[0], what).tolist()
    array = _numbers(leaf, value, what)
    shape = tuple(-1 if d is None else d for d in leaf.shape)
    try:
        array = array.reshape(shape)
    except ValueError:
        raise DatasetFormatError(
            f"{what}: {array.size} values, expected shape {leaf.shape}"
        ) from None
    return array.tolist()


def decode_text(blob: bytes, what: str) -> str:
    """A Text value (UTF-8) as ``str``."""
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{what}: not UTF-8 text ({exc})") from None


_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_JPEG_SPACES = {1: "GRAY", 3: "RGB"}


def _simplejpeg():
    try:
        import simplejpeg
    except ImportError as exc:
        raise ImportError(
            "decoding RLDS JPEG images as tfds does needs simplejpeg: pip install "
            '"torchstore[formats]"'
        ) from exc
    return simplejpeg


def image_shape(blob: bytes, leaf: Leaf) -> tuple[int, ...] | None:
    """The decoded shape of a JPEG from its header (None for other formats)."""
    if blob[:3] != b"\xff\xd8\xff" or leaf.dtype != np.uint8 or leaf.shape[-1] not in _JPEG_SPACES:
        return None
    height, width, _, _ = _simplejpeg().decode_jpeg_header(blob)
    return (height, width, leaf.shape[-1])


def decode_image(blob: bytes, leaf: Leaf, out: np.ndarray | None = None) -> np.ndarray:
    """An encoded image as tfds decodes it (``tf.image.decode_image``): HWC,
    ``leaf.dtype``, ``leaf.shape[-1]`` channels, converting the image's own mode.

    JPEG goes through libjpeg-turbo (simplejpeg) with TensorFlow's settings, the fast
    integer DCT and fancy upsampling, which give TensorFlow's pixels bit for bit (Pillow's
    accurate DCT differs by up to about 15 levels); PNG and the rest through Pillow.
    ``out``: for a JPEG of that shape, an array to decode into (and return); otherwise
    a new array is returned.
    """
    if out is not None and image_shape(blob, leaf) == out.shape:
        space = _JPEG_SPACES[leaf.shape[-1]]
        _simplejpeg().decode_jpeg(blob, space, fastdct=True, fastupsample=False, buffer=out)
        return out
    return _decode_any(blob, leaf)


def _decode_any(blob: bytes, leaf: Leaf) -> np.ndarray:
    if image_shape(blob, leaf) is not None:
        space = _JPEG_SPACES[leaf.shape[-1]]
        return _simplejpeg().decode_jpeg(blob, space, fastdct=True, fastupsample=False)
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        if leaf.dtype == np.float32:  # tfds bit-casts 1-channel float32 into RGBA PNG
            if img.mode != "RGBA":
                raise ValueError(f"a float32 image must be an RGBA PNG, got mode {img.mode}")
            return np.asarray(img).view(np.float32)
        if leaf.dtype == np.uint16:
            if img.mode not in ("I;16", "I;16B", "I;16L", "I"):
                raise ValueError(f"a uint16 image must be a 16-bit PNG, got mode {img.mode}")
            return np.asarray(img).astype(np.uint16)[..., None]
        mode = _MODES[leaf.shape[-1]]
        if mode == "L" and img.mode not in ("L", "LA", "1", "I;16", "I"):
            return _libpng_gray(np.asarray(img.convert("RGB")))
        if img.mode != mode:
            img = img.convert(mode)
        array = np.asarray(img)
    return array[..., None] if array.ndim == 2 else array


def _libpng_gray(rgb: np.ndarray) -> np.ndarray:
    """Colour to one channel as libpng does for TensorFlow (``png_set_rgb_to_gray`` with
    0.299 and 0.587 in 1/32768ths, truncated; grey pixels kept as they are), which differs
    from Pillow's ``convert("L")`` by one level on about half the pixels."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    gray = ((9797 * r + 19234 * g + 3737 * b) >> 15).astype(np.uint8)
    grey = (r == g) & (g == b)
    gray[grey] = rgb[..., 0][grey]
    return gray[..., None]
