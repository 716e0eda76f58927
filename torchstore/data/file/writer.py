"""Streaming, crash-safe writes of episodes into a trajectory store file.

Commit protocol (measured: every clean SIGKILL point after creation left a file whose
committed episodes read back exactly): write the column slabs, the episode-table entries
and the hashes of every block touched; ``flush``; write the ``commit`` record; ``flush``.
Readers trust only ``commit``, so an episode becomes visible all at once or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import operator
import os
import resource
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from tensordict import TensorDictBase

from torchstore.data.columns import ColumnSpec, numpy_dtype
from torchstore.data.file.encoded import EncodedColumnWriter
from torchstore.data.file.layout import StoreDatasets, build_store_file, read_manifest
from torchstore.data.file.manifest import Manifest
from torchstore.errors import (
    ColumnError,
    DestinationExistsError,
    EpisodeError,
    FrameCodecError,
    StorageFullError,
    StoreFormatError,
    TorchstoreError,
    UnsupportedError,
)
from torchstore.io.destination import check_destination
from torchstore.io.durable import fsync_folder
from torchstore.io.frames.codec import EncodedFrames
from torchstore.io.hdf5.checksummed import STAGE_BYTES
from torchstore.io.hdf5.files import (
    abandon,
    create_for_append,
    create_in_place,
    fsync_file,
    open_for_append,
    require_hdf5,
)
from torchstore.io.hdf5.writer_lock import WriterLock
from torchstore.io.remote.ranged import is_url

__all__ = ["TrajectoryStoreWriter", "flatten_rows", "lossless_cast"]


#: Room a commit must find beyond the rows it writes and the new chunks it may start (see
#: ``TrajectoryStoreWriter._room_margin``): HDF5's metadata and the commit record.
_ROOM_METADATA = 64 * 1024


def _disk_full_errno(exc: BaseException) -> int | None:
    """ENOSPC or EFBIG when ``exc`` (h5py raises OSError or RuntimeError) says the disk is full."""
    while exc is not None:
        code = getattr(exc, "errno", None)
        if code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return code
        text = str(exc)
        for code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            if f"errno = {code}," in text or os.strerror(code) in text:
                return code
        exc = exc.__cause__ or exc.__context__
    return None


def flatten_rows(rows: Mapping[str, Any] | TensorDictBase) -> dict[str, Any]:
    """A TensorDict or (nested) mapping of columns as ``{"next/obs": value, ...}``."""
    if isinstance(rows, TensorDictBase):
        return {
            (k if isinstance(k, str) else "/".join(k)): v
            for k, v in rows.items(include_nested=True, leaves_only=True)
        }
    if not isinstance(rows, Mapping):
        raise ColumnError(
            f"rows must be a TensorDict or a mapping of columns, got {type(rows).__name__}"
        )
    flat: dict[str, Any] = {}
    for key, value in rows.items():
        name = key if isinstance(key, str) else "/".join(key)
        if isinstance(value, Mapping | TensorDictBase):
            for sub, leaf in flatten_rows(value).items():
                flat[f"{name}/{sub}"] = leaf
        else:
            flat[name] = value
    return flat


def lossless_cast(value: Any, dtype: torch.dtype) -> Any:
    """``value`` in ``dtype`` when the cast keeps every value exactly; else ``value`` as it was.

    The writer's rule: casts that cannot lose information (int32 to int64, float32 to
    float64) always apply, and so does a narrowing cast of the same kind (float64 to
    float32, int64 to int32 or uint8) whose values all survive it unchanged, such as
    ``np.array([1.0])`` or a Python float for a float32 reward. A narrowing cast that would
    change a value is left for the column check to refuse, naming the column.

    Examples:
        >>> lossless_cast(np.array([0.5, -2.0]), torch.float32).dtype
        dtype('float32')
        >>> lossless_cast(np.array([0.1]), torch.float32).dtype  # 0.1 is not a float32
        dtype('float64')
    """
    if isinstance(value, torch.Tensor):
        src = value.dtype
        if (
            src == dtype
            or value.is_meta
            or value.is_complex()
            or src == torch.bool
            or dtype == torch.bool
        ):
            return value
        if src.is_floating_point != dtype.is_floating_point:
            return value
        cast = value.to(dtype)
        back = cast.to(src)
        same = back == value
        if src.is_floating_point:
            same |= value.isnan() & back.isnan()
        return cast if bool(same.all()) else value
    if isinstance(value, Mapping | TensorDictBase):
        return value
    try:
        array = np.asarray(value)
        target = numpy_dtype(dtype)
    except (TypeError, ValueError, ColumnError):
        return value
    if array.dtype == target or array.dtype.kind not in "fiu" or target.kind not in "fiu":
        return value
    if (array.dtype.kind == "f") != (target.kind == "f"):
        return value
    if np.can_cast(array.dtype, target, casting="safe"):
        return array.astype(target)
    with np.errstate(all="ignore"):
        cast = array.astype(target)
        back = cast.astype(array.dtype)
    same = np.array_equal(back, array, equal_nan=array.dtype.kind == "f")
    return cast if same else value


def _row_count(value: Any) -> int:
    return len(value) if isinstance(value, EncodedFrames) else int(value.shape[0])


def _local(path: str | os.PathLike) -> Path:
    """A writer's path; a URL is refused (stores are written locally, then pushed)."""
    if is_url(path):
        raise UnsupportedError(
            f"cannot write to {path}: writers are local; push publishes a store "
            "(write it to a local path, then torchstore push)"
        )
    return Path(path)


