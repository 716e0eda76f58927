"""Stores out to diffusion-policy zarr: :func:`export_zarr`, :func:`flat_keys`,
:func:`optimal_chunks` and their private helpers.

:func:`export_zarr` writes a store's columns as flat ``data/<key>`` arrays (nested names
flattened by :func:`flat_keys`, since diffusion-policy's ``ReplayBuffer.copy_from_path``
loads every member of ``data/`` as an array) and its episodes as ``meta/episode_ends``.
For a store made by :func:`~torchstore.formats.zarr_import.import_zarr` it writes back what
``metadata["zarr"]`` kept (the other ``meta/`` arrays, the attributes, each array's
chunks and source dtype), so zarr -> store -> zarr gives the same arrays (values, dtype,
shape), ``episode_ends`` and attributes; store -> zarr -> store gives the same columns and
episodes. :func:`optimal_chunks` is diffusion-policy's ``get_optimal_chunks``, the chunks
an array gets when it has none of its own.

Rows stream in slabs of at most :data:`~torchstore.formats.zarr_source.SLAB_BYTES`,
written a whole number of chunks at a time, so each chunk is encoded exactly once, and
the next slab is read from the store while the current one is written. The zarr is
written under a hidden name beside ``dest`` and renamed into place at the end, so
``dest`` never holds half an export.
"""

from __future__ import annotations

import base64
import math
import os
import shutil
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec, numpy_dtype
from torchstore.errors import ArgumentError, DatasetFormatError, DestinationError
from torchstore.formats import zarr_source
from torchstore.formats.zarr_source import (
    TARGET_CHUNK_BYTES,
    column_dtype,
    from_json,
    require_zarr,
)

__all__ = ["export_zarr", "flat_keys", "optimal_chunks", "KEY_SEPARATOR"]


def optimal_chunks(
    shape: tuple[int, ...], itemsize: int, target_bytes: float = TARGET_CHUNK_BYTES
) -> tuple[int, ...]:
    """diffusion-policy's ``get_optimal_chunks``: chunks of about ``target_bytes``.

    Whole trailing dimensions while they fit, then as much of the next one as fits, and 1
    for the dimensions before it. For the usual rows (images up to 2 MB, low-dim vectors)
    that is whole rows, ``ceil(2e6 / row_bytes)`` of them, or the whole array if fewer.
    """
    rshape = list(shape[::-1])
    split = len(shape) - 1
    for i in range(len(shape) - 1):
        here = itemsize * math.prod(rshape[:i])
        after = itemsize * math.prod(rshape[: i + 1])
        if here <= target_bytes < after:
            split = i
    rchunks = rshape[:split]
    inner = itemsize * math.prod(rshape[:split])
    rchunks.append(max(1, min(rshape[split], math.ceil(target_bytes / inner))))
    rchunks.extend([1] * (len(shape) - len(rchunks)))
    return tuple(int(c) for c in rchunks[::-1])


def _compressor(compressor: Any, zarr_format: int) -> Any:
    """The codec for ``compressor`` ("default", "disk", None or a codec) in ``zarr_format``."""
    import numcodecs

    if isinstance(compressor, str):
        if compressor not in ("default", "disk"):
            raise ArgumentError(
                f"compressor ({compressor!r}) must be 'default', 'disk', None or a codec"
            )
        # diffusion-policy's ReplayBuffer.resolve_compressor('default' / 'disk')
        compressor = (
            numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)
            if compressor == "default"
            else numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE)
        )
    if compressor is None:
        return None
    numcodec = isinstance(compressor, numcodecs.abc.Codec)
    if zarr_format == 2 and not numcodec:
        raise ArgumentError(f"a zarr v2 compressor is a numcodecs codec, not {compressor!r}")
    if zarr_format == 3 and isinstance(compressor, numcodecs.Blosc):
        from zarr.codecs import BloscCodec

        shuffle = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}[int(compressor.shuffle)]
        return BloscCodec(
            cname=compressor.cname,
            clevel=compressor.clevel,
            shuffle=shuffle,
            blocksize=compressor.blocksize,
        )
    if zarr_format == 3 and numcodec:  # v3 takes numcodecs codecs through zarr's wrappers
        import zarr.codecs.numcodecs as wrappers

        wrapper = getattr(wrappers, type(compressor).__name__, None)
        if wrapper is None:
            raise ArgumentError(f"zarr.codecs.numcodecs has no zarr v3 codec for {compressor!r}")
        config = {k: v for k, v in compressor.get_config().items() if k != "id"}
        return wrapper(**config)
    return compressor


