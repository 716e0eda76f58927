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
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchstore.errors import DatasetFormatError, UnsupportedError
from torchstore.extras import install_hint
from torchstore.formats.rlds_metadata import JsonFile, shown

__all__ = [
    "Leaf",
    "Schema",
    "read_schema",
    "decode_image",
    "decode_frame",
    "image_shape",
    "MAX_FRAME_PIXELS",
    "MAX_VALUE_BYTES",
]

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


#: The dtype names tfds writes into features.json that numpy knows.
_DTYPE_NAMES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128 string object".split()
)
#: One step's value of a feature may hold at most this many bytes (a declared shape past
#: it is refused before anything is allocated for it).
MAX_VALUE_BYTES = 2**30
#: The longest feature name accepted.
_MAX_NAME = 200
#: The largest dimension accepted in a declared shape.
_MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class _Node:
    """A features.json node: its short class name, its content and where it is."""

    cls: str
    content: dict
    keys: tuple  # the JSON key path of the content
    legacy: bool


def _node(doc: JsonFile, node: Any, keys: tuple) -> _Node:
    """Read one features.json node, in either form: ``{"pythonClassName": ..., "tensor":
    {...}}`` or the older ``{"type": ..., "content": {...}}``."""
    node = doc.dict_at(node, keys)
    if "type" in node and "content" in node:  # tfds < 4.6
        cls = doc.get(node, "type", keys, (str,)).rsplit(".", 1)[-1]
        content = node["content"]
        return _Node(cls, content if isinstance(content, dict) else {}, (*keys, "content"), True)
    cls = doc.get(node, "pythonClassName", keys, (str,), "").rsplit(".", 1)[-1]
    for field in ("featuresDict", "sequence", "tensor", "image", "text", "classLabel"):
        if field in node:
            content = node[field]
            if content is None:
                content = {}
            return _Node(cls, doc.dict_at(content, (*keys, field)), (*keys, field), False)
    return _Node(cls, {}, keys, False)


def _shape(doc: JsonFile, node: _Node) -> tuple[int | None, ...]:
    """A declared shape: ``{"dimensions": ["3", "-1"]}`` (proto JSON writes int64 as
    strings) or a legacy list; -1 (or null) is a free dimension."""
    shape = node.content.get("shape")
    keys = (*node.keys, "shape")
    if shape is None:
        return ()
    if isinstance(shape, dict):
        keys = (*keys, "dimensions")
        shape = shape.get("dimensions", [])
    dims = []
    for i, d in enumerate(doc.list_at(shape, keys)):
        if isinstance(d, str) and re.fullmatch(r"-?[0-9]{1,12}", d):
            d = int(d)
        if d is None or (type(d) is int and d == -1):
            dims.append(None)
        elif type(d) is int and 0 <= d <= _MAX_DIM:
            dims.append(d)
        else:
            raise doc.error((*keys, i), f"{shown(d)} is not a dimension (an integer >= -1)")
    return tuple(dims)


def _dtype(doc: JsonFile, node: _Node, default: str) -> np.dtype:
    name = node.content.get("dtype", default)
    if name is None:
        name = default
    if not isinstance(name, str):
        raise doc.error((*node.keys, "dtype"), f"{shown(name)} is not a dtype name")
    if name not in _DTYPE_NAMES:
        raise doc.error(
            (*node.keys, "dtype"), f"{shown(name)} is not a dtype tfds writes", UnsupportedError
        )
    return np.dtype("O" if name in ("string", "object") else name)


def _leaf(doc: JsonFile, key: str, name: str, node: _Node, step: bool) -> Leaf:
    where = f"{doc.path}: '{name}'"
    if node.cls == "Text":
        return Leaf(key, name, "text", None, ())
    if node.cls == "ClassLabel":
        return Leaf(key, name, "tensor", np.dtype(np.int64), ())
    if node.cls == "Image":
        dtype = _dtype(doc, node, "uint8")
        shape = _shape(doc, node) or (None, None, 3)
        fmt = node.content.get("encodingFormat", node.content.get("encoding_format")) or ""
        _check_image(name, dtype, shape, where)
        leaf = Leaf(key, name, "image", dtype, shape, str(fmt).lower()[:20])
    else:
        leaf = _tensor_leaf(doc, key, name, node, step, where)
    if leaf.kind != "text" and None not in leaf.shape:
        nbytes = leaf.size * leaf.dtype.itemsize
        if nbytes > MAX_VALUE_BYTES:
            raise UnsupportedError(
                f"{where}: one value of shape {leaf.shape} ({leaf.dtype}) would hold {nbytes} "
                f"bytes; at most {MAX_VALUE_BYTES} are read"
            )
    return leaf


