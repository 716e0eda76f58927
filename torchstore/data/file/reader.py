"""The lower level of a store file opened for reading: the snapshot, columns, contiguous reads.

:class:`StoreReader` is what the layers above a store file read through: the committed
counts (``num_rows``, ``num_episodes``, the episode index, the manifest), the column
specs (``select_columns``) and contiguous reads (``read_column``, ``read_slab``,
``iter_slabs``). :class:`~torchstore.data.store.store.TrajectoryStore` adds the sequence face
(indexing, iteration), the env it records and the steps into residency on top of it.
"""

from __future__ import annotations

import json
import operator
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchstore.data.columns import ColumnSpec
from torchstore.data.episodes import EpisodeIndex
from torchstore.data.file.encoded import (
    PacketRun,
    committed_packet_bytes,
    decode_packet_runs,
    decoder_cache,
    read_packet_runs,
)
from torchstore.data.file.layout import (
    StoreDatasets,
    open_store_file,
    read_manifest,
    store_location,
)
from torchstore.data.file.manifest import Manifest
from torchstore.errors import (
    ColumnError,
    FrameCodecError,
    IntegrityError,
    RowIndexError,
    StoreFormatError,
    TorchstoreError,
)
from torchstore.io.frames.codec import EncodedFrames, StreamInfo
from torchstore.io.frames.resize import FrameResize
from torchstore.io.hdf5.files import opened_bytes
from torchstore.io.remote.chunk_cache import ChunkCache
from torchstore.validation import positive_int

__all__ = ["StoreReader"]


def _named(exc: TorchstoreError, path: Path) -> TorchstoreError:
    """``exc`` again with the store's path in front (a FrameCodecError keeps its frame)."""
    if isinstance(exc, FrameCodecError):
        return FrameCodecError(f"{path}: {exc}", exc.frame)
    return type(exc)(f"{path}: {exc}")


