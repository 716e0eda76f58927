"""The JSON files of a TFDS folder, read with their shape checked, and the shards of a split.

``dataset_info.json`` and ``features.json`` come from whoever wrote the dataset, so every
value is checked for the type and range the importer relies on before it is used: a
malformed file fails with one :class:`~torchstore.errors.DatasetFormatError` naming the
file and the key path (``splits[0].shardLengths[1]: 'a' is not a count``), never with a
``TypeError`` or ``RecursionError`` from deep inside. :class:`JsonFile` is that check, shared
with :mod:`torchstore.formats.rlds_features` for ``features.json``.

Numbers are parsed strictly: ``NaN``, ``Infinity`` and literals past float range
(``1e400``) are refused at parse time, and documents nested deeper than
:data:`MAX_DEPTH` levels are refused before anything walks them (a real
``features.json`` is about 15 deep).
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchstore.errors import DatasetFormatError, UnsupportedError

__all__ = ["MAX_DEPTH", "JsonFile", "read_json", "SplitFiles", "split_files", "shown"]

#: Deepest nesting accepted in dataset_info.json / features.json.
MAX_DEPTH = 100
#: tfds's default shard file name (``naming.DEFAULT_FILENAME_TEMPLATE``).
DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_TEMPLATE_FIELDS = ("DATASET", "SPLIT", "FILEFORMAT", "SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y")
#: The longest file name most file systems take (bytes).
_NAME_MAX = 255
_MISSING = object()
_SHOWN = 60


def shown(value: Any) -> str:
    """``repr(value)``, cut to a length a one-line message can hold."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def key_path(keys: tuple) -> str:
    """``("splits", 0, "name")`` as ``splits[0].name`` (``the top level`` for none)."""
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "the top level"


@dataclass(frozen=True)
class JsonFile:
    """A parsed JSON file and the checks of its values, each error naming file and key path."""

    path: Path
    data: Any

    def error(self, keys: tuple, message: str, cls: type = DatasetFormatError) -> Exception:
        return cls(f"{self.path}: {key_path(keys)}: {message}")

    def dict_at(self, value: Any, keys: tuple) -> dict:
        if not isinstance(value, dict):
            raise self.error(keys, f"expected a JSON object, got {_kind(value)}")
        return value

    def list_at(self, value: Any, keys: tuple) -> list:
        if not isinstance(value, list):
            raise self.error(keys, f"expected a JSON list, got {_kind(value)}")
        return value

    def get(self, node: dict, key: str, keys: tuple, types: tuple, default: Any = _MISSING):
        """``node[key]`` if it has one of ``types``; ``default`` when absent or null."""
        value = node.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error((*keys, key), "missing")
            return default
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
            raise self.error((*keys, key), f"expected {names}, got {_kind(value)}")
        return value

    def count(self, value: Any, keys: tuple) -> int:
        """A non-negative integer, as JSON or as the decimal string proto-JSON writes."""
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,19}", value):
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
            return value
        if isinstance(value, float) and value.is_integer() and 0 <= value < 2**63:
            return int(value)
        raise self.error(keys, f"{_kind(value)} is not a count (a non-negative integer)")


_TYPE_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    bool: "true/false",
}


def _kind(value: Any) -> str:
    """What a JSON value is, for messages (``a list``, ``the string 'x'``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str | int | float):
        what = "string" if isinstance(value, str) else "number"
        return f"the {what} {shown(value)}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _depth_error(data: Any) -> tuple | None:
    """The key path of a value nested deeper than :data:`MAX_DEPTH`, or None (iterative)."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        value, keys = stack.pop()
        if len(keys) > MAX_DEPTH:
            return keys
        if isinstance(value, dict):
            stack.extend((v, (*keys, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*keys, i)) for i, v in enumerate(value))
    return None


