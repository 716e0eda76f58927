"""What a robomimic-layout HDF5 file holds, read without its arrays: demos, keys, attributes.

robomimic, MimicGen, LIBERO and Isaac Lab's recorders share one layout::

    data/                      attrs: total, env_args (JSON), ... (LIBERO: problem_info,
      demo_0/                         bddl_file_name, env_name, ...)
        obs/<key>              [T, ...]  (images uint8 [T, H, W, 3])
        next_obs/<key>         [T, ...]
        actions, rewards, dones, states, ...   [T, ...]
        initial_state/...      (Isaac Lab: one row per demo, not per step)
        src_demo_inds          (MimicGen: one entry per subtask, not per step)
        src_demo_labels        (MimicGen: [T, 1], the source demo of each step)
        datagen_info/...       (MimicGen: per step)
                               attrs: num_samples, model_file, seed, success, init_state, ...
    mask/<filter>              demo names as bytes (train, valid, 20_percent, ...)

Every dataset with a row per step becomes a store column. The datasets of one entry per
demo (scalars, :data:`PER_DEMO_GROUPS`, :data:`PER_DEMO_KEYS`, and
:data:`PER_STEP_OR_PER_DEMO_KEYS` where a demo has another number of rows of them) go in
the episode's metadata, exactly (dtype, shape, bytes), and the export writes them back.
The names map onto the store's own (``actions`` -> ``action``, ``next_obs/<k>`` ->
``next/obs/<k>``, ...) and the map is kept in the store's metadata, so the export writes
the original names, dtypes and storage options back. Attributes (of the file, ``data``,
each demo and each dataset) are kept as JSON: strings as they are, anything else as its
dtype, shape and bytes (exact).

The scan refuses, before any array is read, what :mod:`torchstore.formats.limits` bounds:
rows over ``MAX_ROW_BYTES``, datasets declaring far more chunks than they store, and
per-demo arrays or filter keys over ``MAX_KEPT_BYTES``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5l, h5o

from torchstore.errors import DatasetFormatError
from torchstore.formats import limits
from torchstore.formats.robomimic_text import string_encoding

__all__ = [
    "DemoKey",
    "RobomimicLayout",
    "decode_attr",
    "decode_attrs",
    "demo_order",
    "encode_attr",
    "encode_attrs",
    "read_layout",
    "storage_options",
    "store_name",
]

_DEMO = re.compile(r"^demo_(\d+)$")
#: Groups of a demo that hold one entry per demo, not one row per step (Isaac Lab).
PER_DEMO_GROUPS = ("initial_state",)
#: Datasets of a demo that hold one entry per demo (MimicGen's source demo of each
#: subtask), whatever their length: one that happens to have a row per step stays here.
PER_DEMO_KEYS = ("src_demo_inds",)
#: Datasets that are a column where every demo has a row per step of them (MimicGen's
#: ``src_demo_labels``, its source demo at each step, ``[T, 1]``), and are kept per demo,
#: in every demo, where one demo has another number of rows.
PER_STEP_OR_PER_DEMO_KEYS = ("src_demo_labels",)
#: robomimic name -> store name for the keys with a store meaning (reserved columns).
_RENAMES = {"actions": "action", "rewards": "reward", "dones": "done"}


def demo_order(names: list[str]) -> list[str]:
    """Demo names in robomimic's order: ``demo_N`` by the integer N (``demo_2`` before
    ``demo_10``), then any other group names as strings."""
    return sorted(
        names,
        key=lambda n: (0, int(m.group(1)), n) if (m := _DEMO.match(n)) else (1, 0, n),
    )


def encode_attr(value: Any) -> Any:
    """An HDF5 attribute value as JSON, exactly: a str stays a str, an array of strings
    keeps each string's bytes and its encoding, anything else becomes
    ``{"ndarray": {"dtype", "shape", "base64"}}`` of its numpy form."""
    if isinstance(value, str):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "O":  # variable-length strings in an array attribute
        info = h5py.check_string_dtype(array.dtype)
        items = [
            v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogateescape")
            for v in array.flat
        ]  # h5py reads undecodable bytes as surrogates: this gives the bytes back
        return {
            "strings": {
                "encoding": info.encoding if info is not None else "utf-8",
                "shape": list(array.shape),
                "base64": [base64.b64encode(v).decode() for v in items],
            }
        }
    return {
        "ndarray": {
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "base64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode(),
        }
    }


def decode_attr(value: Any) -> Any:
    """The inverse of :func:`encode_attr`: the value to write back as the attribute."""
    if isinstance(value, str):
        return value
    if "strings" in value:
        spec = value["strings"]
        array = np.empty(len(spec["base64"]), dtype=h5py.string_dtype(spec["encoding"]))
        array[:] = [base64.b64decode(v) for v in spec["base64"]]
        return array.reshape(spec["shape"])
    spec = value["ndarray"]
    raw = base64.b64decode(spec["base64"])
    array = np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])
    return array[()] if array.ndim == 0 else array


def encode_attrs(attrs: h5py.AttributeManager, left_out: list[str] | None = None) -> dict[str, Any]:
    """Every attribute but object references (they point into this file only), which are
    named in ``left_out``."""
    out = {}
    for name in attrs:
        if h5py.check_ref_dtype(attrs.get_id(name).dtype) is not None:
            if left_out is not None:
                left_out.append(f"attribute {name!r} (an object reference)")
            continue
        out[name] = encode_attr(attrs[name])
    return out


def decode_attrs(encoded: dict[str, Any], attrs: h5py.AttributeManager) -> None:
    for name, value in encoded.items():
        attrs[name] = decode_attr(value)


@dataclass
class DemoKey:
    """One per-step dataset of every demo: where it lives, what the store calls it."""

    path: str  # inside a demo group, e.g. "obs/agentview_image"
    column: str  # the store column, e.g. "obs/agentview_image"
    dtype: str  # numpy dtype string of the file's dataset
    shape: list[int]  # per-row shape
    cast: bool = False  # the column holds another dtype (dones -> bool, int rewards -> float)
    options: dict[str, Any] = field(default_factory=dict)  # chunks, compression, ...
    attrs: dict[str, Any] = field(default_factory=dict)
    #: a text key's string encoding ("utf-8", "ascii"): its column holds int64 codes into
    #: metadata["robomimic"]["string_tables"] (see torchstore.formats.robomimic_text)
    encoding: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoKey:
        return cls(**data)


def store_name(path: str) -> str:
    """The store column for a robomimic dataset path (before any dtype fallback)."""
    if path in _RENAMES:
        return _RENAMES[path]
    if path.startswith("next_obs/"):
        return "next/obs/" + path.removeprefix("next_obs/")
    return path


def storage_options(ds: h5py.Dataset) -> dict[str, Any]:
    """The creation options that make a dataset written back like the original."""
    options: dict[str, Any] = {}
    if ds.chunks is not None:
        options["chunks"] = True  # the original shape of chunk depends on its length
    if ds.compression is not None:
        options["compression"] = ds.compression
        if ds.compression_opts is not None:
            options["compression_opts"] = ds.compression_opts
    if ds.shuffle:
        options["shuffle"] = True
    if ds.fletcher32:
        options["fletcher32"] = True
    return options


@dataclass
class RobomimicLayout:
    """The demos of a file in robomimic's order, their lengths, and the per-step keys."""

    path: Path
    demos: list[str]
    lengths: list[int]
    keys: list[DemoKey]
    per_demo: list[str]  # dataset paths kept per demo (Isaac Lab's initial_state/...)
    masks: dict[str, dict[str, Any]]  # filter name -> {"dtype", "demos"}
    variant: str  # "robomimic", "libero" or "isaaclab"
    # open h5py objects of the scan, reused by the reads (each lookup costs tens of us)
    groups: list[h5py.Group] = field(default_factory=list, repr=False)
    datasets: list[dict[str, h5d.DatasetID]] = field(default_factory=list, repr=False)
    #: what the file holds that a store does not keep (links, stray datasets), to warn of
    left_out: list[str] = field(default_factory=list)