class StoreReader:
    """A store file opened for reading: its committed snapshot and contiguous reads.

    What the reader shows is a snapshot of the committed episodes taken at open; call
    :meth:`refresh` to see episodes committed since (a live writer may keep appending).

    ``path`` may be a URL (``https://...`` on a server that answers byte ranges, or
    ``hf://datasets/NS/NAME[@REVISION]/PATH``): the store opens read-only in place, its
    bytes fetched by range through a bounded local cache (``cache``: a budget such as
    ``"50GiB"``, True for 10 % of the free disk, False for none); see
    :mod:`torchstore.io.remote.ranged`.
    """

    def __init__(self, path: str | os.PathLike, *, cache: ChunkCache | int | str | bool = True):
        self.path = store_location(path)
        self._cache = cache  # as given, so a pickled store reopens through the same cache
        self._decoder_local = threading.local()  # each thread's decoders (encoded columns)
        #: encoded column -> (committed rows, where their packets end), for the snapshot
        self._packet_ends: dict[str, tuple[int, int]] = {}
        self._file = open_store_file(self.path, cache)
        try:
            self._manifest = read_manifest(self._file, str(self.path))
            self._ds = StoreDatasets.open_checked(
                self._file,
                [(c.name, c.codec is not None) for c in self._manifest.columns],
                str(self.path),
                self._manifest.format_version,
            )
            self._rows = self._episodes_n = self._meta_n = -1
            self.refresh()
        except BaseException:
            self._file.close()
            raise

    # ----------------------------------------------------------------- snapshot
    def refresh(self) -> bool:
        """Catch up with episodes a live writer committed since; True if there were any."""
        rows, episodes, meta = self._ds.committed_counts(str(self.path))
        if (rows, episodes, meta) == (self._rows, self._episodes_n, self._meta_n):
            return False
        if min(rows, episodes, meta) < 0 or (episodes == 0) != (rows == 0):
            raise IntegrityError(
                f"{self.path}: the commit record ({rows}, {episodes}, {meta}) is inconsistent"
            )
        table = self._ds.ep_index.read(0, episodes, episodes, self._latest(1))
        lengths, offsets = (
            torch.from_numpy(table[:, 0].copy()),
            torch.from_numpy(table[:, 1].copy()),
        )
        try:
            self._episodes = EpisodeIndex(lengths, offsets, num_rows=rows)
        except StoreFormatError as exc:
            raise IntegrityError(f"{self.path}: the episode index is inconsistent: {exc}") from exc
        self._meta_end = table[:, 2].copy()
        if episodes and (self._meta_end[-1] != meta or bool((np.diff(self._meta_end) < 0).any())):
            raise IntegrityError(f"{self.path}: the episode metadata offsets are inconsistent")
        self._rows, self._episodes_n, self._meta_n = rows, episodes, meta
        return True

    def _latest(self, field: int):
        """Re-reads one count of the commit record (for a block a live writer just extended)."""
        return lambda: self._ds.read_commit()[field]

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        return self._manifest.columns

    @property
    def manifest(self) -> Manifest:
        """The manifest, with the committed counts of the current snapshot."""
        return self._manifest.with_counts(self._rows, self._episodes_n)

    @property
    def episodes(self) -> EpisodeIndex:
        return self._episodes

    @property
    def num_rows(self) -> int:
        return self._rows

    @property
    def num_episodes(self) -> int:
        return self._episodes_n

    def __len__(self) -> int:
        """Committed rows (of the current snapshot), as for a torchrl storage."""
        return self._rows

    def column(self, name: str) -> ColumnSpec:
        for spec in self.columns:
            if spec.name == name:
                return spec
        raise ColumnError(
            f"no column '{name}' in {self.path}; columns are {[c.name for c in self.columns]}"
        )

    def select_columns(self, columns: Iterable[str] | None) -> list[ColumnSpec]:
        """The specs of ``columns`` (names, or nested keys), all columns for ``None``."""
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        return [self.column(name if isinstance(name, str) else "/".join(name)) for name in columns]

    # ----------------------------------------------------------------- reading
    def read_column(
        self,
        name: str,
        start: int,
        stop: int,
        *,
        out: np.ndarray | None = None,
        resize: FrameResize | None = None,
        decode_device: str = "cpu",
    ) -> np.ndarray:
        """One column's rows ``[start, stop)`` in its storage dtype (verified).

        An encoded camera column is decoded (from the keyframe at or before ``start``),
        into ``out`` when given (``uint8 [stop - start, H, W, C]``; on the thread that
        calls, so the windowed residency's refill threads decode while training runs).
        ``resize``: a camera column's frames cropped and resized as they are decoded (or,
        kept raw, as they are read); then ``out`` has the resized shape. ``decode_device``:
        ``"cuda"`` decodes video on the GPU's decoder where there is one.
        """
        spec = self.column(name)
        if resize is not None:
            resize.check_source(spec.shape, f"column '{spec.name}' of {self.path}")
        if spec.codec is None:
            value = self._ds.columns[spec.name].read(start, stop, self._rows, self._latest(0))
            if resize is not None:
                return resize.apply(value, out)
            if out is not None:
                out[...] = value
                return out
            return value
        if not 0 <= start <= stop <= self._rows:
            raise RowIndexError(
                f"column '{spec.name}' rows {start}..{stop} are outside the committed range "
                f"0..{self._rows}"
            )
        runs = self.read_packet_runs(spec.name, start, stop)
        if out is None:
            shape = spec.shape if resize is None else resize.shape(spec.shape)
            out = np.empty((stop - start, *shape), dtype=np.uint8)
        return self.decode_packet_runs(
            spec.name, runs, out, resize=resize, decode_device=decode_device
        )

    def read_packet_runs(self, name: str, start: int, stop: int) -> list[PacketRun]:
        """The packets (verified) that decode rows ``[start, stop)`` of an encoded column;
        :meth:`decode_packet_runs` decodes them without touching the file (so a reader
        sharing this store's handle across threads holds its lock for this part only)."""
        spec = self.column(name)
        if spec.codec is None:
            raise ColumnError(f"column '{spec.name}' of {self.path} is not encoded")
        try:
            index, packets = self._packet_tables(spec)
            ends = self._packet_ends
            if ends.get(spec.name, (-1, 0))[0] != self._rows:  # once per snapshot
                # a live writer may be rewriting the block that holds the last row
                ends[spec.name] = (
                    self._rows,
                    committed_packet_bytes(index, self._rows, self._latest(0)),
                )
            return read_packet_runs(
                spec, index, packets, self._episodes, start, stop, self._rows, self._latest(0),
                packet_bytes=ends[spec.name][1],
            )  # fmt: skip
        except TorchstoreError as exc:
            raise _named(exc, self.path) from exc

    def decode_packet_runs(
        self,
        name: str,
        runs: list[PacketRun],
        out: np.ndarray,
        *,
        threads: int = 1,
        resize: FrameResize | None = None,
        decode_device: str = "cpu",
    ) -> np.ndarray:
        """Decode what :meth:`read_packet_runs` read into ``out``: on this thread, or cut at
        keyframes over ``threads`` threads; ``resize`` and ``decode_device`` as in
        :meth:`read_column`."""
        try:
            return decode_packet_runs(
                self.column(name), runs, out, self._decoders(), threads=threads, resize=resize,
                decode_device=decode_device,
            )  # fmt: skip
        except TorchstoreError as exc:
            raise _named(exc, self.path) from exc

    def encoded_episode(self, name: str, index: int) -> EncodedFrames:
        """One episode of an encoded column as its packets, byte for byte as stored (an
        export writes them into a video file without re-encoding)."""
        spec = self.column(name)
        if spec.codec is None:
            raise ColumnError(f"column '{spec.name}' of {self.path} is not encoded")
        start, stop = self._episodes.range(index)
        index %= self._episodes_n
        (run,) = self.read_packet_runs(spec.name, start, stop)  # one run: from frame 0
        height, width, channels = spec.shape
        info = StreamInfo(
            width, height, channels, pix_fmt=spec.codec.pix_fmt if spec.codec.is_video else None,
            extradata=run.extradata,
        )  # fmt: skip
        return EncodedFrames(spec.codec, info, [bytes(p) for p in run.packets], run.keys)

    def _packet_tables(self, spec: ColumnSpec) -> tuple:
        return self._ds.columns[spec.name], self._ds.packets[spec.name]

    def _decoders(self) -> dict:
        """This thread's decoders of this store's encoded columns (kept between reads)."""
        local = self._decoder_local
        if not hasattr(local, "cache"):
            local.cache = decoder_cache()
        return local.cache

    def read_slab(
        self,
        start: int,
        stop: int,
        columns: Iterable[str] | None = None,
        *,
        raw: bool = False,
    ) -> TensorDict:
        """Contiguous rows ``[start, stop)`` as a TensorDict.

        Quantised columns are dequantised unless ``raw`` (then they are their uint8 codes).
        """
        try:
            start, stop = operator.index(start), operator.index(stop)
        except TypeError as exc:
            raise RowIndexError(f"slab bounds must be ints, got {start!r} and {stop!r}") from exc
        if not 0 <= start <= stop <= self._rows:
            raise RowIndexError(
                f"slab [{start}, {stop}) is outside the rows [0, {self._rows}) of {self.path} "
                "(bounds are absolute and ascending; negative bounds are not accepted)"
            )
        leaves: dict[Any, torch.Tensor] = {}
        for spec in self.select_columns(columns):
            value = torch.from_numpy(self.read_column(spec.name, start, stop))
            if spec.quantize is not None and not raw:
                value = spec.quantize.decode(value, spec.dtype)
            leaves[spec.key] = value
        return TensorDict(leaves, batch_size=[stop - start])

    def iter_slabs(
        self, rows: int = 65536, columns: Iterable[str] | None = None, *, raw: bool = False
    ) -> Iterator[TensorDict]:
        """The whole store as consecutive slabs of ``rows`` rows (the last may be shorter)."""
        rows = positive_int("rows", rows, error=RowIndexError)
        names = [s.name for s in self.select_columns(columns)]
        for start in range(0, self._rows, rows):
            yield self.read_slab(start, min(start + rows, self._rows), names, raw=raw)

    def episode(
        self, index: int, columns: Iterable[str] | None = None, *, raw: bool = False
    ) -> TensorDict:
        """All rows of one episode."""
        start, stop = self._episodes.range(index)
        return self.read_slab(start, stop, columns, raw=raw)

    def episode_metadata(self, index: int) -> dict[str, Any]:
        """The metadata given when the episode was committed (``{}`` if none)."""
        self._episodes.range(index)  # bounds check
        index %= self._episodes_n
        end = int(self._meta_end[index])
        begin = int(self._meta_end[index - 1]) if index else 0
        if begin == end:
            return {}
        raw = self._ds.ep_meta.read(begin, end, self._meta_n, self._latest(2))
        try:
            return json.loads(raw.tobytes())
        except (ValueError, RecursionError) as exc:
            raise IntegrityError(
                f"{self.path}: episode {index} metadata is not valid JSON"
            ) from exc

    # ----------------------------------------------------------------- lifetime
    def size_on_disk(self) -> int:
        """The store file's bytes (a URL's: the remote object's)."""
        return opened_bytes(self._file)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