def _tensor_leaf(doc: JsonFile, key: str, name: str, node: _Node, step: bool, where: str) -> Leaf:
    dtype = _dtype(doc, node, "float32")
    shape = _shape(doc, node) if node.cls == "Tensor" else ()
    encoding = node.content.get("encoding") or "none"
    if not isinstance(encoding, str):
        raise doc.error((*node.keys, "encoding"), f"{shown(encoding)} is not an encoding")
    encoding = encoding.lower()
    optional = node.content.get("optional", False) is True
    if dtype.kind == "O":
        if shape != () or encoding != "none":
            raise UnsupportedError(f"{where} is a string tensor of shape {shape}")
        return Leaf(key, name, "text", None, (), optional=optional)
    if dtype == np.uint64 or dtype.kind not in "fiub":
        raise UnsupportedError(f"{where} has dtype {dtype}, which a store cannot hold")
    if encoding not in ("none", "bytes", "zlib"):
        raise UnsupportedError(f"{where} has the tensor encoding {encoding[:40]!r}")
    if None in shape and (step or shape.count(None) > 1 or encoding != "none"):
        raise UnsupportedError(
            f"{where} has the dynamic shape {shape}; a store column needs a fixed one"
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
            f"{where} is an image of dtype {dtype} and shape {shape}; supported: "
            "uint8 with 1, 3 or 4 channels, uint16 or float32 with 1"
        )


def _walk(doc: JsonFile, raw: Any, keys: tuple, path: str, out: dict) -> None:
    """Collect the leaves and sequences below a node: ``out[path] = _Node``."""
    node = _node(doc, raw, keys)
    if node.cls == "FeaturesDict":
        children = node.content
        at = node.keys
        if not node.legacy:
            at = (*at, "features")
            children = node.content.get("features", {})
        for child, sub in doc.dict_at(children, at).items():
            if not child or child.strip() != child or len(child) > _MAX_NAME:
                raise doc.error(
                    (*at, shown(child)), f"the feature name {shown(child)} is not usable"
                )
            _walk(doc, sub, (*at, child), f"{path}/{child}" if path else child, out)
    elif node.cls in (*_LEAVES, "Dataset", "Sequence"):
        if not path:
            raise doc.error(keys, f"the top-level feature is a {node.cls}, not a dict")
        if path in out:  # a name holding "/" that another feature's nesting gives too
            raise doc.error(keys, f"the feature '{path}' appears twice once flattened")
        out[path] = node
    else:
        what = f"a {node.cls[:60]}" if node.cls else "a feature of no known class"
        raise doc.error(keys, f"'{path}' is {what}", UnsupportedError)


def _check_names(doc: JsonFile, names: list[str], below: str) -> None:
    """No flattened name may be the parent of another (``a`` and ``a/b``, possible only
    with a ``/`` inside a name): tfds refuses such features too."""
    seen = set(names)
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise DatasetFormatError(
                    f"{doc.path}: '{'/'.join(parts[:i])}'{below} is both a feature and the "
                    f"parent of '{name}'"
                )