class TrajectoryStoreWriter:
    """Append rows and commit them as episodes into one HDF5 store file.

    Args:
        path: the store file to create.
        columns: the declared columns (``ColumnSpec`` list, or a mapping name -> spec).
        env_id: the environment the data comes from.
        seed: the seed it was generated with.
        metadata: free-form JSON-serialisable metadata kept in the manifest.
        overwrite: replace an existing store instead of refusing. The new store is
            written aside and renamed over the old one by :meth:`close`; until then, and
            if the writer is killed or its ``with`` block raises, the old store stays.
            A file that is not a torchstore store, or a store another live process is
            writing, is never replaced.
        durable: ``fsync`` at every commit, so committed episodes survive power loss too
            (SIGKILL safety needs no fsync).
        created: the creation time the manifest records (ISO 8601); None records now.
        expected_rows: how many rows the store will hold, where that is known up front (an
            import). A table's chunks are then no bigger than its rows: HDF5 allocates a
            chunk whole, and at the default 128 KiB per column a small store carries up
            to a megabyte of empty chunks. The store may still grow past it.

    One writer per store: a writer holds an OS lock on the hidden ``.NAME.lock`` next to
    the file for its lifetime, and a second writer (new, ``resume`` or ``overwrite``) of the
    same file is refused with :class:`~torchstore.errors.StoreLockedError` naming the
    holder. The kernel drops the lock when its process dies, so a killed writer's store
    can be resumed at once.

    Examples:
        >>> with TrajectoryStoreWriter("demo.h5", [ColumnSpec("obs", "float32", (3,))]) as w:
        ...     w.add_episode({"obs": torch.zeros(10, 3)})
    """

    def __init__(
        self,
        path: str | os.PathLike,
        columns: Any,
        env_id: str | None = None,
        seed: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        overwrite: bool = False,
        durable: bool = False,
        created: str | None = None,
        expected_rows: int | None = None,
    ):
        path = _local(path)
        if expected_rows is not None:
            try:
                rows_hint = -1 if isinstance(expected_rows, bool) else operator.index(expected_rows)
            except TypeError:
                rows_hint = -1
            if rows_hint < 0:
                raise ValueError(
                    f"expected_rows must be a whole number >= 0, got {expected_rows!r}"
                )
            expected_rows = rows_hint
        manifest = Manifest.new(
            columns, env_id=env_id, seed=seed, metadata=metadata, created=created
        )
        if path.exists() and not overwrite and not path.is_dir():
            raise DestinationExistsError(
                f"{path} exists; pass overwrite=True to replace it, or use resume()"
            )
        check_destination(path, overwrite=overwrite, what="store")
        lock = WriterLock.acquire(path)
        try:
            aside = None
            partial = path.with_name(f".{path.name}.partial")
            # Leftovers of killed writers of this path (only the lock holder makes them).
            for stale in (partial, *path.parent.glob(f".{glob.escape(path.name)}.tmp-*")):
                stale.unlink(missing_ok=True)
            if path.exists():
                # Write the new store aside; the old one stays whole until close() renames.
                aside = partial
                create_in_place(aside, lambda f: build_store_file(f, manifest, expected_rows))
                file = open_for_append(aside, lock=lock)
            else:
                # Renamed into place already open for SWMR writing: a reader that opens
                # it at any moment neither sees a half-made file nor locks this writer out.
                file = create_for_append(
                    path, lambda f: build_store_file(f, manifest, expected_rows)
                )
        except BaseException as exc:
            if aside is not None:
                aside.unlink(missing_ok=True)
            lock.release()
            code = _disk_full_errno(exc) if isinstance(exc, OSError | RuntimeError) else None
            if code is not None:
                raise StorageFullError(
                    code,
                    f"{path}: no room to create the store ({os.strerror(code)}); "
                    "nothing was written",
                    str(path),
                ) from exc
            raise
        self._attach(path, manifest, durable, file=file, lock=lock, aside=aside)
        #: this writer made the file at ``path`` (neither resumed nor written aside): left
        #: by an error before its first commit, it is removed, not left as an empty store
        self._made_here = aside is None

    @classmethod
    def resume(cls, path: str | os.PathLike, *, durable: bool = False) -> TrajectoryStoreWriter:
        """Reopen an existing store to append more episodes with the same columns.

        Works on a store whose writer was killed: uncommitted rows are dropped and the
        committed ones are verified before appending resumes.
        """
        path = require_hdf5(_local(path))
        writer = cls.__new__(cls)
        lock = WriterLock.acquire(path)
        try:
            f = open_for_append(path, lock=lock)
        except BaseException as exc:
            lock.release()
            code = _disk_full_errno(exc) if isinstance(exc, OSError | RuntimeError) else None
            if code is not None and not isinstance(exc, TorchstoreError):
                raise StorageFullError(
                    code,
                    f"{path}: no room to resume the store ({os.strerror(code)}); its committed "
                    "episodes are intact. Free space and resume again",
                    str(path),
                ) from exc
            raise
        try:
            manifest = read_manifest(f, str(path))
        except BaseException:
            f.close()
            lock.release()
            raise
        writer._attach(path, manifest, durable, file=f, lock=lock)
        return writer

    @classmethod
    def recover(cls, path: str | os.PathLike) -> tuple[int, int]:
        """Finish the store of a writer that was killed; returns its (episodes, rows).

        Drops the rows the dead writer had not committed and marks the file closed, so it
        reads, copies and uploads as a finished store. Every committed episode is kept.

        Raises:
            StoreLockedError: the writer is alive (the message names it).
        """
        with cls.resume(path) as writer:
            return writer.num_episodes, writer.num_rows

    def _attach(
        self,
        path: Path,
        manifest: Manifest,
        durable: bool,
        *,
        file: h5py.File,
        lock: WriterLock,
        aside: Path | None = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.columns: tuple[ColumnSpec, ...] = manifest.columns
        self._specs = {c.name: c for c in self.columns}
        self._durable = durable
        self._file = file
        self._lock = lock
        self._aside = aside  # the file written when replacing an existing store
        self._written = aside or path
        self._closed = False
        try:
            self._ds = StoreDatasets.open(self._file, manifest)
            #: the encoded camera columns' writers (their frames go through a codec)
            self._encoded = {
                name: EncodedColumnWriter(self._specs[name], self._ds.columns[name], packets)
                for name, packets in self._ds.packets.items()
            }
            rows, episodes, meta = self._ds.read_commit()
            self._start_writing(rows, episodes, meta)
            self._file.flush()
        except BaseException as exc:
            code = _disk_full_errno(exc) if isinstance(exc, OSError | RuntimeError) else None
            try:
                if code is not None:
                    with contextlib.suppress(Exception):  # a close would write, and fail
                        abandon(self._file)
                else:
                    self._file.close()
            finally:
                if aside is not None:
                    aside.unlink(missing_ok=True)
                lock.release()
            if code is not None and not isinstance(exc, TorchstoreError):
                raise StorageFullError(
                    code,
                    f"{path}: no room to open the store for writing ({os.strerror(code)}); its "
                    "committed episodes are intact. Free space and resume",
                    str(path),
                ) from exc
            if isinstance(exc, (KeyError, OSError, RuntimeError)) and not isinstance(
                exc, TorchstoreError
            ):
                raise StoreFormatError(
                    f"{path} cannot be opened for appending (damaged?): {exc}"
                ) from exc
            raise
        self._rows, self._episodes, self._meta_bytes = rows, episodes, meta
        self._pending = 0

    def _start_writing(self, rows: int, episodes: int, meta: int) -> None:
        """Cut every table back to the committed counts (dropping what was not committed)."""
        for name, ds in self._ds.columns.items():
            if name in self._encoded:
                self._encoded[name].start_writing(rows)
            else:
                ds.start_writing(rows)
        self._ds.ep_index.start_writing(episodes)
        self._ds.ep_meta.start_writing(meta)

    def _drop_pending(self) -> None:
        """Forget the open episode (its rows in every column): the commit it needed failed."""
        with self._disk_errors():
            self._start_writing(self._rows, self._episodes, self._meta_bytes)
        self._pending = 0

    def _finish_encoded(self) -> None:
        """Stage the encoded columns' packets of the open episode for its commit."""
        try:
            for enc in self._encoded.values():
                enc.finish_episode(self._pending, self._episodes)
        except BaseException:
            self._drop_pending()
            raise

    # ----------------------------------------------------------------- state
    @property
    def num_rows(self) -> int:
        """Committed rows."""
        return self._rows

    @property
    def num_episodes(self) -> int:
        """Committed episodes."""
        return self._episodes

    @property
    def pending_rows(self) -> int:
        """Rows appended since the last commit (lost if the process dies now)."""
        return self._pending

    # ----------------------------------------------------------------- writing
    def append(self, rows: Mapping[str, Any] | TensorDictBase, *, raw: bool = False) -> int:
        """Append rows (every declared column, same leading row count) to the open episode.

        ``raw=True`` takes quantised columns as their uint8 codes. Values are converted
        to a column's dtype when no information is lost (:func:`lossless_cast`: a float64
        reward of 1.0 for a float32 column); a cast that would change a value is refused.
        Returns the rows added.
        """
        return self._append(rows, raw=raw)

    def _append(
        self,
        rows: Mapping[str, Any] | TensorDictBase,
        *,
        raw: bool = False,
        lengths: Sequence[int] | None = None,
    ) -> int:
        """``append``; with ``lengths`` (from ``add_episodes``) the rows are several whole
        episodes, which encoded columns encode one by one."""
        self._check_open()
        arrays = self._validate(rows, raw=raw)
        n = _row_count(next(iter(arrays.values())))
        columns = self._ds.columns

        def staged(name: str, value: Any) -> int:
            if name not in self._encoded:
                return columns[name].staged_bytes + value.nbytes
            # packets given, or frames still to encode (a tenth of their bytes or less)
            add = value.nbytes if isinstance(value, EncodedFrames) else value.nbytes // 10
            return self._ds.packets[name].staged_bytes + add

        if any(staged(k, a) >= STAGE_BYTES for k, a in arrays.items()):
            self._check_room(sum(staged(k, a) for k, a in arrays.items()))
        try:
            with self._disk_errors():
                for name, array in arrays.items():
                    if name not in self._encoded:
                        columns[name].append(array)
                    elif lengths is None:
                        self._encoded[name].append(array)
                    else:
                        self._encode_episodes(name, array, lengths)
        except FrameCodecError:  # the frames of the open episode cannot all be kept
            self._pending += n
            self._drop_pending()
            raise
        self._pending += n
        return n

    def _encode_episodes(self, name: str, frames: Any, lengths: Sequence[int]) -> None:
        if isinstance(frames, EncodedFrames):
            raise FrameCodecError(
                f"column '{name}': add_episodes() takes frames; give encoded packets one "
                "episode at a time (add_episode)"
            )
        enc, at = self._encoded[name], 0
        for i, length in enumerate(lengths):
            enc.append(frames[at : at + length])
            enc.finish_episode(length, self._episodes + i)
            at += length

    def end_episode(self, metadata: Mapping[str, Any] | None = None) -> int:
        """Commit the rows appended since the last commit as one episode; returns its number."""
        self._check_open()
        if self._pending == 0:
            raise EpisodeError("end_episode() called with no rows appended since the last episode")
        meta = b""
        if metadata:
            try:
                meta = json.dumps(dict(metadata), allow_nan=False, sort_keys=True).encode()
            except (TypeError, ValueError, RecursionError) as exc:
                raise EpisodeError(
                    f"episode metadata must be JSON-serialisable: {str(exc)[:200]}"
                ) from exc
        ds = self._ds
        rows = self._rows + self._pending
        meta_end = self._meta_bytes + len(meta)
        self._finish_encoded()
        self._check_room(sum(t.staged_bytes for t in ds.all()) + len(meta))
        with self._disk_errors():
            ds.ep_index.append(np.array([[self._pending, self._rows, meta_end]], dtype=np.int64))
            ds.ep_meta.append(np.frombuffer(meta, dtype=np.uint8))
            for table in ds.all():
                table.seal()
            self._file.flush()
            if self._durable:
                fsync_file(self._file)
            # the commit record (and its hash) last: readers trust only what it counts
            ds.write_commit(rows, self._episodes + 1, meta_end)
            self._file.flush()
            if self._durable:
                fsync_file(self._file)
        self._rows, self._meta_bytes = rows, meta_end
        self._episodes += 1
        self._pending = 0
        for enc in self._encoded.values():
            enc.committed()
        return self._episodes - 1

    def add_episode(
        self,
        rows: Mapping[str, Any] | TensorDictBase,
        metadata: Mapping[str, Any] | None = None,
        *,
        raw: bool = False,
    ) -> int:
        """``append`` then ``end_episode``; returns the episode number."""
        self._check_open()
        if self._pending:
            raise EpisodeError(
                f"add_episode() with {self._pending} rows already appended; "
                "call end_episode() first"
            )
        self.append(rows, raw=raw)
        return self.end_episode(metadata)

    def add_episodes(
        self,
        rows: Mapping[str, Any] | TensorDictBase,
        lengths: Sequence[int],
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        raw: bool = False,
    ) -> range:
        """Append the rows of several consecutive episodes and commit them all at once.

        ``lengths`` splits the rows into episodes (positive, summing to the row count);
        ``metadata`` holds one mapping (or None) per episode. One commit for all of them
        (a kill keeps all or none), which is what makes bulk imports fast: a commit per
        small episode costs more than its rows. Returns the new episode numbers.
        """
        self._check_open()
        if self._pending:
            raise EpisodeError(
                f"add_episodes() with {self._pending} rows already appended; "
                "call end_episode() first"
            )
        lengths = [int(n) for n in lengths]
        if not lengths or any(n <= 0 for n in lengths):
            raise EpisodeError(f"add_episodes needs positive episode lengths, got {lengths[:10]}")
        metadata = list(metadata) if metadata is not None else [None] * len(lengths)
        if len(metadata) != len(lengths):
            raise EpisodeError(
                f"add_episodes got {len(metadata)} metadata entries for {len(lengths)} episodes"
            )
        metas = []
        for m in metadata:
            try:
                metas.append(
                    json.dumps(dict(m), allow_nan=False, sort_keys=True).encode() if m else b""
                )
            except (TypeError, ValueError, RecursionError) as exc:
                raise EpisodeError(
                    f"episode metadata must be JSON-serialisable: {str(exc)[:200]}"
                ) from exc
        flat = flatten_rows(rows)
        n = len(next(iter(flat.values()))) if flat else 0  # append() checks every column
        if n != sum(lengths):
            raise EpisodeError(f"add_episodes got {n} rows, the lengths sum to {sum(lengths)}")
        self._append(rows, raw=raw, lengths=lengths)
        ds = self._ds
        starts = self._rows + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        meta_ends = self._meta_bytes + np.cumsum([len(m) for m in metas])
        blob = b"".join(metas)
        self._check_room(sum(t.staged_bytes for t in ds.all()) + len(blob))
        with self._disk_errors():
            ds.ep_index.append(np.stack([lengths, starts, meta_ends], axis=1).astype(np.int64))
            ds.ep_meta.append(np.frombuffer(blob, dtype=np.uint8))
            for table in ds.all():
                table.seal()
            self._file.flush()
            if self._durable:
                fsync_file(self._file)
            ds.write_commit(self._rows + n, self._episodes + len(lengths), int(meta_ends[-1]))
            self._file.flush()
            if self._durable:
                fsync_file(self._file)
        for enc in self._encoded.values():
            enc.committed()
        first = self._episodes
        self._rows, self._meta_bytes = self._rows + n, int(meta_ends[-1])
        self._episodes += len(lengths)
        self._pending = 0
        return range(first, self._episodes)

    def _validate(
        self, rows: Mapping[str, Any] | TensorDictBase, *, raw: bool
    ) -> dict[str, np.ndarray]:
        flat = flatten_rows(rows)
        missing = [n for n in self._specs if n not in flat]
        extra = [n for n in flat if n not in self._specs]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"unknown {extra}")
            raise ColumnError(
                f"rows do not match the store's columns: {', '.join(parts)}; "
                f"declared {list(self._specs)}"
            )
        n: int | None = None
        out: dict[str, np.ndarray] = {}
        for name, spec in self._specs.items():
            value = flat[name]
            if isinstance(value, EncodedFrames):
                if name not in self._encoded:
                    raise ColumnError(
                        f"column '{name}' keeps raw frames; encoded packets need a column "
                        "declared with that codec"
                    )
                if n is not None and len(value) != n:
                    raise ColumnError(
                        f"column '{name}' has {len(value)} frames, other columns have {n}"
                    )
                n = len(value)
                out[name] = value
                continue
            if raw and spec.quantize is not None:
                spec = ColumnSpec(spec.name, torch.uint8, spec.shape)
            elif spec.quantize is None:
                value = lossless_cast(value, spec.dtype)
            checked = spec.check_rows(value, rows=n)
            n = checked.shape[0]
            if isinstance(checked, torch.Tensor):
                checked = checked.detach().cpu().numpy()
            out[name] = checked
        if n == 0:
            raise ColumnError("append() got zero rows")
        return out

    def _check_room(self, nbytes: int) -> None:
        """Refuse a write the disk or the file-size limit has no room for, before HDF5 tries.

        HDF5 after a refused write is left in a state whose close fails (and can crash the
        process at exit), so the room is checked first; :meth:`_disk_errors` still catches
        what another process's writes take in between.
        """
        need = nbytes + self._room_margin()
        code = None
        try:
            st = os.statvfs(self.path.parent)
            if st.f_bavail * st.f_frsize < need:
                code = errno.ENOSPC
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            if (
                code is None
                and limit != resource.RLIM_INFINITY
                and self._written.stat().st_size + need > limit
            ):
                code = errno.EFBIG
        except OSError:
            return
        if code is not None:
            raise StorageFullError(
                code,
                f"{self.path}: no room for {nbytes} more bytes ({os.strerror(code)}); nothing was "
                f"written, the {self._episodes} committed episodes ({self._rows} rows) are "
                "intact and "
                f"the {self._pending} rows appended since are still pending. Free space and "
                "commit again, or close() (pending rows are then dropped)",
                str(self.path),
            )

    def _room_margin(self) -> int:
        """Room a commit needs beyond its rows' bytes: each table may start a chunk of rows
        and one of hashes (HDF5 allocates a chunk whole), and metadata. Scaled to this
        store's tables rather than fixed, so a file-size limit of a few MB takes commits."""
        margin = _ROOM_METADATA
        for table in self._ds.all():
            for ds in (table.data, table.sums):
                margin += int(np.prod(ds.chunks)) * ds.dtype.itemsize
        return margin

    @contextlib.contextmanager
    def _disk_errors(self):
        """Turn a full disk or file-size limit met while writing into a StorageFullError.

        The commit record is written only after everything it counts was written, so a
        write refused half-way leaves every committed episode intact; the writer stops
        (its in-memory state no longer matches the file) and the store can be resumed.
        """
        try:
            yield
        except (OSError, RuntimeError) as exc:
            code = _disk_full_errno(exc)
            if code is None:
                raise
            self._failed = (
                f"{self.path}: the disk refused a write ({os.strerror(code)}); the "
                f"{self._episodes} committed episodes ({self._rows} rows) are intact and the "
                f"episode in progress ({self._pending} rows) is lost. Free space, then "
                "TrajectoryStoreWriter.resume() the store to go on"
            )
            # The file now holds what a killed writer leaves (the commit record is written
            # only after everything it counts); HDF5 must not write to it again.
            with contextlib.suppress(Exception):
                abandon(self._file)
            raise StorageFullError(code, self._failed, str(self.path)) from exc

    # ----------------------------------------------------------------- lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeError(f"the writer of {self.path} is closed")
        if getattr(self, "_failed", None):
            raise StorageFullError(
                errno.ENOSPC, f"this writer stopped after a refused write: {self._failed}"
            )

    def close(self) -> None:
        """Close the file. Rows appended after the last commit are discarded.

        A writer that replaces an existing store (``overwrite=True``) wrote its store
        aside; closing puts it in place (renamed over the old one, after an ``fsync``).
        """
        self._finish(replace=True)

    def abort(self) -> None:
        """Close without putting a replacement in place: the store that was there stays.

        For a writer that replaces an existing store (``overwrite=True``) the new store is
        deleted, as is a new store with no episode committed yet; for any other writer this
        is :meth:`close` (committed episodes stay). Leaving a ``with`` block by an exception
        aborts.
        """
        self._finish(replace=False)

    def _finish(self, *, replace: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._close_file()
            if self._aside is not None:
                if replace:  # a writer stopped by a full disk still holds its commits
                    with self._disk_errors():
                        with open(self._aside, "rb") as done:
                            os.fsync(done.fileno())
                    os.replace(self._aside, self.path)
                    fsync_folder(self.path.parent, best_effort=True)
                else:
                    self._aside.unlink(missing_ok=True)
            elif not replace and getattr(self, "_made_here", False) and self._episodes == 0:
                self.path.unlink(missing_ok=True)  # nothing committed: no empty store left
        finally:
            self._lock.release()

    def _close_file(self) -> None:
        """Close the HDF5 file; a close the disk refuses leaves the committed episodes."""
        for enc in getattr(self, "_encoded", {}).values():
            enc.close()
        if getattr(self, "_failed", None):
            return  # given up after the refused write (see _disk_errors)
        try:
            self._file.close()
        except (OSError, RuntimeError) as exc:
            code = _disk_full_errno(exc)
            if code is None:
                raise
            with contextlib.suppress(Exception):
                abandon(self._file)
            raise StorageFullError(
                code,
                f"{self.path}: the disk refused the writes of close ({os.strerror(code)}); the "
                f"{self._episodes} committed episodes ({self._rows} rows) are intact. Free "
                "space, then TrajectoryStoreWriter.resume() the store (it recovers it)",
                str(self.path),
            ) from exc

    def __enter__(self) -> TrajectoryStoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._finish(replace=exc_type is None)

    def __repr__(self) -> str:
        return (
            f"TrajectoryStoreWriter({str(self.path)!r}, rows={self._rows}, "
            f"episodes={self._episodes})"
        )
