"""What a diffusion-policy zarr (its ``ReplayBuffer`` layout) holds, opened read-only,
and what :mod:`~torchstore.formats.zarr_import` and :mod:`~torchstore.formats.zarr_export`
share.

The layout: a zarr group with ``data/<key>`` arrays whose first axis is every step of
every episode, concatenated, and ``meta/episode_ends``, the int64 cumulative end row of
each episode (episode ``i`` is rows ``ends[i-1]:ends[i]``). Real datasets (PushT's
``pusht_cchi_v7_replay.zarr``, robomimic and real-robot caches) are zarr v2 folders, often
shipped as a ``.zarr.zip`` (zarr's ``ZipStore``); both read here, and so do zarr v3
stores, through the ``zarr`` package (v3 API, ``pip install "zarr>=3.1.3"``).

Here: :func:`require_zarr`; :func:`open_source` (a ``.zarr`` folder, a ``.zarr.zip`` or a
zip holding one ``.zarr`` folder) and :func:`child_group` / :func:`list_members` (its
groups and arrays); the ``episode_ends`` checks (:func:`read_episode_ends`,
:func:`check_length`); :func:`column_dtype` (the column dtype a source dtype is held in);
:func:`to_json` / :func:`from_json` (attributes and values in the manifest's JSON); and
the sizes both directions stream by.

Both directions stream: rows move in slabs of at most :data:`SLAB_BYTES`, cut where the
zarr chunks are cut, so each chunk is decoded or encoded exactly once, and the next slab
is read while the current one is written. The two modules read :data:`SLAB_BYTES`,
:data:`READ_BYTES` and :data:`META_BYTES` from this module when they run, so setting one
here changes both directions.
"""

from __future__ import annotations

import base64
import contextlib
import math
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import DatasetFormatError

__all__ = [
    "require_zarr",
    "open_source",
    "child_group",
    "list_members",
    "read_episode_ends",
    "check_length",
    "column_dtype",
    "to_json",
    "from_json",
    "short_error",
    "SLAB_BYTES",
    "READ_BYTES",
    "META_BYTES",
    "TARGET_CHUNK_BYTES",
]

#: Bytes of rows read (and written) per slab: whole episodes, one commit per slab. Under
#: glibc's 32 MiB ceiling for heap allocations, so slab buffers are reused, not mmapped
#: (and page-faulted) anew each time.
SLAB_BYTES = 24 * 2**20
#: Bytes one zarr read of an array fetches at least (low-dim arrays are read ahead).
READ_BYTES = 8 * 2**20
#: Bytes of ``meta/`` arrays (other than ``episode_ends``) kept in the manifest, at most.
META_BYTES = 16 * 2**20
#: diffusion-policy's ``get_optimal_chunks`` target: about 2 MB per chunk.
TARGET_CHUNK_BYTES = 2e6

# Source dtypes a column cannot take as they are, and the column dtype that holds them.
_WIDER = {np.dtype("uint16"): np.dtype("int32"), np.dtype("uint32"): np.dtype("int64")}
_UINT64 = np.dtype("uint64")


def require_zarr():
    """The ``zarr`` module (version 3), or an ImportError naming what to install."""
    try:
        import zarr
    except ImportError as exc:
        raise ImportError(
            'reading and writing diffusion-policy zarr needs zarr 3: pip install "zarr>=3.1.3"'
        ) from exc
    if int(zarr.__version__.split(".")[0]) < 3:
        raise ImportError(
            f"torchstore reads zarr with the zarr 3 API (v2 stores included); this is zarr "
            f'{zarr.__version__}: pip install "zarr>=3.1.3"'
        )
    return zarr


def short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


# ---------------------------------------------------------------- JSON for the manifest
def to_json(value: Any) -> Any:
    """``value`` as plain JSON the manifest takes (no NaN: non-finite floats are tagged)."""
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def from_json(value: Any) -> Any:
    """The inverse of :func:`to_json`."""
    if isinstance(value, dict):
        if len(value) == 1 and "$float" in value:
            return float(value["$float"])
        if len(value) == 1 and "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


