"""What a diffusion-policy zarr (its ``ReplayBuffer`` layout) holds, opened read-only,
and what :mod:`~torchstore.formats.zarr_import` and :mod:`~torchstore.formats.zarr_export`
share.

The layout: a zarr group with ``data/<key>`` arrays whose first axis is every step of
every episode, concatenated, and ``meta/episode_ends``, the int64 cumulative end row of
each episode (episode ``i`` is rows ``ends[i-1]:ends[i]``). Real datasets (PushT's
``pusht_cchi_v7_replay.zarr``, robomimic and real-robot caches) are zarr v2 folders, often
shipped as a ``.zarr.zip`` (zarr's ``ZipStore``); both read here, and so do zarr v3
stores, through the ``zarr`` package (v3 API, zarr>=3.1.3: ``pip install -e ".[formats]"``).

Here: :func:`require_zarr`; :func:`open_source` (a ``.zarr`` folder, a ``.zarr.zip`` or a
zip holding one ``.zarr`` folder), :func:`child_group` / :func:`list_members` (its groups
and arrays) and :func:`open_chunks` / :func:`check_chunks` (its stored chunks, checked
before they are decoded); the ``episode_ends`` checks (:func:`read_episode_ends`,
:func:`check_length`); :func:`column_dtype` (the column dtype a source dtype is held in);
:func:`to_json` / :func:`from_json` (attributes and values in the manifest's JSON); and
the sizes both directions stream by.

Both directions stream: rows move in slabs of at most :data:`SLAB_BYTES`, cut where the
zarr chunks are cut, so each chunk is decoded or encoded exactly once, and the next slab
is read while the current one is written. The two modules read :data:`SLAB_BYTES`,
:data:`READ_BYTES` and :data:`META_BYTES` from this module when they run, so setting one
here changes both directions.

Damaged chunks (:func:`open_chunks`, :func:`check_chunks`): numcodecs' Blosc decoder
trusts the sizes in a chunk's 16-byte header, so a truncated chunk decodes without an
error into the header's full size, the missing part uninitialised memory. Before any row
is read, the import therefore checks each stored chunk of a Blosc-compressed array: its
header's compressed size (``cbytes``) must be the stored chunk's length and its
decompressed size (``nbytes``) the chunk's byte size, at the cost of a stat and a 16-byte
read per chunk (the file in a folder, the entry in a zip). A chunk that is not stored at
all reads as the array's fill value, which zarr 3 does on purpose (it writes no chunk
that holds only the fill value, in v2 stores too) but zarr 2, diffusion-policy's writer,
never does: for a zarr v2 array whose ``.zarray`` zarr 2 wrote (its keys sorted), absent
chunks are counted and warned about, not refused. What cannot be caught: the format
checksums no chunk's contents (unless the array has a checksum codec such as ``crc32c``),
and lz4 has no checksum either, so a byte flipped inside an lz4 Blosc chunk of the right
length decodes to different values without an error. Once imported, the store's own
checksums (``torchstore verify``) cover what was read.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import math
import os
import re
import stat
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import DatasetFormatError
from torchstore.extras import install_hint
from torchstore.formats import limits

__all__ = [
    "require_zarr",
    "open_source",
    "open_chunks",
    "check_chunks",
    "check_grid",
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
META_BYTES = limits.MAX_KEPT_BYTES
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
            f"reading and writing diffusion-policy zarr needs zarr 3: {install_hint('formats')}"
        ) from exc
    if int(zarr.__version__.split(".")[0]) < 3:
        raise ImportError(
            f"torchstore reads zarr with the zarr 3 API (v2 stores included); this is zarr "
            f"{zarr.__version__}: {install_hint('formats')} (zarr>=3.1.3)"
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


# ---------------------------------------------------------------- stored chunks
#: Bytes of a Blosc header (c-blosc's README_CHUNK_FORMAT; all little-endian): version,
#: versionlz, flags, typesize (a byte each), then uint32 nbytes (the decompressed size),
#: blocksize and cbytes (the compressed size, this header included).
BLOSC_HEADER = 16


class ChunkFiles:
    """The stored chunks of a zarr folder or zip, by store key: each one's length and
    first :data:`BLOSC_HEADER` bytes, without reading (or decompressing) the rest."""

    def __init__(self, source: Path):
        self.source = source
        self.prefix = f"{os.fspath(source)}/"  # a str, not a Path: joined once per chunk
        self.zip = None if source.is_dir() else zipfile.ZipFile(source)

    def head(self, key: str) -> tuple[int, bytes] | None:
        """``(stored length, first bytes)`` of the chunk at ``key``; None when none is."""
        if self.zip is not None:
            try:
                info = self.zip.getinfo(key)  # the last entry of a name, as ZipStore reads
            except KeyError:
                return None
            with self.zip.open(info) as f:
                return info.file_size, f.read(BLOSC_HEADER)
        try:
            fd = os.open(self.prefix + key, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            return st.st_size, os.read(fd, BLOSC_HEADER)
        finally:
            os.close(fd)

    def stored(self, path: str) -> list[str]:
        """Every object stored under the node ``path``, by its name relative to it (such
        as ``1.0`` or ``c/1/0``): what is there, not what the array's chunk grid names."""
        prefix = f"{path}/" if path else ""
        if self.zip is not None:
            return sorted({n[len(prefix) :] for n in self.zip.namelist() if n.startswith(prefix)})
        base = os.path.join(os.fspath(self.source), path)
        names = []
        for folder, _, files in os.walk(base):  # links to folders are not followed
            rel = os.path.relpath(folder, base)
            for name in files:
                names.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
        return sorted(names)

    def read(self, key: str) -> bytes | None:
        """The whole object at ``key`` (a small one: metadata); None when none is."""
        if self.zip is not None:
            try:
                return self.zip.read(key)
            except KeyError:
                return None
        try:
            return (self.source / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


@contextlib.contextmanager
def open_chunks(source: Path) -> Iterator[ChunkFiles]:
    """The :class:`ChunkFiles` of a source :func:`open_source` opened; closed after."""
    try:
        files = ChunkFiles(source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetFormatError(f"{source}: not a readable zip ({short_error(exc)})") from exc
    try:
        yield files
    finally:
        files.close()


def _blosc_sizes(arr: Any) -> tuple[bool, int | None]:
    """Whether ``arr``'s stored chunks are Blosc frames, and the decompressed size each
    header must give (None where filters or other codecs come between)."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec

    compressors = tuple(arr.compressors)
    if not compressors or not isinstance(compressors[-1], numcodecs.Blosc | BloscCodec):
        return False, None
    dtype = np.dtype(arr.dtype)
    plain = (
        len(compressors) == 1
        and not arr.filters
        and (arr.metadata.zarr_format == 2 or isinstance(arr.serializer, BytesCodec))
        and not dtype.hasobject
        and dtype.kind != "T"
    )
    return True, math.prod(arr.chunks) * dtype.itemsize if plain else None


def _blosc_problem(length: int, head: bytes, expected: int | None) -> str | None:
    """What is wrong with a stored Blosc chunk of ``length`` bytes starting ``head``."""
    if len(head) < BLOSC_HEADER:
        return f"it holds {length} bytes, fewer than a Blosc header's {BLOSC_HEADER}"
    nbytes = int.from_bytes(head[4:8], "little")
    cbytes = int.from_bytes(head[12:16], "little")
    if cbytes != length:
        return (
            f"it holds {length} bytes, but its Blosc header says {cbytes} (a truncated or "
            "overwritten chunk)"
        )
    if expected is not None and nbytes != expected:
        return (
            f"its Blosc header says it decompresses to {nbytes} bytes, but a chunk of this "
            f"array is {expected} bytes"
        )
    return None


def _zarr2_wrote(arr: Any, files: ChunkFiles) -> bool:
    """Whether zarr 2 (which stores every chunk) wrote ``arr``'s ``.zarray``, as far as one
    can tell: zarr 2 writes its keys sorted, zarr 3 (which leaves out chunks holding only
    the fill value) in the order ``shape``, ``chunks``, ``dtype``..."""
    try:
        raw = files.read(f"{arr.path}/.zarray")
        keys = list(json.loads(raw)) if raw is not None else []
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return True  # unknown: warn
    return keys == sorted(keys)


def _chunk_rows(arr: Any, coords: tuple[int, ...], ends: np.ndarray | None) -> str:
    """`` (rows a..b, episode i)`` of the chunk at ``coords`` (episodes when ``ends``)."""
    if not coords:
        return ""
    a = coords[0] * int(arr.chunks[0])
    b = min(a + int(arr.chunks[0]), int(arr.shape[0])) - 1
    if ends is None:
        return f" (rows {a}..{b})"
    first, last = (int(np.searchsorted(ends, r, side="right")) for r in (a, b))
    episodes = f"episode {first}" if first == last else f"episodes {first}..{last}"
    return f" (rows {a}..{b}, {episodes})"


def check_grid(arr: Any, name: str, label: str) -> tuple[int, ...]:
    """``arr``'s chunk grid (of shards, where it has them), after refusing chunks or
    shards that are not positive integers, one per dimension (a ``.zarray`` with a 0 in
    ``chunks`` would divide by zero), and chunks (or shards) over
    :data:`~torchstore.formats.limits.MAX_CHUNK_BYTES`."""
    shape = tuple(arr.shape)
    for what in ("chunks", "shards"):
        value = getattr(arr, what, None) if what == "shards" else arr.chunks
        if value is None:
            continue
        value = tuple(value)
        if len(value) != len(shape) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in value
        ):
            raise DatasetFormatError(
                f"{label}: {name} has {what} {list(value)} for its shape {list(shape)}; "
                f"{what} must be one positive integer per dimension"
            )
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise DatasetFormatError(f"{label}: {name} has the shape {list(shape)}")
    outer = tuple(getattr(arr, "shards", None) or arr.chunks)
    try:
        dtype = np.dtype(arr.dtype)
    except TypeError:  # a dtype no column takes: refused by name later
        dtype = np.dtype(np.uint8)
    limits.check_chunk(f"{label}: {name}", outer, dtype)  # read whole: one decode each
    return tuple(-(-n // c) for n, c in zip(shape, outer))


def _stored_chunks(arr: Any, files: ChunkFiles, grid: tuple[int, ...]) -> dict[tuple, str]:
    """The chunk coordinates of ``arr`` that are stored, and their keys, in grid order:
    the objects listed under the array, each kept when it is the key of a chunk in the
    grid (so 8e9 chunks declared and none stored cost one listing, not 8e9 lookups)."""
    found = {}
    for rel in files.stored(arr.path):
        parts = re.split(r"[./]", rel)
        if parts and parts[0] == "c":
            parts = parts[1:]
        if len(parts) != len(grid) or not all(p.isascii() and p.isdigit() for p in parts):
            continue
        coords = tuple(int(p) for p in parts)
        if all(c < g for c, g in zip(coords, grid)) and (
            arr.metadata.encode_chunk_key(coords) == rel
        ):
            found[coords] = rel
    if not grid and arr.metadata.encode_chunk_key(()) in files.stored(arr.path):
        found[()] = arr.metadata.encode_chunk_key(())
    return dict(sorted(found.items()))


def _first_missing(grid: tuple[int, ...], stored: dict[tuple, str]) -> tuple[int, ...]:
    """The first chunk in grid order that is not stored (within ``len(stored) + 1`` steps)."""
    for coords in itertools.product(*map(range, grid)):
        if coords not in stored:
            return coords
    return ()


def check_chunks(
    arr: Any, name: str, label: str, files: ChunkFiles, ends: np.ndarray | None = None
) -> None:
    """Refuse an array whose chunk grid is malformed (:func:`check_grid`), which declares
    far more chunks than it stores (:func:`~torchstore.formats.limits.check_unstored`), or
    a damaged stored chunk of it (shown as ``name``, such as ``data/img``): a Blosc one
    whose header disagrees with its stored length or with the chunk's size. Warn of
    chunks not stored (read as the fill value) when zarr 2, which stores every chunk,
    wrote ``arr`` (zarr 3 leaves out the chunks that hold only the fill value, in v3 and
    v2 stores alike). ``ends`` names the episodes of the rows.

    One listing of the stored chunks, then a :data:`BLOSC_HEADER`-byte read per stored
    Blosc chunk (sharded arrays: the listing only).
    """
    grid = check_grid(arr, name, label)
    try:
        stored = _stored_chunks(arr, files, grid)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise DatasetFormatError(
            f"{label}: the chunks of {name} cannot be listed ({short_error(exc)})"
        ) from exc
    outer = tuple(getattr(arr, "shards", None) or arr.chunks)
    chunk_bytes = math.prod(outer) * max(1, np.dtype(arr.dtype).itemsize)
    limits.check_unstored(f"{label}: {name}", math.prod(grid), len(stored), chunk_bytes)
    blosc, expected = _blosc_sizes(arr)
    if blosc and not getattr(arr, "shards", None):
        for coords, chunk_key in stored.items():
            key = f"{arr.path}/{chunk_key}"
            try:
                head = files.head(key)
            except (OSError, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
                raise DatasetFormatError(
                    f"{label}: {name} chunk {chunk_key}{_chunk_rows(arr, coords, ends)} "
                    f"cannot be read ({short_error(exc)})"
                ) from exc
            problem = None if head is None else _blosc_problem(*head, expected)
            if problem is not None:
                raise DatasetFormatError(
                    f"{label}: {name} chunk {chunk_key}{_chunk_rows(arr, coords, ends)} is "
                    f"damaged: {problem}; stored as {key}"
                )
    missing = math.prod(grid) - len(stored)
    if missing and arr.metadata.zarr_format == 2 and _zarr2_wrote(arr, files):
        first = _first_missing(grid, stored)
        fill = arr.fill_value.item() if isinstance(arr.fill_value, np.generic) else arr.fill_value
        warnings.warn(
            f"{label}: {name}: {missing} of {math.prod(grid)} chunks are not stored and read "
            f"as the fill value ({fill!r}), the first chunk "
            f"{arr.metadata.encode_chunk_key(first)}{_chunk_rows(arr, first, ends)}; zarr 2 "
            "(diffusion-policy's writer) stores every chunk, so these may be lost",
            stacklevel=3,
        )


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
def read_episode_ends(meta: Any, label: str, files: ChunkFiles | None = None) -> np.ndarray:
    """``meta/episode_ends`` as int64, checked (its stored chunks too, given ``files``)."""
    zarr = require_zarr()
    where = f"{label}: meta/episode_ends"
    if "episode_ends" not in meta:
        raise DatasetFormatError(f"{label}: no meta/episode_ends; the episodes are unknown")
    arr = meta["episode_ends"]
    if not isinstance(arr, zarr.Array) or arr.ndim != 1:
        raise DatasetFormatError(f"{where} must be a 1-D integer array")
    if np.dtype(arr.dtype).kind not in "iu":
        raise DatasetFormatError(f"{where} must hold integers, not {arr.dtype}")
    if files is not None:
        check_chunks(arr, "meta/episode_ends", label, files)
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