def read_schema(doc: JsonFile) -> Schema:
    """The :class:`Schema` of a parsed ``features.json``.

    Raises:
        DatasetFormatError: no ``steps`` sequence, or a node that is not a feature (the
            message names the file and the key path).
        UnsupportedError: a feature a store cannot hold (video, nested sequences,
            dynamic shapes, uint64, a value over :data:`MAX_VALUE_BYTES`).
    """
    top: dict[str, _Node] = {}
    _walk(doc, doc.data, (), "", top)
    steps = top.pop("steps", None)
    if steps is None or steps.cls not in ("Dataset", "Sequence"):
        raise DatasetFormatError(
            f"{doc.path}: no 'steps' Dataset feature, so not an RLDS dataset "
            f"(top-level features: {sorted(top)[:10]})"
        )
    found: dict[str, _Node] = {}
    _walk(doc, steps.content.get("feature", {}), (*steps.keys, "feature"), "", found)
    step_leaves = []
    for name, node in found.items():
        if node.cls in ("Dataset", "Sequence"):
            raise UnsupportedError(f"{doc.path}: 'steps/{name}' is a sequence inside the steps")
        step_leaves.append(_leaf(doc, f"steps/{name}", name, node, True))
    episode = []
    for name, node in top.items():
        if node.cls in ("Dataset", "Sequence", "Image"):
            raise UnsupportedError(f"{doc.path}: the episode feature '{name}' is a {node.cls}")
        episode.append(_leaf(doc, name, name, node, False))
    if not step_leaves:
        raise DatasetFormatError(f"{doc.path}: the 'steps' feature has no leaves")
    _check_names(doc, [leaf.name for leaf in step_leaves], " below 'steps'")
    _check_names(doc, [leaf.name for leaf in episode], "")
    return Schema(tuple(step_leaves), tuple(episode))


# ---------------------------------------------------------------------------------------
# values


def _check_numbers(leaf: Leaf, value: Any, what: str) -> None:
    """An unencoded tensor's value must be a FloatList for a floating dtype, an Int64List
    for the rest (an empty list of either kind stands for no values)."""
    if isinstance(value, list):
        if value:
            raise DatasetFormatError(f"{what}: holds byte strings, expected numbers")
        return
    if value.size and (value.dtype.kind == "f") != (leaf.dtype.kind == "f"):
        got = "floats" if value.dtype.kind == "f" else "integers"
        raise DatasetFormatError(f"{what}: holds {got}, expected {leaf.dtype}")


def _numbers(leaf: Leaf, value: Any, what: str) -> np.ndarray:
    """The numeric values of an unencoded tensor, as tfds casts them."""
    _check_numbers(leaf, value, what)
    if isinstance(value, list) or not value.size:
        return np.empty(0, leaf.dtype)
    return value.astype(leaf.dtype)


def _raw_tensor(leaf: Leaf, blob: bytes, what: str) -> np.ndarray:
    """One ``bytes``/``zlib`` encoded value: little-endian bytes of exactly its shape
    (zlib data is inflated only up to one byte past that, so a small hostile blob cannot
    expand into gigabytes)."""
    dtype = leaf.dtype.newbyteorder("<")
    want = leaf.size * dtype.itemsize
    if leaf.encoding == "zlib":
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(blob, want + 1)
        except zlib.error as exc:
            raise DatasetFormatError(f"{what}: the zlib data cannot be read ({exc})") from None
        if len(raw) > want:
            raise DatasetFormatError(
                f"{what}: the zlib data inflates to more than the {want} bytes of "
                f"{leaf.shape} {leaf.dtype}"
            )
        if not inflate.eof:  # every byte was read (no limit was met) and no end came
            raise DatasetFormatError(f"{what}: the zlib data is cut short")
        blob = raw
    if len(blob) != want:
        raise DatasetFormatError(
            f"{what}: {len(blob)} bytes, expected {want} for {leaf.shape} {leaf.dtype}"
        )
    return np.frombuffer(blob, dtype).reshape(leaf.shape)


def step_count(leaf: Leaf, value: Any, what: str) -> int:
    """How many steps a step feature's raw value holds (-1: it cannot say, an empty
    tensor per step); checks the value is of the kind the feature needs."""
    if leaf.kind == "tensor" and leaf.encoding == "none":
        _check_numbers(leaf, value, what)
        n = len(value)
        if leaf.size == 0:
            return -1
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


def tensor_rows(leaf: Leaf, value: Any, start: int, out: np.ndarray, what: str) -> None:
    """Write the rows ``start:start + len(out)`` of a tensor step feature into ``out``
    (as tfds casts them, then widened to the column's dtype)."""
    stop = start + len(out)
    if leaf.encoding == "none":
        if leaf.size and len(out):
            chunk = value[start * leaf.size : stop * leaf.size]
            out[...] = chunk.astype(leaf.dtype, copy=False).reshape(out.shape)
        return
    for t in range(start, stop):
        out[t - start] = _raw_tensor(leaf, value[t], f"{what} step {t}")


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
#: Frames of more pixels are refused before they are decoded (Pillow's own
#: decompression-bomb threshold): a small hostile file must not make the import allocate
#: gigabytes.
MAX_FRAME_PIXELS = 89_478_485