# ---------------------------------------------------------------- opening a source
def _zip_root(path: Path) -> str:
    """The group inside a zip: its root (a ``.zarr.zip``), else the one zarr folder it holds."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetFormatError(f"{path}: not a readable zip ({short_error(exc)})") from exc
    marks = (".zgroup", "zarr.json")
    if any(m in names for m in marks):
        return ""
    found = sorted(
        {
            n.rsplit("/", 1)[0]
            for n in names
            if n.endswith(tuple(f"/{m}" for m in marks))
            and any(f"{n.rsplit('/', 1)[0]}/data/{m}" in names for m in marks)
        }
    )
    if len(found) != 1:
        what = f"several ({found[:4]})" if found else "none"
        raise DatasetFormatError(
            f"{path}: a zip of a diffusion-policy zarr holds one group with a 'data' group "
            f"(at its root for a .zarr.zip); found {what}"
        )
    return found[0]


@contextlib.contextmanager
def open_source(source: Path) -> Iterator[Any]:
    """The root group of a zarr folder or zip, read-only; the store is closed after."""
    zarr = require_zarr()
    from zarr.storage import LocalStore, ZipStore

    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    if source.is_dir():
        store, path = LocalStore(source, read_only=True), ""
    elif zipfile.is_zipfile(source):
        path = _zip_root(source)
        store = ZipStore(source, mode="r")
    else:
        raise DatasetFormatError(f"{source} is neither a zarr folder nor a zip of one")
    try:
        try:
            root = zarr.open_group(store=store, path=path or None, mode="r")
        except Exception as exc:  # noqa: BLE001 - zarr raises FileNotFoundError, ValueError...
            raise DatasetFormatError(
                f"{source}: not a readable zarr group ({short_error(exc)})"
            ) from exc
        yield root
    finally:
        store.close()


def child_group(root: Any, name: str, label: str, what: str) -> Any:
    zarr = require_zarr()
    try:
        node = root[name]
    except KeyError:
        raise DatasetFormatError(f"{label}: no '{name}' group; {what}") from None
    except Exception as exc:  # noqa: BLE001 - damaged metadata of the node
        raise DatasetFormatError(
            f"{label}: '{name}' cannot be opened ({short_error(exc)})"
        ) from exc
    if not isinstance(node, zarr.Group):
        raise DatasetFormatError(f"{label}: '{name}' is an array, not a group; {what}")
    return node


def list_members(group: Any, label: str) -> tuple[dict[str, Any], list[str]]:
    """Every array (by path under ``group``) and subgroup path, sorted."""
    zarr = require_zarr()
    try:
        members = sorted(group.members(max_depth=None), key=lambda m: m[0])
    except Exception as exc:  # noqa: BLE001 - a damaged .zarray / zarr.json below
        hint = ""
        if "codec" in str(exc).lower():
            hint = (
                "; a codec from another package (such as imagecodecs' JPEG XL, which UMI "
                "datasets use) must be registered with numcodecs.register_codec first"
            )
        raise DatasetFormatError(
            f"{label}: the arrays of '{group.path}' cannot be listed ({short_error(exc)}){hint}"
        ) from exc
    arrays = {n: a for n, a in members if isinstance(a, zarr.Array)}
    groups = [n for n, g in members if isinstance(g, zarr.Group)]
    return arrays, groups


# ---------------------------------------------------------------- what a source holds
def read_episode_ends(meta: Any, label: str) -> np.ndarray:
    zarr = require_zarr()
    where = f"{label}: meta/episode_ends"
    if "episode_ends" not in meta:
        raise DatasetFormatError(f"{label}: no meta/episode_ends; the episodes are unknown")
    arr = meta["episode_ends"]
    if not isinstance(arr, zarr.Array) or arr.ndim != 1:
        raise DatasetFormatError(f"{where} must be a 1-D integer array")
    if np.dtype(arr.dtype).kind not in "iu":
        raise DatasetFormatError(f"{where} must hold integers, not {arr.dtype}")
    try:
        ends = np.asarray(arr[:]).astype(np.int64)
    except Exception as exc:  # noqa: BLE001 - a corrupted chunk
        raise DatasetFormatError(f"{where} cannot be read ({short_error(exc)})") from exc
    if len(ends) and ends[0] < 0:
        raise DatasetFormatError(f"{where}: episode 0 ends at row {ends[0]}, which is negative")
    steps = np.diff(ends, prepend=0)
    if len(ends) and (steps <= 0).any():
        i = int(np.nonzero(steps <= 0)[0][0])
        before = f"after episode {i - 1}'s end {ends[i - 1]}" if i else "at row 0"
        raise DatasetFormatError(
            f"{where} is not increasing: episode {i} ends at row {ends[i]}, {before} "
            "(every episode needs at least one row)"
        )
    return ends


def check_length(key: str, rows: int, ends: np.ndarray, label: str) -> None:
    total = int(ends[-1]) if len(ends) else 0
    if rows == total:
        return
    if rows < total:
        i = int(np.searchsorted(ends, rows, side="right"))
        raise DatasetFormatError(
            f"{label}: meta/episode_ends overruns data/{key}: episode {i} ends at row "
            f"{ends[i]}, but data/{key} has {rows} rows"
        )
    last = f"the last episode ({len(ends) - 1})" if len(ends) else "no episode"
    raise DatasetFormatError(
        f"{label}: data/{key} has {rows} rows, but {last} ends at row {total} "
        f"(meta/episode_ends[-1]); rows {total}..{rows - 1} belong to no episode"
    )


def column_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a column holds a source dtype in (native order, unsigned made wider)."""
    if dtype.kind not in "biuf":
        return dtype  # torch_dtype refuses it, naming it
    native = np.dtype(f"{dtype.kind}{dtype.itemsize}")
    if native in _WIDER:
        return _WIDER[native]
    return np.dtype("int64") if native == _UINT64 else native
