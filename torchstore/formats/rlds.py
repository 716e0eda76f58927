"""``import_rlds``: an RLDS / Open X-Embodiment dataset (TFDS folder) into a trajectory store.

No TensorFlow at run time: the TFRecord shards are streamed by
:mod:`torchstore.io.records.tfrecord` (both CRC32C checks on every record) and each episode's
``tf.train.Example`` is decoded by hand. ``uint8`` image features keep their JPEG / PNG
bytes as they are, in encoded columns (:mod:`torchstore.formats.rlds_images`: every
frame's header and body checked first); with ``images="decode"``, and for depth images,
frames are decoded to raw ``uint8`` columns, JPEG by libjpeg-turbo (simplejpeg) with
TensorFlow's settings, PNG by Pillow. Either way reads give tfds's pixels bit for bit.

One store episode per RLDS episode, in shard order, one row per step. Each leaf of the
``steps`` feature becomes a column named by its path below ``steps`` (``observation/image``,
``observation/state``, ``action``, ``reward``, ``discount``, ``is_first``, ``is_last``,
``is_terminal``, ...), in the dtype and shape tfds decodes it to: images as ``uint8`` HWC,
``bool`` flags, float64 at the float32 precision TFDS stores it with. ``uint16`` and
``uint32`` tensors, which a store cannot hold, are widened to ``int32``/``int64`` (listed
in ``metadata["rlds"]["widened"]``). Text step features (``language_instruction``) become
int64 codes into ``metadata["rlds"]["string_tables"][name]``, the exact strings in order
of first appearance (one pass over the text features before the import). Episode-level
features (``episode_metadata/file_path``, ...) go into each episode's metadata, nested as
in the dataset, beside ``rlds`` (the shard and record the episode came from).
``dataset_info.json`` and ``features.json`` are kept in ``metadata["rlds"]``; both are
checked value by value first (:mod:`torchstore.formats.rlds_metadata`).

Memory stays flat: one record is read at a time, shard after shard, and episodes decode
straight into one of two slabs of about :data:`_SLAB_BYTES` (raw rows and kept frame
bytes). Frames are checked or decoded on a pool of threads (libjpeg-turbo and Pillow
release the GIL) while the main thread parses the next records; a full slab goes to a
writing thread, which waits for its frames and commits it, in one ``add_episodes`` call
(one ``add_episode`` per episode when frames are kept encoded), while the next slab
fills. An episode longer than a slab is written in slab-sized pieces (``append`` ...
``end_episode``), or, when frames are kept encoded (a column's packets go in whole
episodes), at once in a slab grown to it. The store is written under a hidden name beside
``dest`` and renamed into place only when complete, so a failed import leaves nothing at
``dest``.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import (
    ArgumentError,
    ColumnError,
    DatasetFormatError,
    EpisodeError,
    FrameCodecError,
)
from torchstore.formats.rlds_features import (
    Leaf,
    Schema,
    decode_frame,
    decode_text,
    episode_value,
    read_schema,
    step_count,
    tensor_rows,
)
from torchstore.formats.rlds_images import IMAGE_MODES, KeptFrames, _KeepRaw, kept_codec
from torchstore.formats.rlds_metadata import locate, read_json, shown, split_files
from torchstore.io.frames.codec import EncodedFrames
from torchstore.io.records.tfrecord import iter_records, parse_example

__all__ = ["import_rlds", "locate_rlds", "RldsSource"]

#: Bytes of decoded rows per commit (two slabs are held: one being written, one filling).
_SLAB_BYTES = 32 * 2**20
#: Threads decoding images (libjpeg-turbo and Pillow release the GIL while they decode).
_DECODE_THREADS = min(8, os.cpu_count() or 1)


def locate_rlds(source: str | os.PathLike) -> Path:
    """The version folder of a TFDS dataset: ``source`` itself, or the one version folder in it.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        DatasetFormatError: no version folder (no ``dataset_info.json``/``features.json``),
            or several.
    """
    return locate(source)


@dataclass
class RldsSource:
    """A TFDS version folder: its metadata, schema and the shards of one split."""

    root: Path
    split: str
    info: dict
    features: dict
    schema: Schema
    shards: list[Path]
    shard_lengths: list[int] | None

    @classmethod
    def open(cls, source: str | os.PathLike, split: str = "train") -> RldsSource:
        root = locate_rlds(source)
        info = read_json(root / "dataset_info.json")
        info.dict_at(info.data, ())
        features = read_json(root / "features.json")
        schema = read_schema(features)
        files = split_files(root, info, split)
        return cls(root, split, info.data, features.data, schema, files.shards, files.lengths)

    @property
    def episodes(self) -> int | None:
        """Episodes in the split, as dataset_info.json counts them."""
        return None if self.shard_lengths is None else sum(self.shard_lengths)


def _records(src: RldsSource, keys: set[str] | None) -> Iterator[tuple[Path, int, str, dict]]:
    """``(shard, record in shard, where, features)`` of every episode, shard by shard;
    ``where`` names the shard, the episode and the record for messages."""
    index = 0
    for s, shard in enumerate(src.shards):
        count = 0
        for count, record in enumerate(iter_records(shard), 1):
            where = f"{shard}: episode {index} (record {count - 1} of the shard)"
            try:
                features = parse_example(record, keys=keys)
            except DatasetFormatError as exc:
                raise DatasetFormatError(f"{where}: {exc}") from None
            yield shard, count - 1, where, features
            index += 1
        if src.shard_lengths is not None and count != src.shard_lengths[s]:
            raise DatasetFormatError(
                f"{shard}: {count} episodes, but dataset_info.json lists "
                f"{src.shard_lengths[s]} (a shard cut short or replaced)"
            )


def _scan_strings(src: RldsSource, leaves: list[Leaf]) -> dict[str, list[str]]:
    """Every distinct value of each text step feature, in order of first appearance."""
    seen: dict[str, dict[str, None]] = {leaf.name: {} for leaf in leaves}
    for _, _, where, features in _records(src, {leaf.key for leaf in leaves}):
        for leaf in leaves:
            values = features.get(leaf.key, [])
            what = f"{where}: '{leaf.key}'"
            if isinstance(values, np.ndarray):
                if values.size:
                    raise DatasetFormatError(f"{what}: holds numbers, expected text")
                continue
            table = seen[leaf.name]
            for blob in dict.fromkeys(values):
                text = decode_text(blob, what)
                if text not in table:
                    table[text] = None
    return {name: list(table) for name, table in seen.items()}


@dataclass
class _Episode:
    """One parsed episode: where it came from, its steps, features and metadata."""

    where: str
    steps: int
    features: dict
    meta: dict


class _Episodes:
    """Decodes episodes into column rows, checking every step feature against the schema;
    frames go to the decode pool (the futures are returned, to be waited on before the
    rows are written). ``keep``: whether uint8 image features may be kept encoded;
    ``raw``: the features decoded to raw columns all the same, with why."""

    def __init__(
        self,
        schema: Schema,
        tables: dict[str, list[str]],
        pool: ThreadPoolExecutor,
        keep: bool = True,
        raw: dict[str, str] | None = None,
    ):
        self.schema = schema
        self.codes = {n: {s: i for i, s in enumerate(t)} for n, t in tables.items()}
        self.pool = pool
        self.keep = keep
        self.decoded: dict[str, str] = dict(raw or {})  # image features kept raw, and why
        self.shapes: dict[str, tuple[int, ...]] = {}  # the image shapes the columns hold
        self.kept: dict[str, KeptFrames] = {}  # the image features kept encoded

    def parse(self, where: str, features: dict) -> _Episode:
        """Check an episode's step counts and read its episode-level features."""
        return _Episode(
            where, self.length(where, features), features, self.metadata(where, features)
        )

    def length(self, where: str, features: dict) -> int:
        """The episode's step count; every step feature must hold that many."""
        steps = first = None
        for leaf in self.schema.steps:
            what = f"{where}: '{leaf.key}'"
            n = step_count(leaf, features.get(leaf.key, []), what)
            if n < 0:
                continue
            if steps is None:
                steps, first = n, leaf.key
            elif n != steps:
                raise DatasetFormatError(
                    f"{what}: {n} steps, but '{first}' has {steps} (a step feature of the "
                    "wrong length)"
                )
        return steps or 0

    def metadata(self, where: str, features: dict) -> dict[str, Any]:
        """The episode-level features, nested as in the dataset."""
        meta: dict[str, Any] = {}
        for leaf in self.schema.episode:
            value = episode_value(leaf, features.get(leaf.key), f"{where}: '{leaf.key}'")
            node = meta
            *parents, last = leaf.name.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        return meta

    def learn_columns(self, episode: _Episode) -> None:
        """Fix each image column's shape (the declared one, else the first frame's) and
        whether it is kept encoded (the feature's format, else the first frame's)."""
        for leaf in self.schema.steps:
            if leaf.kind != "image" or leaf.name in self.shapes:
                continue
            first = episode.features.get(leaf.key, [])[0]
            if None not in leaf.shape:
                self.shapes[leaf.name] = leaf.shape
            else:
                what = f"{episode.where}: '{leaf.key}' step 0"
                self.shapes[leaf.name] = decode_frame(leaf, first, None, what).shape
            if not self.keep or leaf.name in self.decoded:
                continue
            codec, why = kept_codec(leaf, first)
            if codec is None:
                self.decoded[leaf.name] = why
            else:
                self.kept[leaf.name] = KeptFrames(leaf, codec, self.shapes[leaf.name])

    def decode(
        self,
        episode: _Episode,
        start: int,
        out: dict[str, np.ndarray],
        packets: dict[str, EncodedFrames],
    ) -> list[Future]:
        """Decode the steps ``start:start + len(rows)`` of ``episode`` into ``out`` (views
        of a slab), and the frames of the kept image columns into ``packets`` (whole
        episodes only: ``start`` is 0); returns the futures of its frames."""
        futures: list[Future] = []
        for leaf in self.schema.steps:
            what = f"{episode.where}: '{leaf.key}'"
            value = episode.features.get(leaf.key, [])
            if leaf.name in self.kept:
                futures += self._kept(self.kept[leaf.name], value, packets, what)
                continue
            target = out[leaf.name]
            if leaf.kind == "image":
                futures += self._images(leaf, value, start, target, what)
            elif leaf.kind == "text":
                codes = self.codes[leaf.name]
                try:
                    target[...] = [
                        codes[decode_text(b, what)] for b in value[start : start + len(target)]
                    ]
                except KeyError as exc:
                    raise DatasetFormatError(
                        f"{what}: the text {shown(exc.args[0])} was not there when the strings "
                        "were scanned"
                    ) from None
            else:
                tensor_rows(leaf, value, start, target, what)
        return futures

    def _images(
        self, leaf: Leaf, blobs: list[bytes], start: int, out: np.ndarray, what: str
    ) -> list[Future]:
        """Queue the decoding of frames ``start:start + len(out)`` into ``out``."""

        def chunk(first: int, stop: int) -> None:
            for t in range(first, stop):
                decode_frame(leaf, blobs[start + t], out[t], f"{what} step {start + t}")

        return self._spread(len(out), chunk)

    def _kept(self, kept: KeptFrames, blobs: list[bytes], packets: dict, what: str) -> list[Future]:
        """Check an episode's frames of a kept column (headers here, bodies on the pool)
        and put its packets into ``packets`` as they are checked."""
        fits = [kept.fits(blob) for blob in blobs]
        if kept.codec.kind == "jpeg" and not all(fits):  # decode it here: refused, or _KeepRaw
            t = fits.index(False)
            kept.recoded(blobs[t], f"{what} step {t}")
        frames = list(blobs)  # filled in on the pool (a frame re-encoded replaces its bytes)
        keyframes = np.ones(len(frames), bool)  # every JPEG / PNG frame decodes on its own
        packets[kept.leaf.name] = EncodedFrames(kept.codec, kept.info, frames, keyframes)

        def chunk(first: int, stop: int) -> None:
            for t in range(first, stop):
                step = f"{what} step {t}"
                frames[t] = kept.packet(blobs[t], step) if fits[t] else kept.recoded(blobs[t], step)

        return self._spread(len(blobs), chunk)

    def _spread(self, n: int, chunk) -> list[Future]:
        """``chunk(a, b)`` over ``range(n)`` in one task per decode thread."""
        tasks = min(n, _DECODE_THREADS)
        bounds = [n * i // tasks for i in range(tasks + 1)]
        return [self.pool.submit(chunk, a, b) for a, b in zip(bounds, bounds[1:])]


def _columns(schema: Schema, episodes: _Episodes, where: str) -> list:
    from torchstore.data import ColumnSpec

    specs = []
    for leaf in schema.steps:
        shape = episodes.shapes[leaf.name] if leaf.kind == "image" else leaf.shape
        kept = episodes.kept.get(leaf.name)
        try:
            codec = None if kept is None else kept.codec
            specs.append(ColumnSpec(leaf.name, leaf.store_dtype, shape, codec=codec))
        except ColumnError as exc:
            raise DatasetFormatError(
                f"{where}: feature '{leaf.key}' cannot be a column ({exc})"
            ) from None
    return specs


def _store_metadata(src: RldsSource, tables: dict[str, list[str]], episodes: _Episodes) -> dict:
    widened = {
        leaf.name: str(leaf.dtype)
        for leaf in src.schema.steps
        if leaf.kind != "text" and leaf.store_dtype != leaf.dtype
    }
    meta = {
        "source": str(src.root),
        "split": src.split,
        "dataset_info": src.info,
        "features": src.features,
        "string_tables": tables,
    }
    if widened:
        meta["widened"] = widened
    if episodes.keep and episodes.decoded:
        meta["decoded_images"] = dict(episodes.decoded)
    return {"rlds": meta}


@dataclass
class _Slab:
    """One set of row buffers and what fills it: whole episodes (``lengths``, ``meta``,
    and the kept columns' packets of each in ``packets``) or one piece of a long episode
    (``piece``: ``"part"``, or ``"last"`` with its metadata in ``meta[0]``)."""

    buffers: dict[str, np.ndarray]
    capacity: int
    used: int = 0
    lengths: list[int] = field(default_factory=list)
    meta: list[dict] = field(default_factory=list)
    packets: list[dict[str, EncodedFrames]] = field(default_factory=list)
    packet_bytes: int = 0  # the kept frames' bytes the slab holds
    piece: str | None = None
    frames: list[Future] = field(default_factory=list)  # decodes into the buffers
    written: Future | None = None  # the write of the buffers' last contents

    def views(self, steps: int) -> dict[str, np.ndarray]:
        return {n: b[self.used : self.used + steps] for n, b in self.buffers.items()}

    def resize(self, rows: int) -> None:
        """New buffers of ``rows`` rows (the slab must be empty and its write done)."""
        self.buffers = {n: np.empty((rows, *b.shape[1:]), b.dtype) for n, b in self.buffers.items()}
        self.capacity = rows

    def reset(self) -> None:
        self.used, self.lengths, self.meta, self.piece, self.frames = 0, [], [], None, []
        self.packets, self.packet_bytes = [], 0


class _Slabs:
    """Two slabs taking turns: episodes decode into one while the other is written (in
    ``io``, a one-thread pool, so writes happen in order). The buffers and the writer are
    made from the first episode, once the image shapes are known."""

    def __init__(self, path: Path, src: RldsSource, tables: dict, episodes: _Episodes, bar: Any):
        self.path, self.src, self.tables, self.episodes, self.bar = path, src, tables, episodes, bar
        self.writer = None
        self.io = ThreadPoolExecutor(1, thread_name_prefix="rlds-write")
        self.slabs: list[_Slab] = []
        self.rows = 0  # rows added, pieces of a long episode included
        self.capacity = 0  # rows of a slab (one grown for a long episode shrinks back)

    @property
    def current(self) -> _Slab:
        return self.slabs[0]

    def add(self, episode: _Episode) -> None:
        """Decode an episode into the slabs (in pieces when longer than a slab)."""
        if not self.slabs:
            self._start(episode)
        kept = self.episodes.kept
        nbytes = sum(len(b) for n in kept for b in episode.features.get(kept[n].leaf.key, []))
        slab = self.current
        full = slab.packet_bytes + nbytes > _SLAB_BYTES and slab.used
        if slab.used + episode.steps > slab.capacity or full:
            self.flush()
            slab = self.current
        if episode.steps > slab.capacity and kept:  # packets go whole: grow the slab to it
            slab.resize(episode.steps)
        if episode.steps <= slab.capacity:
            packets: dict[str, EncodedFrames] = {}
            slab.frames += self.episodes.decode(episode, 0, slab.views(episode.steps), packets)
            slab.used += episode.steps
            slab.lengths.append(episode.steps)
            slab.meta.append(episode.meta)
            slab.packets.append(packets)
            slab.packet_bytes += nbytes
            return
        for start in range(0, episode.steps, slab.capacity):
            steps = min(slab.capacity, episode.steps - start)
            slab.frames += self.episodes.decode(episode, start, slab.views(steps), {})
            slab.used = steps
            last = start + steps == episode.steps
            slab.piece = "last" if last else "part"
            slab.meta = [episode.meta] if last else []
            self.flush()
            slab = self.current

    def _start(self, episode: _Episode) -> None:
        from torchstore.data import TrajectoryStoreWriter

        self.episodes.learn_columns(episode)
        columns = _columns(self.src.schema, self.episodes, str(self.src.root))
        dtypes = {
            leaf.name: leaf.store_dtype
            for leaf in self.src.schema.steps
            if leaf.name not in self.episodes.kept  # their packets need no buffer
        }
        shapes = {c.name: tuple(c.shape) for c in columns}
        per_row = sum(math.prod(shapes[n]) * dtypes[n].itemsize for n in dtypes)
        self.capacity = capacity = max(1, _SLAB_BYTES // max(per_row, 1))
        for _ in range(2):
            buffers = {n: np.empty((capacity, *shapes[n]), dtypes[n]) for n in dtypes}
            self.slabs.append(_Slab(buffers, capacity))
        metadata = _store_metadata(self.src, self.tables, self.episodes)
        self.writer = TrajectoryStoreWriter(self.path, columns, metadata=metadata, overwrite=True)

    def flush(self) -> None:
        """Hand the current slab to the writing thread and switch to the other one (once
        its write is done)."""
        slab = self.current
        if not slab.used:
            return
        slab.written = self.io.submit(self._write, slab, self.rows)
        self.rows += slab.used
        self.slabs.reverse()
        other = self.current
        if other.written is not None:
            other.written.result()  # its rows are in the store: the buffers are free again
            other.written = None
        other.reset()
        if other.capacity != self.capacity:  # grown for a long episode: give that back
            other.resize(self.capacity)

    def _write(self, slab: _Slab, first_row: int) -> None:
        for frames in slab.frames:
            frames.result()
        batch = {n: b[: slab.used] for n, b in slab.buffers.items()}
        if slab.piece == "part":  # the writer may hold appended rows until the episode ends
            batch = {n: b.copy() for n, b in batch.items()}
        try:
            if slab.piece is None and self.episodes.kept:  # packets go one episode at a time
                at = 0
                for length, meta, packets in zip(slab.lengths, slab.meta, slab.packets):
                    rows = {n: b[at : at + length] for n, b in batch.items()}
                    self.writer.add_episode({**rows, **packets}, meta)
                    at += length
            elif slab.piece is None:
                self.writer.add_episodes(batch, slab.lengths, slab.meta)
            else:
                self.writer.append(batch)
                if slab.piece == "last":
                    self.writer.end_episode(slab.meta[0])
        except (ColumnError, EpisodeError, FrameCodecError) as exc:
            raise DatasetFormatError(
                f"{self.src.root}: the rows from row {first_row} on cannot be written ({exc})"
            ) from None
        if self.bar is not None:
            self.bar.update(len(slab.lengths) + (slab.piece == "last"))

    def first_error(self) -> BaseException | None:
        """Wait for every decode and write under way; the first error among them (in
        order: an earlier episode's error comes before a later one's)."""
        for slab in sorted(self.slabs, key=lambda s: s.written is None):
            for task in (slab.written, *slab.frames):
                if task is not None:
                    error = task.exception()
                    if error is not None:
                        return error
        return None

    def close(self, ok: bool) -> None:
        """Finish the writes and close the store (``ok``), or abandon it."""
        try:
            if ok:
                self.flush()
                for slab in self.slabs:
                    if slab.written is not None:
                        slab.written.result()
        except BaseException:
            ok = False
            raise
        finally:
            self.first_error()  # an abandoned write must stop before the file closes
            self.io.shutdown()
            if self.writer is not None and ok:
                self.writer.close()
            elif self.writer is not None:
                self.writer.abort()


def import_rlds(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    split: str = "train",
    overwrite: bool = False,
    progress: bool = True,
    images: str = "keep",
) -> Path:
    """Import one split of an RLDS dataset (a TFDS folder) into a new store at ``dest``.

    Args:
        source: the TFDS version folder (``dataset_info.json``, ``features.json`` and the
            ``<name>-<split>.tfrecord-XXXXX-of-YYYYY`` shards), or a folder holding exactly
            one such version folder.
        dest: the store file to write (never inside ``source``, never a file that is not a
            store; see :func:`torchstore.io.destination.check_destination`).
        split: the split to import.
        overwrite: replace an existing store at ``dest``.
        progress: draw a progress bar over episodes.
        images: ``"keep"``: ``uint8`` image features become encoded columns holding the
            dataset's JPEG / PNG bytes as they are (every frame checked; see
            :mod:`torchstore.formats.rlds_images` for the frames and features that are
            re-encoded or decoded instead); ``"decode"``: every image feature is decoded
            to a raw column (about 7x the disk for camera JPEGs, no decode at read).

    Returns:
        ``dest``.

    Raises:
        DatasetFormatError: the dataset breaks its format: a missing or malformed
            ``features.json`` or ``dataset_info.json`` (the message names the file and
            the key path), a missing shard, a truncated shard or one with fewer episodes
            than ``dataset_info.json`` lists, a CRC32C that does not match, an image that
            cannot be decoded (kept frames too: each is decoded once to check it), a step
            feature of the wrong length (the message names the file, the episode and the
            feature). Nothing is left at ``dest``.
        UnsupportedError: a feature a store cannot hold (video, nested sequences, dynamic
            shapes, uint64).

    Examples:
        >>> import_rlds("~/tensorflow_datasets/bridge/0.1.0", "bridge.h5")
        PosixPath('bridge.h5')
    """
    from torchstore.io.destination import check_destination, written_beside

    if images not in IMAGE_MODES:
        raise ArgumentError(f"images must be one of {', '.join(IMAGE_MODES)}, not {images!r}")
    src = RldsSource.open(Path(source).expanduser(), split)
    dest = check_destination(Path(dest), sources=[src.root], overwrite=overwrite)
    text = [leaf for leaf in src.schema.steps if leaf.kind == "text"]
    tables = _scan_strings(src, text) if text else {}
    raw: dict[str, str] = {}  # kept features that met a frame a JPEG cannot hold: why
    while True:
        bar = _bar(src.episodes, progress, f"import {src.root.parent.name or src.root.name}")
        empty: list[str] = []
        try:
            with (
                written_beside(dest, "importing") as partial,
                ThreadPoolExecutor(_DECODE_THREADS, thread_name_prefix="rlds-decode") as pool,
            ):
                episodes = _Episodes(src.schema, tables, pool, images == "keep", raw)
                _import_into(src, _Slabs(partial, src, tables, episodes, bar), empty)
            break
        except _KeepRaw as exc:  # start over, with that feature decoded (once per feature)
            raw[exc.name] = exc.why
        finally:
            if bar is not None:
                bar.close()
    if empty:
        warnings.warn(
            f"{len(empty)} episodes have no steps; a store has no row for them, skipped "
            f"(first: {empty[0]})",
            stacklevel=2,
        )
    return dest


def _import_into(src: RldsSource, slabs: _Slabs, empty: list[str]) -> None:
    """Import every episode through ``slabs``; the earliest failure is the one raised."""
    ok = False
    try:
        _import(src, slabs, empty)
        ok = True
    except DatasetFormatError:
        earlier = slabs.first_error()  # an earlier episode's frame that failed
        if earlier is not None:
            raise earlier from None
        raise
    finally:
        slabs.close(ok)


def _import(src: RldsSource, slabs: _Slabs, empty: list[str]) -> None:
    keys = {leaf.key for leaf in (*src.schema.steps, *src.schema.episode)}
    for shard, record, where, features in _records(src, keys):
        episode = slabs.episodes.parse(where, features)
        if not episode.steps:
            empty.append(where)
            continue
        episode.meta["rlds"] = {"shard": shard.name, "record": record}
        slabs.add(episode)
    if not slabs.slabs:
        raise DatasetFormatError(f"{src.root}: the split {src.split!r} holds no steps")


def _bar(total: int | None, enabled: bool, desc: str):
    if not enabled:
        return None
    from torchstore.io.progress import progress_bar

    return progress_bar(total=total, unit="episode", desc=desc, leave=False)
