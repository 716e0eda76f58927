"""``import_rlds``: an RLDS / Open X-Embodiment dataset (TFDS folder) into a trajectory store.

No TensorFlow at run time: the TFRecord shards are streamed by
:mod:`torchstore.io.tfrecord` (both CRC32C checks on every record), each episode's
``tf.train.Example`` is decoded by hand, JPEG images by libjpeg-turbo (simplejpeg) with
TensorFlow's settings, so the pixels are tfds's bit for bit, PNG by Pillow.

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
``dataset_info.json`` and ``features.json`` are kept in ``metadata["rlds"]``.

Memory stays flat: one record is read at a time, shard after shard, and episodes decode
(images in threads) straight into one of two slabs of about :data:`_SLAB_BYTES`, each
committed in one ``add_episodes`` call on a writing thread while the next slab fills. The
store is written under a hidden name beside ``dest`` and renamed into place only when
complete, so a failed import leaves nothing at ``dest``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.errors import (
    ColumnError,
    DatasetFormatError,
    EpisodeError,
    UnsupportedError,
)
from torchstore.formats.rlds_features import (
    Leaf,
    Schema,
    decode_image,
    decode_text,
    episode_value,
    read_schema,
    step_count,
    step_values,
)
from torchstore.io.tfrecord import iter_records, parse_example

__all__ = ["import_rlds", "locate_rlds", "RldsSource"]

#: Bytes of decoded rows per commit (two slabs are held: one being written, one filling).
_SLAB_BYTES = 32 * 2**20
#: Threads decoding images (libjpeg-turbo and Pillow release the GIL while they decode).
_DECODE_THREADS = min(8, os.cpu_count() or 1)
_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DatasetFormatError(f"{path} is missing, so {path.parent} is not a TFDS dataset")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DatasetFormatError(f"{path} cannot be read as JSON ({exc})") from None


def _is_version_dir(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "features.json").is_file()


def locate_rlds(source: str | os.PathLike) -> Path:
    """The version folder of a TFDS dataset: ``source`` itself, or the one version folder in it.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        DatasetFormatError: no version folder (no ``dataset_info.json``/``features.json``),
            or several.
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not path.is_dir():
        raise DatasetFormatError(f"{path} is a file; a TFDS dataset is a folder")
    if _is_version_dir(path):
        return path
    found = sorted(p for p in path.iterdir() if p.is_dir() and _is_version_dir(p))
    if len(found) == 1:
        return found[0]
    if not found:
        raise DatasetFormatError(
            f"{path} is not a TFDS dataset: no features.json or dataset_info.json in it or in "
            "a version folder below it"
        )
    raise DatasetFormatError(
        f"{path} holds several versions ({', '.join(p.name for p in found)}); pass one"
    )


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
        info = _read_json(root / "dataset_info.json")
        features = _read_json(root / "features.json")
        if not isinstance(info, dict):
            raise DatasetFormatError(f"{root / 'dataset_info.json'}: not a JSON object")
        schema = read_schema(features, str(root / "features.json"))
        shards, lengths = _shards(root, info, split)
        return cls(root, split, info, features, schema, shards, lengths)

    @property
    def episodes(self) -> int | None:
        """Episodes in the split, as dataset_info.json counts them."""
        return None if self.shard_lengths is None else sum(self.shard_lengths)