def _datasets(group: h5py.Group, where: str, left_out: list[str]) -> dict[str, h5d.DatasetID]:
    """Every dataset under ``group`` by relative path, as low-level ids: a file holds
    thousands, and h5py's high-level objects cost about twice the read of a small one.
    Soft and external links are not followed; they go in ``left_out``."""
    links: list[tuple[bytes, int]] = []
    group.id.links.visit(lambda name, info: links.append((name, info.type)), info=True)
    found = {}
    for name, kind in links:
        if kind != h5l.TYPE_HARD:
            what = "soft" if kind == h5l.TYPE_SOFT else "external"
            left_out.append(f"{where}/{name.decode()} ({what} link, not followed)")
            continue
        oid = h5o.open(group.id, name)
        if isinstance(oid, h5d.DatasetID):
            found[name.decode()] = oid
    return found


def _demo_length(
    where: str, group: h5py.Group, datasets: dict[str, h5d.DatasetID]
) -> tuple[int, str]:
    """The demo's step count and where it came from (``num_samples``, else ``actions``)."""
    if "num_samples" in group.attrs:
        value = np.asarray(group.attrs["num_samples"])
        if value.ndim != 0 or value.dtype.kind not in "iu":
            raise DatasetFormatError(
                f"{where}: num_samples is {value.dtype} {tuple(value.shape)}, not an integer "
                "(the demo's step count)"
            )
        return int(value), "num_samples"
    if "actions" in datasets and len(datasets["actions"].shape):
        return int(datasets["actions"].shape[0]), "the rows of 'actions'"
    raise DatasetFormatError(f"{where}: no num_samples attribute and no 'actions' to count steps")