class _ImageShapeError(ValueError):
    """A frame whose header gives another shape than the column's (found before decoding)."""

    def __init__(self, shape: tuple[int, ...], expected: tuple[int, ...]):
        super().__init__(f"an image of shape {shape}, expected {expected}")
        self.shape = shape


def _simplejpeg():
    try:
        import simplejpeg
    except ImportError as exc:
        raise ImportError(
            f"decoding RLDS JPEG images as tfds does needs simplejpeg: {install_hint('formats')}"
        ) from exc
    return simplejpeg


def image_shape(blob: bytes, leaf: Leaf) -> tuple[int, ...] | None:
    """The decoded shape of a JPEG from its header (None for other formats)."""
    if blob[:3] != b"\xff\xd8\xff" or leaf.dtype != np.uint8 or leaf.shape[-1] not in _JPEG_SPACES:
        return None
    height, width, _, _ = _simplejpeg().decode_jpeg_header(blob)
    return (height, width, leaf.shape[-1])


def _check_frame(shape: tuple[int, ...], expected: tuple[int, ...] | None) -> None:
    if expected is not None and shape != expected:
        raise _ImageShapeError(shape, expected)
    if shape[0] * shape[1] > MAX_FRAME_PIXELS:
        raise ValueError(
            f"its header says {shape[1]}x{shape[0]} pixels, more than the {MAX_FRAME_PIXELS} read"
        )


def decode_image(blob: bytes, leaf: Leaf, out: np.ndarray | None = None) -> np.ndarray:
    """One encoded frame as tfds decodes it (``tf.image.decode_image``): HWC,
    ``leaf.dtype``, ``leaf.shape[-1]`` channels, converting the image's own mode.

    JPEG goes through libjpeg-turbo (simplejpeg) with TensorFlow's settings, the fast
    integer DCT and fancy upsampling, which give TensorFlow's pixels bit for bit (Pillow's
    accurate DCT differs by up to about 15 levels); PNG and the rest through Pillow.
    ``out``: the array to decode into (and return), whose shape the frame must have;
    None: a new array is returned. The header's size is checked before any pixel is
    decoded: :class:`_ImageShapeError` when it is not ``out``'s shape, ``ValueError`` past
    :data:`MAX_FRAME_PIXELS`.
    """
    expected = None if out is None else out.shape
    shape = image_shape(blob, leaf)
    if shape is not None:
        _check_frame(shape, expected)
        space = _JPEG_SPACES[leaf.shape[-1]]
        return _simplejpeg().decode_jpeg(blob, space, fastdct=True, fastupsample=False, buffer=out)
    image = _decode_pillow(blob, leaf, expected)
    if out is None:
        return image
    out[...] = image
    return out


def _decode_pillow(blob: bytes, leaf: Leaf, expected: tuple[int, ...] | None) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        _check_frame((img.height, img.width, leaf.shape[-1]), expected)
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


def decode_frame(leaf: Leaf, blob: bytes, out: np.ndarray | None, what: str) -> np.ndarray:
    """:func:`decode_image`, every failure a DatasetFormatError naming ``what`` (the
    shard, episode, key and step): a frame that cannot be decoded, or whose shape is not
    ``out``'s (found from its header, before decoding) or the declared one."""
    try:
        image = decode_image(blob, leaf, out)
    except _ImageShapeError as exc:
        raise DatasetFormatError(f"{what}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - Pillow/libjpeg raise OSError, ValueError...
        raise DatasetFormatError(
            f"{what}: the {leaf.encoding or 'encoded'} image cannot be decoded "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        ) from None
    declared = len(image.shape) == len(leaf.shape) and all(
        d is None or d == s for d, s in zip(leaf.shape, image.shape)
    )
    if not declared:
        want = tuple("?" if d is None else d for d in leaf.shape)
        raise DatasetFormatError(f"{what}: an image of shape {image.shape}, expected {want}")
    return image