def _shards(root: Path, info: dict, split: str) -> tuple[list[Path], list[int] | None]:
    where = root / "dataset_info.json"
    fmt = str(info.get("fileFormat") or "tfrecord")
    if fmt != "tfrecord":
        raise UnsupportedError(f"{where}: the file format {fmt!r} (only tfrecord is read)")
    splits = {s.get("name"): s for s in info.get("splits", []) if isinstance(s, dict)}
    entry = splits.get(split)
    name = info.get("name")
    if entry is None and splits:
        raise DatasetFormatError(f"{where}: no split {split!r} (splits: {sorted(splits)})")
    lengths = None if entry is None else entry.get("shardLengths")
    if not lengths or not name:  # older infos: whatever shards are there
        pattern = re.compile(
            rf"{re.escape(str(name or ''))}.*-{re.escape(split)}\.tfrecord-\d+-of-\d+"
        )
        found = sorted(p for p in root.iterdir() if pattern.fullmatch(p.name))
        if not found:
            raise DatasetFormatError(f"{root}: no TFRecord shards of the split {split!r}")
        return found, None
    template = str(entry.get("filepathTemplate") or _TEMPLATE)
    digits = max(len(str(len(lengths))), 5)
    shards = []
    for i in range(len(lengths)):
        mapping = {
            "DATASET": name,
            "SPLIT": split,
            "FILEFORMAT": "tfrecord",
            "SHARD_INDEX": f"{i:0{digits}d}",
            "NUM_SHARDS": f"{len(lengths):0{digits}d}",
        }
        mapping["SHARD_X_OF_Y"] = f"{mapping['SHARD_INDEX']}-of-{mapping['NUM_SHARDS']}"
        try:
            shard = root / template.format(**mapping)
        except (KeyError, IndexError, ValueError):
            raise DatasetFormatError(
                f"{where}: the file template {template!r} is not tfds's"
            ) from None
        if not shard.is_file():
            raise DatasetFormatError(f"{shard} is missing ({where} lists {len(lengths)} shards)")
        shards.append(shard)
    return shards, [int(n) for n in lengths]


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