def _is_per_demo(path: str, ds: h5d.DatasetID, length: int) -> bool:
    if len(ds.shape) == 0 or path in PER_DEMO_KEYS or path.split("/", 1)[0] in PER_DEMO_GROUPS:
        return True
    return path in PER_STEP_OR_PER_DEMO_KEYS and ds.shape[0] != length


def _nbytes(ds: h5d.DatasetID) -> int:
    return math.prod(ds.shape) * ds.dtype.itemsize


def _check_stored(where: str, path: str, ds: h5d.DatasetID) -> None:
    """Refuse chunks over ``MAX_CHUNK_BYTES`` (each is decoded whole), and a large dataset
    that declares far more than it stores (the rest reads as the fill value): a 1 KB file
    may declare terabytes. About 20 us a dataset."""
    plist = ds.get_create_plist()
    layout = plist.get_layout()
    if layout == h5d.CHUNKED:
        limits.check_chunk(f"{where} key '{path}'", plist.get_chunk(), ds.dtype)
    nbytes = _nbytes(ds)
    if layout == h5d.COMPACT or (
        nbytes <= limits.MAX_UNSTORED_BYTES and math.prod(ds.shape) <= limits.MAX_UNSTORED_CHUNKS
    ):
        return
    if layout == h5d.CHUNKED:
        chunk = plist.get_chunk()
        declared = math.prod(-(-n // c) for n, c in zip(ds.shape, chunk))
        stored = ds.get_num_chunks()
        chunk_bytes = math.prod(chunk) * ds.dtype.itemsize
    else:  # contiguous (or virtual): all or nothing
        declared, stored, chunk_bytes = 1, int(ds.get_storage_size() >= nbytes), nbytes
    limits.check_unstored(f"{where} key '{path}'", declared, stored, chunk_bytes)


def _check_rows(where: str, path: str, ds: h5d.DatasetID, length: int, origin: str) -> None:
    if ds.shape[0] != length:
        raise DatasetFormatError(
            f"{where}: key '{path}' has {ds.shape[0]} rows, but the demo has {length} steps "
            f"({origin}); every per-step key must have one row per step"
        )


def _scan_demo(
    where: str, group: h5py.Group, left_out: list[str]
) -> tuple[int, dict[str, h5d.DatasetID], set[str], dict[str, h5d.DatasetID]]:
    datasets = _datasets(group, where, left_out)
    length, origin = _demo_length(where, group, datasets)
    if length <= 0:
        raise DatasetFormatError(f"{where}: a demo of {length} steps; a store has no row for it")
    rows = {}
    per_demo = set()
    for path, ds in datasets.items():
        if _is_per_demo(path, ds, length):
            _keep_per_demo(where, path, ds, per_demo)
            continue
        _check_rows(where, path, ds, length, origin)
        limits.check_row(f"{where} key '{path}'", ds.shape[1:], ds.dtype)
        _check_stored(where, path, ds)
        rows[path] = ds
    return length, rows, per_demo, datasets


def _keep_per_demo(where: str, path: str, ds: h5d.DatasetID, per_demo: set[str]) -> None:
    limits.check_kept(f"{where} key '{path}' (one per demo)", _nbytes(ds))
    per_demo.add(path)


def _keys_of(where: str, rows: dict[str, h5d.DatasetID]) -> dict[str, DemoKey]:
    keys = {}
    limits.check_step(
        where, {p: math.prod(o.shape[1:]) * o.dtype.itemsize for p, o in rows.items()}
    )
    for path, oid in rows.items():
        ds = h5py.Dataset(oid)
        column = store_name(path)
        if column != path and column in rows:  # both `dones` and `done`: each keeps its name
            column = path
        encoding = string_encoding(ds.dtype)
        if encoding is not None and ds.shape[1:]:
            raise DatasetFormatError(
                f"{where}: key '{path}' holds {tuple(ds.shape[1:])} strings per step; a "
                "store holds text as one string per step"
            )
        keys[path] = DemoKey(
            path=path,
            column=column,
            dtype=ds.dtype.str,
            shape=list(ds.shape[1:]),
            options=storage_options(ds),
            attrs=encode_attrs(ds.attrs),
            encoding=encoding,
        )
    return keys


def _same_keys(where: str, first: dict[str, DemoKey], rows: dict[str, h5d.DatasetID]) -> None:
    if set(rows) != set(first):
        missing = sorted(set(first) - set(rows))
        extra = sorted(set(rows) - set(first))
        raise DatasetFormatError(
            f"{where}: its keys differ from the first demo's (missing {missing[:5]}, "
            f"extra {extra[:5]}); every demo of a store has the same columns"
        )
    for path, ds in rows.items():
        key = first[path]
        if ds.dtype.str != key.dtype or list(ds.shape[1:]) != key.shape:
            raise DatasetFormatError(
                f"{where}: key '{path}' is {ds.dtype} {tuple(ds.shape[1:])} per step, the "
                f"first demo's is {np.dtype(key.dtype)} {tuple(key.shape)}"
            )


def _masks(
    f: h5py.File, label: str, demos: set[str], left_out: list[str]
) -> dict[str, dict[str, Any]]:
    masks: dict[str, dict[str, Any]] = {}
    group = f.get("mask")
    if not isinstance(group, h5py.Group):
        return masks
    for name, ds in group.items():
        if not isinstance(ds, h5py.Dataset):
            left_out.append(f"{label} mask/{name} (a group among the filter keys)")
            continue
        limits.check_kept(f"{label} mask/{name}", math.prod(ds.shape) * ds.dtype.itemsize)
        names = [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(ds[()]).flat]
        unknown = sorted(set(names) - demos)
        if unknown:
            raise DatasetFormatError(
                f"{label}: filter key mask/{name} names demos that are not in data/: {unknown[:5]}"
            )
        masks[name] = {"dtype": ds.dtype.str, "demos": names}
    return masks


def _variant(data: h5py.Group, per_demo: list[str]) -> str:
    """Which recorder wrote the file, from what it adds to robomimic's layout."""
    if "problem_info" in data.attrs or "bddl_file_name" in data.attrs:
        return "libero"
    try:
        env_args = json.loads(data.attrs.get("env_args", "{}"))
    except (TypeError, ValueError):
        env_args = {}
    if per_demo or (
        isinstance(env_args, dict) and "type" in env_args and "env_kwargs" not in env_args
    ):
        return "isaaclab"
    return "robomimic"


def read_layout(f: h5py.File, label: str) -> RobomimicLayout:
    """Scan an open file's demos (shapes and attributes only; no array is read).

    Raises:
        DatasetFormatError: no ``data`` group or no demo in it, a demo whose keys have
            different lengths, keys that differ between demos, a filter key naming
            unknown demos (the message names the file, the demo and the key).
    """
    data = f.get("data")
    if not isinstance(data, h5py.Group):
        raise DatasetFormatError(f"{label}: no 'data' group, so not a robomimic-layout file")
    demos = demo_order([n for n, g in data.items() if isinstance(g, h5py.Group)])
    if not demos:
        raise DatasetFormatError(f"{label}: the 'data' group holds no demos")
    left_out = [
        f"{label} data/{n} (a dataset beside the demos)"
        for n, g in data.items()
        if not isinstance(g, h5py.Group)
    ]
    groups = [data[name] for name in demos]
    scans = [_scan_demo(f"{label} data/{n}", g, left_out) for n, g in zip(demos, groups)]
    per_demo: set[str] = set().union(*(extra for _, _, extra, _ in scans))
    # a key that is per step in some demos only is kept per demo in all of them
    either = per_demo & set(PER_STEP_OR_PER_DEMO_KEYS)
    keys: dict[str, DemoKey] = {}
    for name, (_, rows, extra, _) in zip(demos, scans):
        where = f"{label} data/{name}"
        for path in either & set(rows):
            _keep_per_demo(where, path, rows.pop(path), extra)
        if not keys:
            keys = _keys_of(where, rows)
            if not keys:
                raise DatasetFormatError(f"{where}: no per-step datasets")
        _same_keys(where, keys, rows)
    lengths = [length for length, _, _, _ in scans]
    handles = [found for _, _, _, found in scans]
    return RobomimicLayout(
        path=Path(label),
        demos=demos,
        lengths=lengths,
        keys=list(keys.values()),
        per_demo=sorted(per_demo),
        masks=_masks(f, label, set(demos), left_out),
        variant=_variant(data, sorted(per_demo)),
        groups=groups,
        datasets=handles,
        left_out=left_out,
    )
