"""robomimic-layout HDF5 into a store: every key exact, demos in robomimic's order.

The layout (:mod:`torchstore.formats.robomimic_layout`) is the one robomimic, MimicGen,
LIBERO and Isaac Lab write. Each per-step dataset becomes a column: ``obs/<k>`` stays
``obs/<k>`` (``batch["obs", k]``), ``next_obs/<k>`` becomes ``next/obs/<k>``, ``actions``
``action``, ``rewards`` ``reward`` (float; integer rewards, as LIBERO writes them, are cast
exactly to float64), ``dones`` ``done`` (bool, when every value is 0 or 1; otherwise the
column keeps the name ``dones`` and its dtype), and every other key keeps its path
(``states``, ``robot_states``, Isaac Lab's ``states/articulation/...``). Images stay uint8.

Kept in the store's metadata, so :func:`~torchstore.formats.export_robomimic` writes the
file back byte for byte per dataset: the file's and ``data``'s attributes (``env_args``,
LIBERO's ``problem_info`` and ``bddl_file_name``, ...), the key map with each dataset's
dtype, storage options and attributes, and the filter keys (``mask/<name>``), which also
become named episode sets (``metadata["episode_sets"]["train"]``: episode numbers). Each
episode's metadata holds its demo name, its attributes (``model_file``, ``init_state``,
``seed``, ``success``, ...) and its per-demo arrays (Isaac Lab's ``initial_state/...``,
MimicGen's ``src_demo_inds``), each as its dtype, shape and bytes.

Rows are read in slabs of at most :data:`_SLAB_BYTES` (whole demos, or a longer demo in
pieces), and sizes a file declares are bounded first (:mod:`torchstore.formats.limits`),
so a 1 KB file declaring gigabytes of rows is refused before anything is allocated.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError, DatasetFormatError, TorchstoreError
from torchstore.formats.robomimic_layout import (
    DemoKey,
    RobomimicLayout,
    encode_attr,
    encode_attrs,
    read_layout,
    storage_options,
)
from torchstore.formats.robomimic_text import TextCoder

__all__ = ["import_robomimic", "open_robomimic"]

#: Bytes of rows read and committed at once (whole demos, one commit each; a demo larger
#: than this in pieces, committed at its last).
_SLAB_BYTES = 256 << 20
_EXACT_FLOAT = 2**53  # integers up to this magnitude are exact in float64


def open_robomimic(source: str | os.PathLike) -> h5py.File:
    """Open a robomimic-layout file for reading, or a DatasetFormatError naming it."""
    path = Path(source)
    if not path.is_file():
        raise DatasetFormatError(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DatasetFormatError(
            f"{path}: not a readable HDF5 file (truncated or damaged?): {exc}"
        ) from None


def _read(where: str, ds: h5d.DatasetID, out: np.ndarray, start: int | None = None) -> None:
    """Read ``ds`` (rows ``start:start + len(out)`` of it, given ``start``) into the
    C-contiguous ``out`` (low-level: no per-call wrapping)."""
    try:
        if not out.size:
            return
        if start is None:
            ds.read(h5s.ALL, h5s.ALL, out)
            return
        file_space = ds.get_space()
        file_space.select_hyperslab((start,) + (0,) * (out.ndim - 1), out.shape)
        ds.read(h5s.create_simple(out.shape), file_space, out)
    except (OSError, RuntimeError, ValueError) as exc:
        raise DatasetFormatError(
            f"{where}: cannot be read (truncated or damaged file?): {exc}"
        ) from None


#: unsigned dtypes a column cannot hold, held in the next signed one (exact) and written back
_WIDER = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64)}


def _held(dtype: np.dtype) -> np.dtype:
    """The column dtype for a file dtype: native byte order, uint16/uint32 widened."""
    native = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    return _WIDER.get(native, native)


def _settle_casts(f: h5py.File, layout: RobomimicLayout, label: str) -> None:
    """Each key's column dtype: ``dones`` bool and integer ``rewards`` float64 where that is
    exact (else they keep their names and dtypes), big-endian data in native order, uint16
    and uint32 widened; ``cast`` marks the keys the export converts back."""
    for key in layout.keys:
        dtype = np.dtype(key.dtype)
        if key.column == "done":
            ok = dtype.kind in "biuf" and all(
                np.isin(v, (0, 1)).all() for v in _every_slab(layout, label, key)
            )
            key.column = "done" if ok else key.path
        elif key.column == "reward" and dtype.kind in "biu":
            ok = all(
                np.abs(v.astype(np.float64)).max(initial=0) < _EXACT_FLOAT
                for v in _every_slab(layout, label, key)
            )
            key.column = "reward" if ok else key.path
        elif key.column == "reward" and dtype.kind != "f":
            key.column = key.path
        key.cast = _column_dtype(key) != dtype


def _every_slab(layout: RobomimicLayout, label: str, key: DemoKey) -> Iterator[np.ndarray]:
    """``key``'s rows of every demo, at most ``_SLAB_BYTES`` at a time."""
    row_bytes = max(1, np.dtype(key.dtype).itemsize * math.prod(key.shape))
    step = max(1, _SLAB_BYTES // row_bytes)
    for i, length in enumerate(layout.lengths):
        ds = layout.datasets[i][key.path]
        for a in range(0, length, step):
            out = np.empty((min(step, length - a), *key.shape), np.dtype(key.dtype))
            _read(f"{label} data/{layout.demos[i]} key '{key.path}'", ds, out, a)
            yield out


def _column_dtype(key: DemoKey) -> np.dtype:
    if key.encoding is not None:  # text: int64 codes into its string table
        return np.dtype(np.int64)
    dtype = np.dtype(key.dtype)
    if key.column == "done":
        return np.dtype(np.bool_)
    if key.column == "reward" and dtype.kind in "biu":
        return np.dtype(np.float64)
    return _held(dtype)


def _columns(layout: RobomimicLayout, label: str) -> list[ColumnSpec]:
    specs = []
    for key in layout.keys:
        try:
            specs.append(ColumnSpec(key.column, _column_dtype(key), tuple(key.shape)))
        except ColumnError as exc:
            raise DatasetFormatError(
                f"{label}: key '{key.path}' cannot be a column: {exc}"
            ) from None
    return specs


def _episode_meta(layout: RobomimicLayout, label: str, i: int) -> dict[str, Any]:
    demo, found = layout.demos[i], layout.datasets[i]
    attrs = encode_attrs(layout.groups[i].attrs, layout.left_out)
    meta: dict[str, Any] = {"demo": demo, "attrs": attrs}
    arrays = {}
    for path in layout.per_demo:
        if path in found:
            ds = h5py.Dataset(found[path])
            value = np.empty(ds.shape, ds.dtype)
            _read(f"{label} data/{demo} key '{path}'", found[path], value)
            arrays[path] = {
                "value": encode_attr(value),
                "options": storage_options(ds),
                "attrs": encode_attrs(ds.attrs),
            }
    if arrays:
        meta["arrays"] = arrays
    chunked = {k.path: _chunking(found[k.path]) for k in layout.keys if k.options.get("chunks")}
    if chunked:
        meta["chunks"] = chunked
    return meta


def _chunking(ds: h5d.DatasetID) -> dict[str, Any]:
    """A chunked dataset's chunk shape (and its maximum shape, where it can grow), which
    h5py's ``chunks=True`` would guess otherwise, and reading frame by frame depends on."""
    out: dict[str, Any] = {"shape": list(ds.get_create_plist().get_chunk())}
    most = ds.get_space().get_simple_extent_dims(True)
    if tuple(most) != tuple(ds.shape):
        out["maxshape"] = [None if d == h5s.UNLIMITED else int(d) for d in most]
    return out


def _batches(layout: RobomimicLayout, row_bytes: int) -> Iterator[tuple[list[int], range | None]]:
    """``(demos, None)``: consecutive whole demos of at most ``_SLAB_BYTES`` of rows; or
    ``([demo], rows)``: one piece of a demo larger than that, so memory holds one slab."""
    max_rows = max(1, _SLAB_BYTES // row_bytes)
    batch: list[int] = []
    rows = 0
    for i, length in enumerate(layout.lengths):
        if batch and (rows + length > max_rows or length > max_rows):
            yield batch, None
            batch, rows = [], 0
        if length > max_rows:
            for a in range(0, length, max_rows):
                yield [i], range(a, min(a + max_rows, length))
            continue
        batch.append(i)
        rows += length
    if batch:
        yield batch, None


def _scan_text(layout: RobomimicLayout, label: str) -> TextCoder:
    """The string tables of the text keys, every demo read once before any row is written."""
    coder = TextCoder()
    for key in layout.keys:
        if key.encoding is not None:
            for i, length in enumerate(layout.lengths):
                where = f"{label} data/{layout.demos[i]} key '{key.path}'"
                coder.scan(key.column, where, h5py.Dataset(layout.datasets[i][key.path]), length)
    return coder


def _read_text(
    label: str, layout: RobomimicLayout, key: DemoKey, batch: list[int], piece: range | None,
    coder: TextCoder,
) -> np.ndarray:  # fmt: skip
    parts = []
    for i in batch:
        where = f"{label} data/{layout.demos[i]} key '{key.path}'"
        rows = piece if piece is not None else range(layout.lengths[i])
        ds = h5py.Dataset(layout.datasets[i][key.path])
        parts.append(coder.codes(key.column, where, ds, rows.start, rows.stop))
    return np.concatenate(parts)


def _read_batch(
    f: h5py.File,
    label: str,
    layout: RobomimicLayout,
    batch: list[int],
    piece: range | None,
    coder: TextCoder,
) -> dict[str, np.ndarray]:
    """The rows of the whole demos in ``batch``, or the rows ``piece`` of its one demo."""
    total = len(piece) if piece is not None else sum(layout.lengths[i] for i in batch)
    rows: dict[str, np.ndarray] = {}
    for key in layout.keys:
        if key.encoding is not None:
            rows[key.column] = _read_text(label, layout, key, batch, piece, coder)
            continue
        out = np.empty((total, *key.shape), np.dtype(key.dtype))
        at = 0
        for i in batch:
            where = f"{label} data/{layout.demos[i]} key '{key.path}'"
            ds = layout.datasets[i][key.path]
            if piece is not None:
                _read(where, ds, out, piece.start)
                break
            n = layout.lengths[i]
            _read(where, ds, out[at : at + n])
            at += n
        rows[key.column] = out.astype(_column_dtype(key)) if key.cast else out
    return rows


def _write_rows(
    f: h5py.File,
    label: str,
    layout: RobomimicLayout,
    writer: Any,
    row_bytes: int,
    bar: Any,
    coder: TextCoder,
) -> None:
    """Every demo into ``writer``: whole demos committed together, a demo larger than a
    slab appended piece by piece and committed at its last piece."""
    for batch, piece in _batches(layout, row_bytes):
        rows = _read_batch(f, label, layout, batch, piece, coder)
        if piece is None:
            metas = [_episode_meta(layout, label, i) for i in batch]
            writer.add_episodes(rows, [layout.lengths[i] for i in batch], metas)
        else:
            writer.append(rows)
            if piece.stop == layout.lengths[batch[0]]:
                writer.end_episode(_episode_meta(layout, label, batch[0]))
        del rows
        if bar is not None:
            bar.update(len(piece) if piece is not None else sum(layout.lengths[i] for i in batch))


def _metadata(
    f: h5py.File, layout: RobomimicLayout, source: str, coder: TextCoder
) -> dict[str, Any]:
    index = {demo: i for i, demo in enumerate(layout.demos)}
    robomimic = {
        "source": source,
        "variant": layout.variant,
        "root_attrs": encode_attrs(f.attrs, layout.left_out),
        "data_attrs": encode_attrs(f["data"].attrs, layout.left_out),
        "keys": [k.to_json() for k in layout.keys],
        "per_demo": layout.per_demo,
        "masks": layout.masks,
    }
    if coder.tables:
        robomimic["string_tables"] = coder.tables
    return {
        "robomimic": robomimic,
        "episode_sets": {
            name: [index[d] for d in mask["demos"]] for name, mask in layout.masks.items()
        },
    }


def _env_id(f: h5py.File) -> str | None:
    try:
        env_args = json.loads(f["data"].attrs.get("env_args", "{}"))
    except (TypeError, ValueError):
        return None
    name = env_args.get("env_name") if isinstance(env_args, dict) else None
    return name if isinstance(name, str) and name else None


def import_robomimic(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Import a robomimic-layout HDF5 file (robomimic, MimicGen, LIBERO, Isaac Lab) into a
    new store at ``dest``.

    Args:
        source: the ``.hdf5`` file.
        dest: the store file to write; written beside and renamed into place when whole,
            so a failed or killed import leaves nothing at ``dest``.
        overwrite: replace an existing store at ``dest``.
        progress: draw a progress bar (on a terminal; a few lines elsewhere).

    Raises:
        DatasetFormatError: the file is unreadable or truncated, has no demos, a demo's
            keys have different lengths, demos have different keys, or a filter key names
            unknown demos; a key's row, or a step of all keys, over
            :data:`~torchstore.formats.limits.MAX_ROW_BYTES`; a dataset declaring far more
            chunks than it stores; a per-demo array or filter key over
            :data:`~torchstore.formats.limits.MAX_KEPT_BYTES` (all refused before a row is
            read); the message names the file, the demo and the key.

    Examples:
        >>> import_robomimic("lift/ph/image.hdf5", "lift.h5")  # doctest: +SKIP
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.io.destination import check_destination, written_beside
    from torchstore.io.progress import progress_bar

    label = str(source)
    dest = check_destination(dest, sources=[source], overwrite=overwrite, what="store")
    with open_robomimic(source) as f:
        try:
            layout = read_layout(f, label)
            _settle_casts(f, layout, label)
            coder = _scan_text(layout, label)
        except (KeyError, OSError, RuntimeError) as exc:
            raise DatasetFormatError(f"{label}: cannot be read (damaged?): {exc}") from None
        specs = _columns(layout, label)
        row_bytes = sum(s.storage_dtype.itemsize * int(np.prod(s.shape)) for s in specs)
        bar = progress_bar(
            enabled=progress, total=sum(layout.lengths), unit="step", desc=f"import {label}"
        )
        try:
            with (
                written_beside(dest, "importing") as partial,
                TrajectoryStoreWriter(
                    partial,
                    specs,
                    env_id=_env_id(f),
                    metadata=_metadata(f, layout, label, coder),
                    overwrite=True,
                    expected_rows=sum(layout.lengths),
                ) as writer,
            ):
                _write_rows(f, label, layout, writer, max(row_bytes, 1), bar, coder)
        except (KeyError, OSError, RuntimeError) as exc:
            if isinstance(exc, TorchstoreError):
                raise
            raise DatasetFormatError(f"{label}: cannot be read (damaged?): {exc}") from None
        finally:
            if bar is not None:
                bar.close()
    _warn_left_out(label, layout.left_out)
    return dest


def _warn_left_out(label: str, left_out: list[str]) -> None:
    if left_out:
        more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
        warnings.warn(
            f"{label}: a store does not keep {len(left_out)} item(s) of this file: "
            f"{'; '.join(left_out[:5])}{more}",
            stacklevel=3,
        )