def read_json(path: Path) -> JsonFile:
    """Parse the JSON file at ``path`` (UTF-8; finite numbers; nested at most
    :data:`MAX_DEPTH` levels).

    Raises:
        DatasetFormatError: the file is missing, unreadable, or not such JSON.
    """
    if not path.is_file():
        raise DatasetFormatError(f"{path} is missing, so {path.parent} is not a TFDS dataset")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise DatasetFormatError(
            f"{path} cannot be read as JSON (nested too deeply to parse)"
        ) from None
    except OSError as exc:
        raise DatasetFormatError(f"{path} cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise DatasetFormatError(f"{path} cannot be read as JSON ({exc})") from None
    deep = _depth_error(data)
    if deep is not None:
        raise DatasetFormatError(
            f"{path}: {key_path(deep[:8])}...: nested deeper than {MAX_DEPTH} levels"
        )
    return JsonFile(path, data)


# ---------------------------------------------------------------------------------------
# dataset_info.json: the splits and their shard files


@dataclass(frozen=True)
class SplitFiles:
    """The shard files of one split, and the episodes dataset_info.json counts in each
    (None for an older info that lists no ``shardLengths``: whatever shards are there)."""

    shards: list[Path]
    lengths: list[int] | None


def split_files(root: Path, info: JsonFile, split: str) -> SplitFiles:
    """The shards of ``split`` as ``dataset_info.json`` (``info``) lists them.

    Raises:
        DatasetFormatError: a malformed dataset_info.json, no such split, a missing shard.
        UnsupportedError: a file format other than TFRecord.
    """
    top = info.dict_at(info.data, ())
    fmt = info.get(top, "fileFormat", (), (str,), "") or "tfrecord"
    if fmt.lower() not in ("tfrecord", "tfrecords"):
        raise info.error(("fileFormat",), f"{shown(fmt)} (only tfrecord is read)", UnsupportedError)
    name = info.get(top, "name", (), (str,), "")
    splits = info.list_at(top.get("splits", []), ("splits",))
    entry, at = None, ()
    for i, item in enumerate(splits):
        item = info.dict_at(item, ("splits", i))
        if info.get(item, "name", ("splits", i), (str,)) == split:
            entry, at = item, ("splits", i)
    if entry is None and splits:
        names = ", ".join(shown(s["name"]) for s in splits[:10])
        raise DatasetFormatError(f"{info.path}: no split {shown(split)} (splits: {names})")
    lengths = None
    if entry is not None and entry.get("shardLengths") is not None:
        raw = info.list_at(entry["shardLengths"], (*at, "shardLengths"))
        lengths = [info.count(n, (*at, "shardLengths", i)) for i, n in enumerate(raw)]
    if not lengths or not name:  # older infos: whatever shards are there
        return SplitFiles(_found_shards(root, name, split), None)
    template = info.get(entry, "filepathTemplate", at, (str,), "") or DEFAULT_TEMPLATE
    fields = _template_fields(info, template, (*at, "filepathTemplate"))
    digits = max(len(str(len(lengths))), 5)
    shards = []
    for i in range(len(lengths)):
        values = {
            "DATASET": name,
            "SPLIT": split,
            "FILEFORMAT": "tfrecord",
            "SHARD_INDEX": f"{i:0{digits}d}",
            "NUM_SHARDS": f"{len(lengths):0{digits}d}",
        }
        values["SHARD_X_OF_Y"] = f"{values['SHARD_INDEX']}-of-{values['NUM_SHARDS']}"
        relative = "".join(text + values.get(field, "") for text, field in fields)
        shard = _inside(root, relative, info, (*at, "filepathTemplate"))
        if not _is_file(shard):
            raise DatasetFormatError(
                f"{shard} is missing ({info.path} lists {len(lengths)} shards)"
            )
        shards.append(shard)
    return SplitFiles(shards, lengths)


def _template_fields(info: JsonFile, template: str, keys: tuple) -> list[tuple[str, str]]:
    """``(literal text, field)`` pairs of a tfds file template (``str.format`` syntax, only
    tfds's own fields, no conversions or format specs: nothing else is evaluated)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise info.error(keys, f"{shown(template)} is not a file template ({exc})") from None
    out = []
    for text, field, spec, conversion in parsed:
        if field is not None and (field not in _TEMPLATE_FIELDS or spec or conversion):
            whole = "{" + field + (f"!{conversion}" if conversion else "")
            whole += (f":{spec}" if spec else "") + "}"
            raise info.error(
                keys,
                f"{shown(template)} names the unknown field {shown(whole)} (tfds's are "
                f"{', '.join(_TEMPLATE_FIELDS)})",
            )
        out.append((text, field or ""))
    return out


def _inside(root: Path, relative: str, info: JsonFile, keys: tuple) -> Path:
    """``root / relative``, refused unless it names a path below ``root``."""
    parts = relative.replace("\\", "/").split("/")
    usable = all(0 < len(p.encode("utf-8", "replace")) <= _NAME_MAX for p in parts)
    if not usable or "\0" in relative or ".." in parts or len(parts) > 8:
        raise info.error(keys, f"the shard path {shown(relative)} is not a file below {root}")
    return root.joinpath(*parts)


def _is_file(path: Path) -> bool:
    """``path.is_file()``, an error a file name can cause (too long, say) reported."""
    try:
        return path.is_file()
    except OSError as exc:
        raise DatasetFormatError(
            f"{shown(str(path))} cannot be looked up ({exc.strerror or exc})"
        ) from None


def _found_shards(root: Path, name: str, split: str) -> list[Path]:
    pattern = re.compile(rf"{re.escape(name)}.*-{re.escape(split)}\.tfrecord-\d+-of-\d+")
    try:
        found = sorted(p for p in root.iterdir() if pattern.fullmatch(p.name) and p.is_file())
    except OSError as exc:
        raise DatasetFormatError(f"{root} cannot be listed ({exc.strerror or exc})") from None
    if not found:
        raise DatasetFormatError(f"{root}: no TFRecord shards of the split {split!r}")
    return found


def is_version_dir(path: Path) -> bool:
    """Whether ``path`` holds a TFDS version's JSON files."""
    try:
        return (path / "dataset_info.json").is_file() or (path / "features.json").is_file()
    except OSError:
        return False


def locate(source: str | os.PathLike) -> Path:
    """The version folder of a TFDS dataset: ``source`` itself, or the one version folder in it.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        DatasetFormatError: no version folder (no ``dataset_info.json``/``features.json``),
            several, or a folder that cannot be listed.
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not path.is_dir():
        raise DatasetFormatError(f"{path} is a file; a TFDS dataset is a folder")
    if is_version_dir(path):
        return path
    try:
        found = sorted(p for p in path.iterdir() if p.is_dir() and is_version_dir(p))
    except OSError as exc:
        raise DatasetFormatError(f"{path} cannot be listed ({exc.strerror or exc})") from None
    if len(found) == 1:
        return found[0]
    if not found:
        raise DatasetFormatError(
            f"{path} is not a TFDS dataset: no features.json or dataset_info.json in it or in "
            "a version folder below it"
        )
    raise DatasetFormatError(
        f"{path} holds several versions ({', '.join(p.name for p in found)}); pass one"
    )
