"""diffusion-policy zarr into a store: :func:`import_zarr` and its private helpers.

:func:`import_zarr` makes every ``data/<key>`` array a column (nested groups under
``data/`` become ``/``-joined names; a key that
:func:`~torchstore.formats.zarr_export.export_zarr` flattened, named in the root attribute
``torchstore.data_keys``, gets its column's name back), in its exact dtype, row shape and
values, and ``meta/episode_ends`` the episodes. What the store has no place for is kept under
``metadata["zarr"]`` of the manifest: the other ``meta/`` arrays (as bytes), the
attributes of every group and array, each array's encoding (chunks, compressor) and
source dtype (big-endian and unsigned 16/32/64-bit arrays are held as the native or
wider type a column takes), which :func:`~torchstore.formats.zarr_export.export_zarr`
writes back as they were.

Rows stream in slabs of whole episodes of at most
:data:`~torchstore.formats.zarr_source.SLAB_BYTES` (an episode larger than that in
pieces), cut where the zarr chunks are cut, so each chunk is decoded exactly once, and the
next slab is read while the current one is written. The store is written under a hidden
name beside ``dest`` and renamed into place at the end, so ``dest`` never holds half an
import.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec, numpy_dtype, torch_dtype
from torchstore.errors import ColumnError, DatasetFormatError, EpisodeError
from torchstore.formats import limits, zarr_source
from torchstore.formats.zarr_source import (
    ChunkFiles,
    check_chunks,
    check_grid,
    check_length,
    child_group,
    column_dtype,
    list_members,
    open_chunks,
    open_source,
    read_episode_ends,
    short_error,
    to_json,
)

__all__ = ["import_zarr"]

_INT64_MAX = np.iinfo(np.int64).max


def _columns(
    arrays: dict[str, Any], ends: np.ndarray, label: str, names: dict[str, str]
) -> list[ColumnSpec]:
    """The column of each array, after refusing (before a row is read) a scalar, a
    malformed chunk grid, a length other than ``episode_ends[-1]`` and a row (or a step of
    all arrays) over :data:`~torchstore.formats.limits.MAX_ROW_BYTES`."""
    columns = []
    for key, arr in arrays.items():
        if arr.ndim == 0:
            raise DatasetFormatError(f"{label}: data/{key} is a scalar; it needs a row axis")
        check_grid(arr, f"data/{key}", label)
        check_length(key, arr.shape[0], ends, label)
        dtype = _numpy_dtype(arr, key, label)
        limits.check_row(f"{label}: data/{key}", arr.shape[1:], dtype)
        try:
            spec = ColumnSpec(names[key], torch_dtype(column_dtype(dtype)), arr.shape[1:])
            columns.append(spec)
        except (TypeError, ColumnError) as exc:
            raise DatasetFormatError(f"{label}: data/{key} cannot be a column: {exc}") from exc
    limits.check_step(f"{label}: data/", {f"data/{c.name}": c.row_nbytes for c in columns})
    return columns


def _numpy_dtype(arr: Any, key: str, label: str) -> np.dtype:
    try:
        return np.dtype(arr.dtype)
    except TypeError as exc:
        raise DatasetFormatError(f"{label}: data/{key} cannot be a column: {exc}") from exc


def _encoding(arr: Any) -> dict[str, Any]:
    meta = arr.metadata.to_dict()
    out = {k: v for k, v in meta.items() if k not in ("shape", "attributes", "node_type")}
    out["numpy_dtype"] = np.dtype(arr.dtype).str
    return to_json(out)


def _meta_entry(arr: Any, key: str, label: str, files: ChunkFiles) -> dict[str, Any]:
    if arr.nbytes > zarr_source.META_BYTES:
        raise DatasetFormatError(
            f"{label}: meta/{key} holds {arr.nbytes} bytes; only meta arrays of up to "
            f"{zarr_source.META_BYTES} bytes are kept (in the manifest)"
        )
    check_chunks(arr, f"meta/{key}", label, files)
    try:
        value = np.asarray(arr[...])
    except Exception as exc:  # noqa: BLE001 - a corrupted chunk
        raise DatasetFormatError(
            f"{label}: meta/{key} cannot be read ({short_error(exc)})"
        ) from exc
    entry = {"shape": list(value.shape), "attrs": to_json(dict(arr.attrs))}
    if value.dtype == object:
        entry.update(dtype="object", values=to_json(value.tolist()))
    else:
        entry.update(
            dtype=value.dtype.str,
            base64=base64.b64encode(np.ascontiguousarray(value).tobytes()).decode(),
        )
    entry["encoding"] = _encoding(arr)
    return entry


def _source_metadata(
    root: Any,
    label: str,
    arrays: dict[str, Any],
    data_groups: list[str],
    files: ChunkFiles,
    names: dict[str, str],
) -> dict[str, Any]:
    """``metadata["zarr"]``: what export writes back beside the columns."""
    data, meta = root["data"], root["meta"]
    meta_arrays, meta_groups = list_members(meta, label)
    attrs = {"": dict(root.attrs), "data": dict(data.attrs), "meta": dict(meta.attrs)}
    attrs.update({f"data/{g}": dict(data[g].attrs) for g in data_groups})
    attrs.update({f"meta/{g}": dict(meta[g].attrs) for g in meta_groups})
    attrs.update({f"data/{k}": dict(a.attrs) for k, a in arrays.items()})
    attrs["meta/episode_ends"] = dict(meta["episode_ends"].attrs)
    return {
        "zarr_format": root.metadata.zarr_format,
        "source": label,
        "groups": ["data", *(f"data/{g}" for g in data_groups), "meta"],
        "attrs": to_json(attrs),
        "arrays": {f"data/{k}": _encoding(a) for k, a in arrays.items()}
        | {"meta/episode_ends": _encoding(meta["episode_ends"])},
        "meta": {
            k: _meta_entry(a, k, label, files)
            for k, a in meta_arrays.items()
            if k != "episode_ends"
        },
        "meta_groups": meta_groups,
        "keys": {name: key for key, name in names.items() if key != name},
    }


# ---------------------------------------------------------------- reading in slabs
def _plan(ends: np.ndarray, row_bytes: int, slab_bytes: int) -> Iterator[tuple]:
    """``(start, stop, lengths, closes)`` slabs of whole episodes (``lengths``) of at most
    ``slab_bytes``; an episode larger than that comes in pieces (``lengths`` None), the
    last one with ``closes`` true."""
    max_rows = max(1, slab_bytes // max(row_bytes, 1))
    i, n = 0, len(ends)
    while i < n:
        first = int(ends[i - 1]) if i else 0
        if int(ends[i]) - first > max_rows:
            stop = int(ends[i])
            for a in range(first, stop, max_rows):
                b = min(a + max_rows, stop)
                yield a, b, None, b == stop
            i += 1
            continue
        j = int(np.searchsorted(ends, first + max_rows, side="right"))  # ends[j-1] fits
        yield first, int(ends[j - 1]), np.diff(ends[i:j], prepend=first).tolist(), True
        i = j


class _ChunkReader:
    """Sequential rows of one zarr array, read a whole number of chunks at a time.

    A slab ``[a, b)`` cut inside a chunk would make zarr decode that chunk again for the
    next slab, so the rows past ``b`` up to the chunk's end are kept for the next call.
    Each read also fetches at least :data:`~torchstore.formats.zarr_source.READ_BYTES` (a
    low-dim array's slab is a few KB, and every zarr call costs a round trip through its
    event loop).
    """

    def __init__(self, arr: Any, key: str, dtype: np.dtype, label: str, ends: np.ndarray):
        self.arr, self.key, self.dtype, self.label, self.ends = arr, key, dtype, label, ends
        self.chunk = int((getattr(arr, "shards", None) or arr.chunks)[0])
        self.rows = int(arr.shape[0])
        row_bytes = math.prod(arr.shape[1:]) * dtype.itemsize
        self.ahead = max(1, zarr_source.READ_BYTES // max(1, row_bytes))
        self.kept = np.empty((0, *arr.shape[1:]), dtype=dtype)
        self.kept_from = 0  # the row kept[0] is

    def take(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)``; ``start`` is where the last call stopped."""
        have = self.kept_from + len(self.kept)
        rows = self.kept[start - self.kept_from :]
        if stop > have:
            want = max(stop, have + self.ahead)
            fresh = self._read(have, min(self.rows, -(-want // self.chunk) * self.chunk))
            rows = np.concatenate([rows, fresh]) if len(rows) else fresh
        out, self.kept, self.kept_from = rows[: stop - start], rows[stop - start :], stop
        return out

    def _read(self, a: int, b: int) -> np.ndarray:
        try:
            value = np.asarray(self.arr[a:b])
        except Exception as exc:  # noqa: BLE001 - numcodecs / zarr decode errors
            raise self._damaged(a, b, exc) from exc
        if value.dtype != self.dtype:
            if self.dtype == np.dtype("int64") and value.dtype.kind == "u":
                self._check_int64(value, a)
            value = value.astype(self.dtype)
        return value

    def _check_int64(self, value: np.ndarray, a: int) -> None:
        over = value.reshape(len(value), -1) > _INT64_MAX
        if over.any():
            row = a + int(np.nonzero(over.any(axis=1))[0][0])
            raise DatasetFormatError(
                f"{self.label}: data/{self.key} (uint64) holds a value above int64's range at "
                f"row {row} (episode {self._episode(row)}); an int64 column cannot hold it"
            )

    def _episode(self, row: int) -> int:
        return int(np.searchsorted(self.ends, row, side="right"))

    def _damaged(self, a: int, b: int, exc: BaseException) -> DatasetFormatError:
        """The error naming the first chunk of ``[a, b)`` that fails (and its episodes)."""
        bad = (a, b)
        for c in range(a, b, self.chunk):
            try:
                self.arr[c : min(c + self.chunk, b)]
            except Exception as chunk_exc:  # noqa: BLE001
                bad, exc = (c, min(c + self.chunk, b)), chunk_exc
                break
        first, last = self._episode(bad[0]), self._episode(bad[1] - 1)
        episodes = f"episode {first}" if first == last else f"episodes {first}..{last}"
        return DatasetFormatError(
            f"{self.label}: data/{self.key} rows {bad[0]}..{bad[1] - 1} ({episodes}) cannot "
            f"be read: the chunk is damaged ({short_error(exc)})"
        )


def _write_slabs(writer: Any, readers: dict, plan: list, bar: Any) -> None:
    """Read each planned slab (the next one while this one is written) and commit it."""

    def read(item):
        start, stop = item[0], item[1]
        return {key: r.take(start, stop) for key, r in readers.items()}

    with ThreadPoolExecutor(1, thread_name_prefix="zarr-read") as pool:
        ahead = pool.submit(read, plan[0]) if plan else None
        for k, (start, stop, lengths, closes) in enumerate(plan):
            rows = ahead.result()
            ahead = pool.submit(read, plan[k + 1]) if k + 1 < len(plan) else None
            if lengths is not None:
                writer.add_episodes(rows, lengths)
            else:
                writer.append(rows)
                if closes:
                    writer.end_episode()
            del rows
            if bar is not None:
                bar.update(stop - start)


def _recorded_store(attrs: Mapping) -> dict[str, Any]:
    """What an export of a store recorded in the root attribute ``torchstore``: its env
    id, seed, metadata and column order (each only when well-formed)."""
    kept = attrs.get("torchstore")
    kept = kept if isinstance(kept, Mapping) else {}
    env_id, seed, meta, order = (kept.get(k) for k in ("env_id", "seed", "metadata", "columns"))
    data_keys = kept.get("data_keys")
    if not isinstance(data_keys, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data_keys.items()
    ):
        data_keys = {}
    return {
        "data_keys": dict(data_keys),
        "env_id": env_id if isinstance(env_id, str) else None,
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "metadata": {k: v for k, v in meta.items() if k != "zarr"}
        if isinstance(meta, Mapping)
        else {},
        "columns": order if isinstance(order, list) else [],
    }


def _column_names(arrays: dict[str, Any], data_keys: Mapping[str, str]) -> dict[str, str]:
    """``{key under data/: column name}``: a key an export renamed (``data/agentview_image``
    from ``obs/agentview_image``) gets its column's name back, when the names recorded
    are all keys here and give every array a name of its own; else each key is its name."""
    names = {key: data_keys.get(key, key) for key in arrays}
    if not set(data_keys) <= set(arrays) or len(set(names.values())) != len(names):
        return {key: key for key in arrays}
    return names


def _ordered(columns: list[ColumnSpec], order: list) -> list[ColumnSpec]:
    """``columns`` in the recorded order when it names exactly them; else as they are."""
    by_name = {c.name: c for c in columns}
    if sorted(map(str, order)) != sorted(by_name) or len(order) != len(columns):
        return columns
    return [by_name[name] for name in order]


def import_zarr(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Import a diffusion-policy zarr (its ``ReplayBuffer`` layout) into a new store.

    Args:
        source: a ``.zarr`` folder (zarr v2 or v3), or a zip: a ``.zarr.zip`` (zarr's
            ``ZipStore``), or a zip holding one ``.zarr`` folder.
        dest: the store file to write (see :func:`torchstore.io.destination.check_destination`).
        overwrite: replace an existing store at ``dest``.
        progress: draw a progress bar over rows.

    Every ``data/<key>`` array becomes a column of the same dtype, row shape and values
    (``uint16``/``uint32`` arrays become ``int32``/``int64`` columns, ``uint64`` ones
    ``int64``, big-endian ones native; ``metadata["zarr"]`` records the source dtype for
    :func:`~torchstore.formats.zarr_export.export_zarr`). Episodes come from
    ``meta/episode_ends``.

    Raises:
        DatasetFormatError: no ``data`` group or ``meta/episode_ends``; ``episode_ends``
            negative or not increasing; an array longer or shorter than
            ``episode_ends[-1]``; a dtype no column takes; a damaged chunk (one that fails
            to decode, or a Blosc chunk whose header's sizes are not its stored length and
            the chunk's size: a truncated file). The message names the file, the key and
            the episode. Nothing is left at ``dest``.

    Warns (``UserWarning``) of chunks of a zarr v2 array that zarr 2 wrote which are not
    stored, and so read as the fill value (zarr 3 leaves out chunks holding only that).
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.io.destination import check_destination, written_beside
    from torchstore.io.progress import progress_bar

    source = Path(source)
    dest = check_destination(dest, sources=[source], overwrite=overwrite)
    label = str(source)
    with open_source(source) as root, open_chunks(source) as files:
        data = child_group(root, "data", label, "a diffusion-policy zarr keeps its arrays in data/")
        meta = child_group(root, "meta", label, "a diffusion-policy zarr keeps meta/episode_ends")
        ends = read_episode_ends(meta, label, files)
        arrays, data_groups = list_members(data, label)
        if not arrays:
            raise DatasetFormatError(f"{label}: data/ holds no arrays")
        recorded = _recorded_store(root.attrs)
        names = _column_names(arrays, recorded["data_keys"])
        columns = _columns(arrays, ends, label, names)
        for key, arr in arrays.items():  # before a row is read: Blosc decodes short chunks
            check_chunks(arr, f"data/{key}", label, files, ends)
        columns = _ordered(columns, recorded["columns"])
        metadata = {
            **to_json(recorded["metadata"]),
            "zarr": _source_metadata(root, label, arrays, data_groups, files, names),
        }
        key_of = {name: key for key, name in names.items()}
        readers = {
            c.name: _ChunkReader(
                arrays[key_of[c.name]], key_of[c.name], numpy_dtype(c.dtype), label, ends
            )
            for c in columns
        }
        plan = list(_plan(ends, sum(c.row_nbytes for c in columns), zarr_source.SLAB_BYTES))
        total = int(ends[-1]) if len(ends) else 0
        bar = progress_bar(enabled=progress, total=total, unit="row", desc="import", leave=False)
        try:
            with (
                written_beside(dest, "importing") as partial,
                TrajectoryStoreWriter(
                    partial, columns, recorded["env_id"], recorded["seed"], metadata,
                    overwrite=True, expected_rows=total,
                ) as writer,
            ):  # fmt: skip
                _write_slabs(writer, readers, plan, bar)
        except (ColumnError, EpisodeError) as exc:
            raise DatasetFormatError(f"{label}: {exc}") from exc
        finally:
            if bar is not None:
                bar.close()
    return dest