def _source_dtype(spec: ColumnSpec, recorded: Mapping | None, zarr_format: int) -> np.dtype:
    """The dtype to write a column as: the one it was imported from, if it maps to it."""
    dtype = numpy_dtype(spec.dtype)
    if not recorded or "numpy_dtype" not in recorded:
        return dtype
    try:
        source = np.dtype(recorded["numpy_dtype"])
    except TypeError:
        return dtype
    if source.kind not in "biuf" or column_dtype(source) != dtype:
        return dtype
    if zarr_format == 3 and source.byteorder == ">":
        source = source.newbyteorder("=")  # v3 keeps byte order in its codecs, not the dtype
    return source


#: What joins the parts of a nested column name into one flat ``data/`` key:
#: ``next/obs/agentview_image`` -> ``data/next.obs.agentview_image``.
KEY_SEPARATOR = "."


def flat_keys(names: list[str], where: str = "the store") -> dict[str, str]:
    """The flat ``data/`` key of each column (``{column: key}``), as diffusion-policy's
    ``ReplayBuffer`` reads them: ``copy_from_path`` loads every member of ``data/`` as an
    array, so a nested group there fails to load.

    ``obs/<k>`` becomes ``<k>``, as diffusion-policy's robomimic converter names
    observation keys (``data/agentview_image``, ``data/robot0_eef_pos``, and ``action``
    stays ``data/action``), unless another column takes that key (then it is
    ``obs.<k>``); any other nested name joins its parts with :data:`KEY_SEPARATOR`
    (``next/obs/object`` -> ``next.obs.object``); flat names stay as they are.

    Raises:
        DatasetFormatError: two columns would get the same key (``a/b`` and ``a.b``).
    """
    joined = {n: n.replace("/", KEY_SEPARATOR) for n in names}
    short = {n: n.removeprefix("obs/") for n in names if n.startswith("obs/") and n.count("/") == 1}
    taken = [joined[n] for n in names if n not in short] + list(short.values())
    keys = {n: short[n] if n in short and taken.count(short[n]) == 1 else joined[n] for n in names}
    seen: dict[str, str] = {}
    for name, key in keys.items():
        if key in seen:
            raise DatasetFormatError(
                f"{where}: columns '{seen[key]}' and '{name}' would both be written as "
                f"data/{key} (diffusion-policy's flat keys); rename one of them"
            )
        seen[key] = name
    return keys


def _data_keys(store: Any, recorded: Mapping) -> dict[str, str]:
    """``{column: key under data/}``: where an imported zarr had each array, else
    :func:`flat_keys`."""
    names = [c.name for c in store.columns]
    if not recorded:
        return flat_keys(names, str(store.path))
    kept = recorded.get("keys") if isinstance(recorded.get("keys"), Mapping) else {}
    keys = {n: kept.get(n) if isinstance(kept.get(n), str) else n for n in names}
    if len(set(keys.values())) != len(keys):
        return {n: n for n in names}
    return keys


class _ChunkWriter:
    """Rows of one zarr array, written a whole number of chunks at a time (each chunk is
    encoded once, never read back to be merged); at most a chunk's rows are held."""

    def __init__(self, arr: Any, dtype: np.dtype):
        self.arr, self.dtype = arr, dtype
        self.chunk = int(arr.chunks[0])
        self.pos = 0
        self.held: list[np.ndarray] = []
        self.held_rows = 0

    def write(self, rows: np.ndarray) -> None:
        if self.held_rows:  # complete the chunk begun by the last slab
            need = self.chunk - self.held_rows
            self._hold(rows[:need])
            rows = rows[need:]
            if self.held_rows < self.chunk:
                return
            self._put(np.concatenate(self.held))
            self.held, self.held_rows = [], 0
        whole = len(rows) // self.chunk * self.chunk
        if whole:
            self._put(rows[:whole])  # a view: the slab's aligned rows are not copied
        if len(rows) > whole:
            self._hold(rows[whole:])

    def finish(self) -> None:
        if self.held_rows:
            self._put(np.concatenate(self.held))
            self.held, self.held_rows = [], 0

    def _hold(self, rows: np.ndarray) -> None:
        if len(rows):
            self.held.append(rows.copy())  # a copy: a view would keep the whole slab alive
            self.held_rows += len(rows)

    def _put(self, rows: np.ndarray) -> None:
        if rows.dtype != self.dtype:
            rows = rows.astype(self.dtype)
        self.arr[self.pos : self.pos + len(rows)] = rows
        self.pos += len(rows)


