"""Where things live inside a store file, and how a file's datasets are built and opened.

```
/                     attribute torchstore_manifest (JSON bytes, static schema; a
                      fixed-length attribute: format 1 kept a heap string) and
                      torchstore_manifest_xxh3 (uint64: xxh3-64 of the manifest's UTF-8 bytes)
/commit               int64[4]: committed rows, episodes, episode-metadata bytes, and the
                      xxh3-64 of those three int64s (format 1 stores: int64[3], no hash)
/columns/<name>       [rows, *shape] per column ('/' in a name nests groups); for an
                      encoded column int64[rows, 4], each row's packet (see below)
/packets/<name>       uint8[bytes]: an encoded column's packets, back to back; each episode's
                      codec extradata right before its first packet
/episodes/index       int64[episodes, 3]: ep_len, ep_offset, meta_end (one table, so a
                      commit appends one row to one dataset)
/episodes/meta        uint8[bytes]: per-episode JSON, concatenated; episode i's JSON ends
                      at meta_end[i]
/checksums/...        the per-block hash table of every dataset above
```

HDF5 checksums its own metadata (superblock, object headers, B-trees) but neither raw data
nor the global heap that variable-length strings live in: everything a reader's values
depend on is covered by a hash of torchstore's instead (the manifest's beside it in the
checksummed root object header, the commit record's in the record itself, the rest per
block in ``/checksums``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import xxhash

from torchstore.data.file.manifest import UNCHECKED_FORMAT_VERSION, Manifest, parse_manifest_json
from torchstore.errors import IntegrityError, StoreFormatError, TorchstoreError, TransferError
from torchstore.io.hdf5.checksummed import ChecksummedDataset, create_checksummed
from torchstore.io.hdf5.files import MANIFEST_ATTR, open_for_read
from torchstore.io.remote.chunk_cache import ChunkCache
from torchstore.io.remote.ranged import is_url, open_url

__all__ = [
    "MANIFEST_ATTR",
    "MANIFEST_HASH_ATTR",
    "COMMIT",
    "build_store_file",
    "open_store_file",
    "store_location",
    "read_manifest",
    "read_manifest_fields",
    "StoreDatasets",
]


def store_location(path: str | os.PathLike) -> str | Path:
    """Where a store is: a URL as it is (``https://``, ``hf://``: read in place), else a path."""
    return path if isinstance(path, str) and is_url(path) else Path(path)


def open_store_file(
    where: str | os.PathLike, cache: ChunkCache | int | str | bool = True
) -> h5py.File:
    """A store file opened for reading: a local path, or a URL read in place by range through
    a cache (``cache``: True for the default :class:`ChunkCache`, a budget such as
    ``"50GiB"``, a :class:`ChunkCache`, or False for none)."""
    where = store_location(where)
    if isinstance(where, Path):
        return open_for_read(where)
    if not isinstance(cache, ChunkCache | bool):
        cache = ChunkCache(budget=cache)
    return open_for_read(open_url(where, cache=cache))


MANIFEST_HASH_ATTR = "torchstore_manifest_xxh3"
#: Reads of a commit record whose hash does not match, before it is called damaged: a
#: reader can catch the record mid-write by a live writer (the next read is whole).
_COMMIT_READ_ATTEMPTS = 50
COMMIT = "commit"
COLUMNS = "columns"
PACKETS = "packets"
#: an encoded column's row: its packet's byte offset in /packets/<name>, its length, flags
#: (bit 0: a keyframe) and, on an episode's first row, the bytes of extradata before it
PACKET_FIELDS = ("offset", "nbytes", "flags", "extradata")
PACKET_OFFSET, PACKET_NBYTES, PACKET_FLAGS, PACKET_EXTRA = range(len(PACKET_FIELDS))
KEYFRAME = 1
EPISODES = "episodes"
CHECKSUMS = "checksums"
EP_INDEX = "index"
EP_INDEX_FIELDS = ("ep_len", "ep_offset", "meta_end")
EP_META = "meta"
# Episode tables grow by one row a commit and every flush rewrites their last chunk:
# small chunks keep that rewrite cheap.
_EPISODE_TABLES = ((EP_INDEX, np.int64, (3,), 8192), (EP_META, np.uint8, (), 16384))


def build_store_file(f: h5py.File, manifest: Manifest, expected_rows: int | None = None) -> None:
    """Create every dataset and attribute of an empty store (SWMR allows no new objects later).

    ``expected_rows``, when the writer knows it, sizes the row tables' chunks for a small
    store (see :func:`~torchstore.io.hdf5.checksummed.create_checksummed`)."""
    # Fixed-length bytes, not a variable-length string: those live in the global heap,
    # which HDF5 neither checksums nor reads safely when damaged (a flipped heap byte can
    # hang the read); a fixed-length attribute lives in the checksummed object header.
    from torchstore.data.columns import numpy_dtype  # (torch: reading a store needs none)

    text = manifest.to_json().encode("utf-8")
    f.attrs[MANIFEST_ATTR] = np.bytes_(text)
    f.attrs[MANIFEST_HASH_ATTR] = np.uint64(xxhash.xxh3_64_intdigest(text))
    f.create_dataset(COMMIT, data=commit_record(0, 0, 0, checked=True))
    sums = f.create_group(CHECKSUMS)
    for spec in manifest.columns:
        if spec.codec is not None:
            create_checksummed(
                f.require_group(COLUMNS),
                spec.name,
                np.dtype(np.int64),
                (len(PACKET_FIELDS),),
                sums.require_group(COLUMNS),
                expected_rows=expected_rows,
            )
            create_checksummed(
                f.require_group(PACKETS),
                spec.name,
                np.dtype(np.uint8),
                (),
                sums.require_group(PACKETS),
            )
            f[COLUMNS][spec.name].attrs["fields"] = np.bytes_(",".join(PACKET_FIELDS).encode())
            continue
        create_checksummed(
            f.require_group(COLUMNS),
            spec.name,
            numpy_dtype(spec.storage_dtype),
            spec.shape,
            sums.require_group(COLUMNS),
            expected_rows=expected_rows,
        )
    for name, dtype, shape, chunk_bytes in _EPISODE_TABLES:
        create_checksummed(
            f.require_group(EPISODES),
            name,
            np.dtype(dtype),
            shape,
            sums.require_group(EPISODES),
            chunk_bytes=chunk_bytes,
        )
    f[EPISODES][EP_INDEX].attrs["fields"] = np.bytes_(",".join(EP_INDEX_FIELDS).encode())


def commit_record(rows: int, episodes: int, meta: int, *, checked: bool) -> np.ndarray:
    """The commit record's int64s: the three counts, then their xxh3-64 when ``checked``."""
    counts = np.array([rows, episodes, meta], dtype=np.int64)
    if not checked:
        return counts
    digest = np.array([xxhash.xxh3_64_intdigest(counts.tobytes())], dtype=np.uint64).view(np.int64)
    return np.concatenate([counts, digest])


#: Where format 1 stores keep the global heap of their manifest (it is allocated first).
_HEAP_WINDOW = 64 * 1024


def _check_global_heap(filename: str, source: str) -> None:
    """Walk the global heap collections near the start of a format 1 store.

    HDF5 does not checksum the global heap, and reading a string from a collection whose
    object sizes are damaged can loop forever; a collection whose objects do not tile it
    exactly is reported instead of handed to HDF5.
    """
    try:
        with open(filename, "rb") as fh:
            data = fh.read(_HEAP_WINDOW)
    except OSError:
        return
    pos = data.find(b"GCOL")
    while pos >= 0:
        start = pos
        size = int.from_bytes(data[start + 8 : start + 16], "little")
        end = start + size
        if data[start + 4] == 1 and end <= len(data):
            at = start + 16
            while at + 16 <= end:
                index = int.from_bytes(data[at : at + 2], "little")
                length = int.from_bytes(data[at + 8 : at + 16], "little")
                if index == 0:  # the free space: the rest of the collection
                    at = end if at + length == end else -1
                    break
                at += 16 + (length + 7) // 8 * 8
            if at < 0 or at > end:
                raise StoreFormatError(
                    f"{source}: the global heap holding the manifest is damaged (an object "
                    f"overruns its collection at byte {start})"
                )
        pos = data.find(b"GCOL", start + 4)


def read_manifest(f: h5py.File, source: str) -> Manifest:
    """The manifest of an open store file, verified against its hash.

    Everything odd about the attributes (a damaged root object header, a missing or
    malformed manifest, a hash mismatch) is a torchstore error naming ``source``.
    """
    raw, checked = _manifest_bytes(f, source)
    manifest = Manifest.from_json(raw, source=source)
    _check_unchecked(manifest.format_version, checked, source)
    return manifest


def read_manifest_fields(f: h5py.File, source: str) -> dict:
    """:func:`read_manifest`'s checks, the columns left as the manifest's dicts
    (:func:`~torchstore.data.file.manifest.parse_manifest_json`): no torch needed."""
    raw, checked = _manifest_bytes(f, source)
    fields = parse_manifest_json(raw, source=source)
    _check_unchecked(fields["format_version"], checked, source)
    return fields


def _check_unchecked(version: int, checked: bool, source: str) -> None:
    if not checked and version > UNCHECKED_FORMAT_VERSION:
        raise IntegrityError(
            f"{source}: store format {version} keeps a manifest checksum, but it is missing"
        )


def _manifest_bytes(f: h5py.File, source: str) -> tuple[bytes, bool]:
    """The manifest's bytes, checked against their hash where the store keeps one; and
    whether it does."""
    try:
        attrs = f.attrs
        if MANIFEST_ATTR not in attrs:
            raise StoreFormatError(
                f"{source} is an HDF5 file but not a torchstore store "
                f"(no '{MANIFEST_ATTR}' attribute)"
            )
        expected = attrs[MANIFEST_HASH_ATTR] if MANIFEST_HASH_ATTR in attrs else None
        if expected is None:  # format 1: the manifest is a string in the global heap
            _check_global_heap(f.filename, source)
        text = attrs[MANIFEST_ATTR]
    except StoreFormatError:
        raise
    except Exception as exc:  # h5py raises KeyError/OSError/RuntimeError for a damaged header
        raise StoreFormatError(
            f"{source}: the store's attributes cannot be read (damaged file?): {exc}"
        ) from exc
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if not isinstance(raw, bytes):
        raise StoreFormatError(
            f"{source}: the manifest attribute is not text ({type(text).__name__})"
        )
    if expected is not None:
        try:
            expected = int(np.asarray(expected).reshape(()))
        except (TypeError, ValueError) as exc:
            raise IntegrityError(
                f"{source}: the manifest's checksum attribute is malformed"
            ) from exc
        if xxhash.xxh3_64_intdigest(raw) != expected:
            raise IntegrityError(
                f"{source}: the manifest (column specs, quantisation, env id, metadata) fails its "
                "checksum; the file is damaged"
            )
    return raw, expected is not None


@dataclass
class StoreDatasets:
    """The open datasets of a store file."""

    commit: h5py.Dataset
    columns: dict[str, ChecksummedDataset]
    ep_index: ChecksummedDataset
    ep_meta: ChecksummedDataset
    #: the packet bytes of each encoded column (its ``columns`` entry holds the packet rows)
    packets: dict[str, ChecksummedDataset]

    @classmethod
    def open(cls, f: h5py.File, manifest: Manifest) -> StoreDatasets:
        return cls.open_columns(f, [(c.name, c.codec is not None) for c in manifest.columns])

    @classmethod
    def open_columns(cls, f: h5py.File, columns: list[tuple[str, bool]]) -> StoreDatasets:
        """The datasets of ``columns``, given as ``(name, encoded)`` pairs."""

        def table(group: str, name: str, label: str) -> ChecksummedDataset:
            return ChecksummedDataset(f[f"{group}/{name}"], f[f"{CHECKSUMS}/{group}/{name}"], label)

        return cls(
            commit=f[COMMIT],
            columns={name: table(COLUMNS, name, f"column '{name}'") for name, _ in columns},
            ep_index=table(EPISODES, EP_INDEX, "episode index"),
            ep_meta=table(EPISODES, EP_META, "episode metadata"),
            packets={
                name: table(PACKETS, name, f"column '{name}' packets")
                for name, encoded in columns
                if encoded
            },
        )

    @classmethod
    def open_checked(
        cls, f: h5py.File, columns: list[tuple[str, bool]], source: str, format_version: int
    ) -> StoreDatasets:
        """:meth:`open_columns` for a file being opened: a dataset the manifest names that is
        missing or unreadable, or a commit record without the checksum its format keeps, is a
        :class:`StoreFormatError` naming ``source``."""
        try:
            ds = cls.open_columns(f, columns)
        except TorchstoreError:
            raise
        except Exception as exc:  # KeyError, OSError, RuntimeError from a damaged header
            raise StoreFormatError(
                f"{source}: a dataset the manifest names is missing or unreadable ({exc})"
            ) from exc
        if format_version > 1 and not ds.checked:
            raise StoreFormatError(
                f"{source}: the commit record lacks the checksum its format version keeps"
            )
        return ds

    def committed_counts(self, source: str) -> tuple[int, int, int]:
        """The commit record's counts (rows, episodes, metadata bytes), every table refreshed
        to see them and every column checked to hold the committed rows (IntegrityError,
        naming ``source``, for a truncated or damaged file)."""
        try:
            # the commit record first: everything it counts was flushed before it was written
            rows, episodes, meta = self.read_commit()
        except TorchstoreError as exc:
            raise type(exc)(f"{source}: {exc}") from exc
        try:
            for table in self.all():
                table.refresh()
        except Exception as exc:  # h5py: OSError, ValueError, KeyError, RuntimeError
            raise IntegrityError(
                f"{source}: the store's tables cannot be refreshed ({exc})"
            ) from exc
        for name, table in self.columns.items():
            if table.data.shape[0] < rows:
                raise IntegrityError(
                    f"{source}: column '{name}' holds {table.data.shape[0]} rows but {rows} are "
                    "committed; the file is truncated or damaged"
                )
        return rows, episodes, meta

    def all(self) -> list[ChecksummedDataset]:
        return [*self.columns.values(), *self.packets.values(), self.ep_index, self.ep_meta]

    @property
    def checked(self) -> bool:
        """Whether the commit record carries its hash (format 2 and later)."""
        return self.commit.shape == (4,)

    def write_commit(self, rows: int, episodes: int, meta: int) -> None:
        record = commit_record(rows, episodes, meta, checked=self.checked)
        self.commit.id.write(h5py.h5s.ALL, h5py.h5s.ALL, record)

    def read_commit(self) -> tuple[int, int, int]:
        """The committed counts ``(rows, episodes, metadata bytes)``, verified.

        A hash mismatch is re-read a few times (a live writer may be writing the record)
        before it is reported; counts that could not fit in the file are reported at once.
        """
        checked = self.checked
        for attempt in range(_COMMIT_READ_ATTEMPTS):
            try:
                self.commit.refresh()
                record = np.asarray(self.commit[...], dtype=np.int64)
            except TransferError:
                raise  # a remote read failed: no damage to report
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                if attempt + 1 < _COMMIT_READ_ATTEMPTS:
                    time.sleep(0.001)
                    continue
                raise IntegrityError(f"the commit record cannot be read ({exc})") from exc
            if record.shape not in ((3,), (4,)):
                raise StoreFormatError(
                    f"the commit record has shape {list(record.shape)}, expected [4]"
                )
            rows, episodes, meta = (int(v) for v in record[:3])
            if not checked or np.array_equal(
                commit_record(rows, episodes, meta, checked=True), record
            ):
                break
            time.sleep(0.001)
        else:
            raise IntegrityError(
                f"the commit record ({rows}, {episodes}, {meta}) fails its checksum; "
                "the file is damaged"
            )
        self._check_counts(rows, episodes, meta)
        return rows, episodes, meta

    def _check_counts(self, rows: int, episodes: int, meta: int) -> None:
        """Counts that the file is too small to hold are damage (and must not be allocated)."""
        if min(rows, episodes, meta) < 0 or episodes > rows or (episodes == 0) != (rows == 0):
            raise IntegrityError(f"the commit record ({rows}, {episodes}, {meta}) is inconsistent")
        try:
            size = os.stat(self.commit.file.filename).st_size
        except OSError:
            return
        row_bytes = sum(t.row_nbytes for t in self.columns.values())
        if rows * row_bytes > size or episodes * 24 > size or meta > size:
            raise IntegrityError(
                f"the commit record ({rows} rows, {episodes} episodes, {meta} metadata bytes) "
                f"counts more than the {size}-byte file can hold; the file is damaged"
            )


def committed_packet_bytes(
    index: ChecksummedDataset, rows: int, latest: Callable[[], int] | None = None
) -> int:
    """Bytes of packets an encoded column's ``rows`` committed rows hold: where the last
    row's packet ends (its packet rows ``index``, read verified)."""
    if rows == 0:
        return 0
    last = index.read(rows - 1, rows, rows, latest)[0]
    if last[PACKET_OFFSET] < 0 or last[PACKET_NBYTES] < 0:
        raise IntegrityError(f"{index.label}: row {rows - 1} has a negative packet offset")
    return int(last[PACKET_OFFSET]) + int(last[PACKET_NBYTES])