class _Episodes:
    """Decodes episodes into column arrays, checking every step feature against the schema."""

    def __init__(self, schema: Schema, tables: dict[str, list[str]], pool: ThreadPoolExecutor):
        self.schema = schema
        self.codes = {n: {s: i for i, s in enumerate(t)} for n, t in tables.items()}
        self.pool = pool
        self.shapes: dict[str, tuple[int, ...]] = {}  # the image shapes the columns hold

    def decode(
        self, where: str, features: dict, steps: int, out: dict[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        """The step columns of one episode of ``steps`` steps (:meth:`length`), written
        into ``out`` (views of a slab) when given."""
        rows = {}
        for leaf in self.schema.steps:
            what = f"{where}: '{leaf.key}'"
            target = None if out is None else out[leaf.name]
            value = step_values(leaf, features.get(leaf.key, []), steps, what)
            if leaf.kind == "image":
                rows[leaf.name] = self._images(leaf, value, what, target)
                continue
            if leaf.kind == "text":
                codes = self.codes[leaf.name]
                try:
                    value = np.fromiter(
                        (codes[decode_text(b, what)] for b in value), np.int64, len(value)
                    )
                except KeyError as exc:
                    raise DatasetFormatError(
                        f"{what}: the text {exc} was not there when the strings were scanned"
                    ) from None
            if target is not None:
                target[...] = value
                value = target
            rows[leaf.name] = value
        return rows

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

    def _images(
        self, leaf: Leaf, blobs: list[bytes], what: str, out: np.ndarray | None
    ) -> np.ndarray:
        """Decode one episode's images into one array (``out`` when given), in threads."""
        shape = self.shapes.get(leaf.name)
        if shape is None:  # the first episode fixes the column's shape
            if None not in leaf.shape:
                shape = leaf.shape
            elif blobs:
                shape = self._decode(leaf, blobs[0], None, f"{what} step 0").shape
            else:
                return np.empty((0, 0, 0, 0), leaf.dtype)
            self.shapes[leaf.name] = shape
        if out is None:
            out = np.empty((len(blobs), *shape), leaf.dtype)

        def chunk(span: range) -> None:
            for t in span:
                self._decode(leaf, blobs[t], out[t], f"{what} step {t}")

        n = len(blobs)
        tasks = min(n, 2 * _DECODE_THREADS)
        spans = [range(n * i // tasks, n * (i + 1) // tasks) for i in range(tasks)]
        if tasks > 1:
            list(self.pool.map(chunk, spans))
        elif n:
            chunk(range(n))
        return out

    @staticmethod
    def _decode(leaf: Leaf, blob: bytes, out: np.ndarray | None, what: str) -> np.ndarray:
        try:
            image = decode_image(blob, leaf, out)
        except Exception as exc:  # noqa: BLE001 - Pillow/libjpeg raise OSError, ValueError...
            raise DatasetFormatError(
                f"{what}: the {leaf.encoding or 'encoded'} image cannot be decoded "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None
        declared = len(image.shape) == len(leaf.shape) and all(
            d is None or d == s for d, s in zip(leaf.shape, image.shape)
        )
        if not declared or (out is not None and image.shape != out.shape):
            want = leaf.shape if out is None else out.shape
            shown = tuple("?" if d is None else d for d in want)
            raise DatasetFormatError(f"{what}: an image of shape {image.shape}, expected {shown}")
        if out is not None and image is not out:
            out[...] = image
        return image


def _columns(schema: Schema, shapes: dict[str, tuple[int, ...]], where: str) -> list:
    from torchstore.data.columns import ColumnSpec

    specs = []
    for leaf in schema.steps:
        shape = shapes[leaf.name] if leaf.kind == "image" else leaf.shape
        try:
            specs.append(ColumnSpec(leaf.name, leaf.store_dtype, shape))
        except ColumnError as exc:
            raise DatasetFormatError(
                f"{where}: feature '{leaf.key}' cannot be a column ({exc})"
            ) from None
    return specs


def _store_metadata(src: RldsSource, tables: dict[str, list[str]]) -> dict:
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
    return {"rlds": meta}


class _Slabs:
    """Rows of consecutive episodes in reused buffers of about :data:`_SLAB_BYTES`, committed
    in one ``add_episodes`` call per slab. The buffers (and the writer) are made from the
    first episode, once the image shapes are known; later episodes decode straight into
    them. Two sets of buffers take turns: one is written (in ``io``, a one-thread pool)
    while the next episodes decode into the other."""

    def __init__(self, path: Path, src: RldsSource, tables: dict, episodes: _Episodes, bar: Any):
        self.path, self.src, self.tables, self.episodes, self.bar = path, src, tables, episodes, bar
        self.writer = None
        self.io = ThreadPoolExecutor(1, thread_name_prefix="rlds-write")
        self.pending: Future | None = None  # the write of the other set
        self.sets: list[dict[str, np.ndarray] | None] = [None, None]
        self.buffers: dict[str, np.ndarray] | None = None
        self.capacity = self.used = 0
        self.lengths: list[int] = []
        self.meta: list[dict] = []

    def reserve(self, steps: int) -> dict[str, np.ndarray] | None:
        """Views of the next ``steps`` rows of the buffers (None before there are any)."""
        if self.buffers is None:
            return None
        if self.used + steps > self.capacity:
            self.flush()
        if steps > self.capacity:  # an episode longer than a slab: a slab of its own
            self._allocate({n: b[:1] for n, b in self.buffers.items()}, steps)
        return {n: b[self.used : self.used + steps] for n, b in self.buffers.items()}

    def commit(self, rows: dict[str, np.ndarray], steps: int, meta: dict, in_place: bool) -> None:
        """Add an episode whose rows are in the reserved views (``in_place``) or in ``rows``."""
        if not in_place:
            if self.buffers is None:
                per_row = sum(a.nbytes for a in rows.values()) // steps
                self._allocate(rows, max(_SLAB_BYTES // max(per_row, 1), steps))
            for name, view in self.reserve(steps).items():
                view[...] = rows[name]
        self.used += steps
        self.lengths.append(steps)
        self.meta.append(meta)
        if self.used >= self.capacity:
            self.flush()

    def _allocate(self, like: dict[str, np.ndarray], capacity: int) -> None:
        dtypes = {leaf.name: leaf.store_dtype for leaf in self.src.schema.steps}
        self.buffers = {n: np.empty((capacity, *a.shape[1:]), dtypes[n]) for n, a in like.items()}
        self.capacity = capacity

    def flush(self) -> None:
        """Hand the filled set to the writing thread and switch to the other one."""
        if not self.used:
            return
        if self.writer is None:
            from torchstore.data.file.writer import TrajectoryStoreWriter

            columns = _columns(self.src.schema, self.episodes.shapes, str(self.src.root))
            metadata = _store_metadata(self.src, self.tables)
            self.writer = TrajectoryStoreWriter(
                self.path, columns, metadata=metadata, overwrite=True
            )
        batch = {n: b[: self.used] for n, b in self.buffers.items()}
        self.wait()  # the other set's write: that set is free again once it is done
        self.pending = self.io.submit(self._write, batch, self.lengths, self.meta)
        full, other = self.buffers, self.sets[1] if self.sets[0] is self.buffers else self.sets[0]
        if other is None or len(next(iter(other.values()))) != self.capacity:
            self._allocate(full, self.capacity)
            other = self.buffers
        self.sets = [full, other]
        self.buffers = other
        self.used, self.lengths, self.meta = 0, [], []

    def _write(self, batch: dict[str, np.ndarray], lengths: list[int], meta: list[dict]) -> None:
        try:
            self.writer.add_episodes(batch, lengths, meta)
        except (ColumnError, EpisodeError) as exc:
            first = meta[0]["rlds"]
            raise DatasetFormatError(
                f"{self.src.root}: the {len(lengths)} episodes from {first['shard']} "
                f"record {first['record']} on cannot be written ({exc})"
            ) from None
        if self.bar is not None:
            self.bar.update(len(lengths))

    def wait(self) -> None:
        """Wait for the write under way (raising its error)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self, ok: bool) -> None:
        """Finish the writes and close the store (``ok``), or abandon it."""
        try:
            if ok:
                self.flush()
                self.wait()
        except BaseException:
            ok = False
            raise
        finally:
            if self.pending is not None:
                wait([self.pending])  # an abandoned write must stop before the file closes
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

    Returns:
        ``dest``.

    Raises:
        DatasetFormatError: the dataset breaks its format: a missing or unreadable
            ``features.json``, a missing shard, a truncated shard or one with fewer
            episodes than ``dataset_info.json`` lists, a CRC32C that does not match, an
            image that cannot be decoded, a step feature of the wrong length (the message
            names the file, the episode and the feature). Nothing is left at ``dest``.
        UnsupportedError: a feature a store cannot hold (video, nested sequences, dynamic
            shapes, uint64).

    Examples:
        >>> import_rlds("~/tensorflow_datasets/bridge/0.1.0", "bridge.h5")
        PosixPath('bridge.h5')
    """
    from torchstore.io.destination import check_destination, written_beside

    src = RldsSource.open(Path(source).expanduser(), split)
    dest = check_destination(Path(dest), sources=[src.root], overwrite=overwrite)
    text = [leaf for leaf in src.schema.steps if leaf.kind == "text"]
    tables = _scan_strings(src, text) if text else {}
    bar = _bar(src.episodes, progress, f"import {src.root.parent.name or src.root.name}")
    empty: list[str] = []
    try:
        with (
            written_beside(dest, "importing") as partial,
            ThreadPoolExecutor(_DECODE_THREADS, thread_name_prefix="rlds-decode") as pool,
        ):
            slabs = _Slabs(partial, src, tables, _Episodes(src.schema, tables, pool), bar)
            ok = False
            try:
                _import(src, slabs, empty)
                ok = True
            finally:
                slabs.close(ok)
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


def _import(src: RldsSource, slabs: _Slabs, empty: list[str]) -> None:
    keys = {leaf.key for leaf in (*src.schema.steps, *src.schema.episode)}
    episodes = slabs.episodes
    for shard, record, where, features in _records(src, keys):
        steps = episodes.length(where, features)
        meta = episodes.metadata(where, features)
        if not steps:
            empty.append(where)
            continue
        views = slabs.reserve(steps)
        rows = episodes.decode(where, features, steps, views)
        meta["rlds"] = {"shard": shard.name, "record": record}
        slabs.commit(rows, steps, meta, in_place=views is not None)
    if slabs.writer is None and not slabs.used:
        raise DatasetFormatError(f"{src.root}: the split {src.split!r} holds no steps")


def _bar(total: int | None, enabled: bool, desc: str):
    if not enabled:
        return None
    from torchstore.io.progress import progress_bar

    return progress_bar(total=total, unit="episode", desc=desc, leave=False)