def _replace(partial: Path, dest: Path) -> None:
    """Put ``partial`` (a folder or a file) at ``dest``, replacing what the checks allowed."""
    if dest.is_dir():
        old = dest.with_name(f".{dest.name}.replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(partial, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, dest)


def _check_export_dest(dest: Path, as_zip: bool, overwrite: bool, source: Path) -> None:
    from torchstore.io.destination import check_destination

    check_destination(
        dest, sources=[source], overwrite=overwrite, what="file" if as_zip else "folder"
    )
    if not (dest.exists() and overwrite):
        return
    if as_zip and not zipfile.is_zipfile(dest):
        raise DestinationError(
            f"{dest} exists and is not a zip; it is not replaced even when overwriting"
        )
    if not as_zip and any(dest.iterdir()) and not _is_zarr_folder(dest):
        raise DestinationError(
            f"{dest} exists and is not a zarr folder; it is not replaced even when overwriting"
        )


def _is_zarr_folder(path: Path) -> bool:
    return (path / ".zgroup").is_file() or (path / "zarr.json").is_file()


def _group_paths(keys: dict[str, str], recorded: Mapping) -> list[str]:
    """Every group to create, parents first: data, meta, recorded and implied subgroups."""
    paths = {"data", "meta"}
    paths.update(g for g in recorded.get("groups", []) if isinstance(g, str) and g)
    paths.update(f"meta/{g}" for g in recorded.get("meta_groups", []) if isinstance(g, str))
    for key in keys.values():
        parts = f"data/{key}".split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return sorted(paths, key=lambda p: (p.count("/"), p))


def _root_attrs(
    store: Any, recorded: Mapping, attrs: Mapping, keys: dict[str, str]
) -> dict[str, Any]:
    """The root group's attributes: the imported zarr's own, else what the store records
    (``data_keys``: the column each renamed ``data/`` key holds)."""
    if recorded:
        return dict(attrs.get("", {}))
    manifest = store.manifest
    kept = {
        "env_id": manifest.env_id,
        "seed": manifest.seed,
        "metadata": dict(manifest.metadata),
        "data_keys": {key: name for name, key in keys.items() if key != name},
    }
    kept = {k: v for k, v in kept.items() if v not in (None, {})}
    return {"torchstore": {**kept, "columns": [c.name for c in store.columns]}}


def _meta_value(entry: Mapping) -> np.ndarray:
    if entry.get("dtype") == "object":
        return np.array(from_json(entry.get("values")), dtype=object)
    raw = base64.b64decode(entry["base64"])
    return np.frombuffer(raw, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"]).copy()


def _source_chunks(encoding: Mapping | None, ndim: int) -> tuple[int, ...] | None:
    """The chunks an imported array had (v2 ``chunks``, v3 ``chunk_grid``), if usable."""
    if not isinstance(encoding, Mapping):
        return None
    chunks = encoding.get("chunks")
    grid = encoding.get("chunk_grid")
    if chunks is None and isinstance(grid, Mapping):
        chunks = (grid.get("configuration") or {}).get("chunk_shape")
    if (
        isinstance(chunks, list)
        and len(chunks) == ndim
        and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in chunks)
    ):
        return tuple(chunks)
    return None


def _create_arrays(store: Any, groups: dict, spec_dtypes: dict, layout: dict) -> dict:
    """The empty data arrays, full size, with their chunks, codec and attributes."""
    arrays = {}
    rows = store.num_rows
    for spec, dtype in spec_dtypes.items():
        path = f"data/{layout['keys'][spec.name]}"
        kept = (layout["recorded"].get("arrays") or {}).get(path)
        parent, _, leaf = path.rpartition("/")
        shape = (rows, *spec.shape)
        if layout["chunk_rows"] is not None:
            chunks = (layout["chunk_rows"], *spec.shape)
        else:
            chunks = _source_chunks(kept, len(shape)) or optimal_chunks(shape, dtype.itemsize)
        names = kept.get("dimension_names") if isinstance(kept, Mapping) else None
        if layout["zarr_format"] == 2 or not isinstance(names, list) or len(names) != len(shape):
            names = None
        arrays[spec.name] = groups[parent].create_array(
            leaf,
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            compressors=layout["codec"],
            filters=None,
            fill_value=0,
            attributes=layout["attrs"].get(path, {}),
            # every chunk written, as zarr 2 does; zarr 3's default first compares each
            # chunk with the fill value, which made an export 5x slower (measured)
            config={"write_empty_chunks": True},
            dimension_names=names,
        )
    return arrays


def _write_meta(store: Any, groups: dict, layout: dict, recorded: Mapping) -> None:
    ends = np.cumsum(store.episodes.lengths.numpy()).astype(np.int64)
    # as create_empty_zarr makes it: uncompressed int64, one chunk (add_episode regrows it)
    arr = groups["meta"].create_array(
        "episode_ends",
        shape=ends.shape,
        chunks=(max(1, len(ends)),),
        dtype=np.int64,
        compressors=None,
        filters=None,
        fill_value=0,
        attributes=layout["attrs"].get("meta/episode_ends", {}),
    )
    if len(ends):
        arr[:] = ends
    for key, entry in sorted((recorded.get("meta") or {}).items()):
        value = _meta_value(entry)
        dtype = str if value.dtype == object else value.dtype
        parent, _, leaf = f"meta/{key}".rpartition("/")
        out = groups[parent].create_array(
            leaf,
            shape=value.shape,
            chunks=tuple(max(1, s) for s in value.shape),  # save_to_store: chunks=value.shape
            dtype=dtype,
            compressors=layout["codec"],
            fill_value=None if value.dtype == object else 0,
            attributes=from_json(entry.get("attrs") or {}),
        )
        if value.size:
            out[...] = value


def _copy_rows(store: Any, arrays: dict, spec_dtypes: dict, bar: Any) -> None:
    """The store's rows into the arrays, in slabs (the next read while this one is written)."""
    specs = list(spec_dtypes)
    writers = {s.name: _ChunkWriter(arrays[s.name], d) for s, d in spec_dtypes.items()}
    step = max(1, zarr_source.SLAB_BYTES // max(1, sum(s.row_nbytes for s in specs)))
    bounds = [(a, min(a + step, store.num_rows)) for a in range(0, store.num_rows, step)]

    def read(a: int, b: int) -> dict[str, np.ndarray]:
        out = {}
        for spec in specs:
            if spec.quantize is None:
                out[spec.name] = store.read_column(spec.name, a, b)
            else:
                out[spec.name] = store.read_slab(a, b, [spec.name])[spec.key].numpy()
        return out

    with ThreadPoolExecutor(1, thread_name_prefix="store-read") as pool:
        ahead = pool.submit(read, *bounds[0]) if bounds else None
        for k, (a, b) in enumerate(bounds):
            rows = ahead.result()
            ahead = pool.submit(read, *bounds[k + 1]) if k + 1 < len(bounds) else None
            for name, values in rows.items():
                writers[name].write(values)
            del rows
            if bar is not None:
                bar.update(b - a)
    for w in writers.values():
        w.finish()


def _write_zarr(store: Any, partial: Path, layout: dict, recorded: Mapping, bar: Any) -> None:
    zarr = require_zarr()
    from zarr.storage import LocalStore, ZipStore

    target = ZipStore(partial, mode="w") if layout["zip"] else LocalStore(partial)
    try:
        attrs = layout["attrs"]
        root = zarr.open_group(
            store=target,
            mode="w",
            zarr_format=layout["zarr_format"],
            attributes=_root_attrs(store, recorded, attrs, layout["keys"]),
        )
        groups = {"": root}
        for path in _group_paths(layout["keys"], recorded):
            parent, _, leaf = path.rpartition("/")
            groups[path] = groups[parent].create_group(leaf, attributes=attrs.get(path, {}))
        spec_dtypes = {
            s: _source_dtype(
                s,
                (recorded.get("arrays") or {}).get(f"data/{layout['keys'][s.name]}"),
                root.metadata.zarr_format,
            )
            for s in store.columns
        }
        arrays = _create_arrays(store, groups, spec_dtypes, layout)
        _write_meta(store, groups, layout, recorded)
        _copy_rows(store, arrays, spec_dtypes, bar)
    finally:
        target.close()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def export_zarr(
    store: Any,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    compressor: Any = "default",
    chunk_rows: int | None = None,
    zip: bool | None = None,
    zarr_format: int = 2,
    progress: bool = True,
) -> Path:
    """Write ``store`` as a diffusion-policy zarr (``ReplayBuffer`` layout); returns ``dest``.

    Args:
        store: a :class:`~torchstore.data.store.store.TrajectoryStore` or a store path.
        dest: the zarr folder to write, or a ``.zip`` (a ``.zarr.zip``, zarr's
            ``ZipStore``, stored uncompressed as zarr 2 writes it).
        overwrite: replace an existing zarr folder or zip at ``dest`` (never anything else).
        compressor: ``"default"`` (diffusion-policy's default, ``Blosc(lz4, clevel=5,
            NOSHUFFLE)``), ``"disk"`` (its ``Blosc(zstd, clevel=5, BITSHUFFLE)``), None (no
            compression) or a numcodecs codec (zarr v2) / zarr codec (v3).
        chunk_rows: rows per chunk (whole rows). Default: as diffusion-policy's
            ``save_to_store`` does, an imported array's own chunks, else
            ``get_optimal_chunks`` of the array (:func:`optimal_chunks`: about 2 MB).
        zip: write a zip; default: when ``dest`` ends in ``.zip``.
        zarr_format: 2 (default) or 3. diffusion-policy reads with zarr 2.x, which opens
            only v2 stores (a v3 ``zarr.json`` is no group to it), so v2 is what its
            ``ReplayBuffer.copy_from_path`` and every dataset in the wild use; 3 is there
            for readers on zarr 3.
        progress: draw a progress bar over rows.

    Columns become flat ``data/<key>`` arrays, as diffusion-policy's ``ReplayBuffer``
    loads them (:func:`flat_keys`: ``obs/<k>`` -> ``data/<k>``, ``next/obs/<k>`` ->
    ``data/next.obs.<k>``), ``meta/episode_ends`` the int64 cumulative episode ends. A
    store imported by :func:`~torchstore.formats.zarr_import.import_zarr` gets its
    source's keys, attributes, other ``meta/`` arrays and dtypes back; any other store
    records its env id, seed, metadata, column order and the column of each renamed key
    in the root attribute ``torchstore``, which
    :func:`~torchstore.formats.zarr_import.import_zarr` reads back.

    Raises:
        DatasetFormatError: two columns would get the same flat key.
        DestinationExistsError: ``dest`` exists and ``overwrite`` is false.
        DestinationError: ``dest`` exists and is not a zarr folder or zip (never replaced).
        ArgumentError: a ``zarr_format``, ``chunk_rows`` or ``compressor`` it cannot use.
    """
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.io.progress import progress_bar

    require_zarr()
    if zarr_format not in (2, 3):
        raise ArgumentError(f"zarr_format ({zarr_format!r}) must be 2 or 3")
    if chunk_rows is not None and (
        isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
    ):
        raise ArgumentError(f"chunk_rows ({chunk_rows!r}) must be a positive int or None")
    dest = Path(dest)
    as_zip = dest.name.endswith(".zip") if zip is None else bool(zip)
    own = not isinstance(store, TrajectoryStore)
    if own:
        store = TrajectoryStore(store)
    try:
        _check_export_dest(dest, as_zip, overwrite, store.path)
        meta = store.manifest.metadata
        recorded = meta.get("zarr") if isinstance(meta.get("zarr"), dict) else {}
        layout = {
            "zip": as_zip,
            "zarr_format": zarr_format,
            "codec": _compressor(compressor, zarr_format),
            "chunk_rows": chunk_rows,
            "attrs": from_json(recorded.get("attrs") or {}),
            "recorded": recorded,
            "keys": _data_keys(store, recorded),
        }
        partial = dest.with_name(f".{dest.name}.exporting")
        _remove(partial)
        bar = progress_bar(
            enabled=progress, total=store.num_rows, unit="row", desc="export", leave=False
        )
        try:
            _write_zarr(store, partial, layout, recorded, bar)
            _replace(partial, dest)
        except BaseException:
            _remove(partial)
            raise
        finally:
            if bar is not None:
                bar.close()
        return dest
    finally:
        if own:
            store.close()
