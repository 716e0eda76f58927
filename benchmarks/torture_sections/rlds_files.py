"""Hostile RLDS datasets: the shipped TFDS fixture mutated at random, then imported.

Each trial copies ``tests/formats/fixtures/rlds_tiny/1.0.0``, damages one thing and runs
``import_rlds`` in a forked child with a deadline and an address-space cap:

- framing: a byte flipped, the file cut, junk appended, or a record's length field set to
  a large value with its CRC recomputed (so only the bytes left can refuse it);
- record bytes: bytes inside one record changed, inserted or deleted, or a run of 0xff
  varint bytes written, with both CRCs recomputed (the Example parser sees the damage);
- Example fields: a feature dropped, emptied, cut short, lengthened, given the wrong kind
  of list, or its values swapped for hostile ones (10-byte varints, a JPEG or PNG whose
  header claims 65000x65000 pixels, random bytes, a zlib bomb, text that is not UTF-8);
- JSON: one value of ``dataset_info.json`` or ``features.json`` replaced (``"a"``,
  ``1e400``, -1, a huge integer, null, a list, an object, a deep nest, a long string), its
  key removed, or its key renamed (empty, ``a/b``, a clash, 300 characters, NUL).

Outcomes: clean error (a one-line torchstore error, nothing at DEST) / imported (the store
reads back whole) / raw (any other exception) / not one line (a torchstore error over
several lines) / hang / over-memory (peak RSS more than :data:`_MEMORY_BUDGET` over the
parent's, or a MemoryError) / partial DEST (something left at or beside DEST after an
error) / crash.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import traceback
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from torchstore.errors import TorchstoreError
from torchstore.io.records.tfrecord import (
    iter_records,
    parse_example,
    serialize_example,
    write_records,
)
from torture_sections import kit
from torture_sections.kit import short

OUTCOMES = [
    "clean error",
    "imported",
    "raw",
    "not one line",
    "hang",
    "over-memory",
    "partial DEST",
    "crash",
]
GOOD = {"clean error", "imported"}
FIXTURE = (
    Path(__file__).resolve().parents[2] / "tests" / "formats" / "fixtures" / "rlds_tiny" / "1.0.0"
)
_DEADLINE_S = 60.0
#: Peak RSS a child may add to its parent's (the fixture needs a few MiB).
_MEMORY_BUDGET = 512 * 2**20
#: The address space a child may add to its parent's: past it allocations fail at once
#: (a MemoryError, counted over-memory) instead of the machine swapping.
_ADDRESS_SPACE = 4 * 2**30
#: A message longer than this is not one line (it echoes something it should not).
_MESSAGE_LIMIT = 2000
_KINDS = ("framing", "record bytes", "example fields", "json")


# ----------------------------------------------------------------- mutations
def _shards(version: Path) -> list[Path]:
    return sorted(version.glob("*.tfrecord-*"))


def _mutate_framing(version: Path, rng: random.Random) -> str:
    shard = rng.choice(_shards(version))
    data = bytearray(shard.read_bytes())
    how = rng.choice(("flip", "cut", "junk", "length"))
    if how == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "cut":
        del data[rng.randrange(len(data)) :]
    elif how == "junk":
        data += rng.randbytes(rng.choice((1, 11, 12, 16, 100)))
    else:
        offsets, pos = [], 0
        while pos + 12 <= len(data):
            offsets.append(pos)
            pos += 16 + struct.unpack_from("<Q", data, pos)[0]
        at = rng.choice(offsets)
        length = rng.choice((2**31, 2**31 - 1, 2**40, len(data), 2**64 - 1, 0))
        header = struct.pack("<Q", length)
        from torchstore.io.records.tfrecord import masked_crc32c

        data[at : at + 12] = header + struct.pack("<I", masked_crc32c(header))
        how = f"length {length}"
    shard.write_bytes(bytes(data))
    return f"framing {how} in {shard.name}"


def _rewrite(shard: Path, rng: random.Random, change) -> None:
    records = list(iter_records(shard))
    i = rng.randrange(len(records))
    records[i] = change(records[i])
    write_records(shard, records)


def _mutate_record_bytes(version: Path, rng: random.Random) -> str:
    shard = rng.choice(_shards(version))
    how = rng.choice(("set", "insert", "delete", "varint"))

    def change(record: bytes) -> bytes:
        data = bytearray(record)
        for _ in range(rng.choice((1, 1, 2, 5))):
            at = rng.randrange(len(data))
            if how == "set":
                data[at] = rng.randrange(256)
            elif how == "insert":
                data[at:at] = rng.randbytes(rng.randint(1, 4))
            elif how == "delete":
                del data[at : at + rng.randint(1, 4)]
            else:
                data[at : at + 10] = b"\xff" * 9 + bytes([rng.randrange(128)])
        return bytes(data)

    _rewrite(shard, rng, change)
    return f"record bytes {how} in {shard.name}"


def _jpeg_bomb(blob: bytes) -> bytes:
    """A JPEG whose SOF header claims 65000x65000 pixels (the rest unchanged)."""
    data = bytearray(blob)
    for marker in (b"\xff\xc0", b"\xff\xc2", b"\xff\xc1"):
        at = data.find(marker)
        if at >= 0:
            data[at + 5 : at + 9] = struct.pack(">HH", 65000, 65000)
            break
    return bytes(data)


def _png_bomb(width: int = 65000, height: int = 65000) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` RGB pixels, with one tiny IDAT."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 1000)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _hostile_value(key: str, value, rng: random.Random):
    how = rng.randrange(12)
    if how == 0:
        return []
    if how == 1:
        return value[: rng.randrange(max(len(value), 1))]
    if how == 2:
        return np.concatenate([value, value[:3]]) if isinstance(value, np.ndarray) else value * 2
    if how == 3:
        return [b"x"] * max(len(value), 1)
    if how == 4:
        return np.arange(max(len(value), 1), dtype=np.float32)
    if how == 5:
        return np.full(max(len(value), 1), rng.choice((-1, 2**63 - 1, 7, 300)), dtype=np.int64)
    if how == 6 and isinstance(value, list) and value:
        return [_jpeg_bomb(v) for v in value]
    if how == 7 and isinstance(value, list) and value:
        return [_png_bomb()] + value[1:]
    if how == 8 and isinstance(value, list) and value:
        return [zlib.compress(b"\0" * 2**24)] + value[1:]  # 16 MiB of zeros in 16 KiB
    if how == 9 and isinstance(value, list) and value:
        return [b"\xff\xfe\xfd"] + value[1:]
    if how == 10 and isinstance(value, list) and value:
        return [rng.randbytes(rng.choice((0, 3, 40, 400)))] + value[1:]
    return None  # drop the feature


def _mutate_example(version: Path, rng: random.Random) -> str:
    shard = rng.choice(_shards(version))
    chosen = []

    def change(record: bytes) -> bytes:
        features = parse_example(record)
        key = rng.choice(sorted(features))
        new = _hostile_value(key, features[key], rng)
        if new is None:
            del features[key]
        else:
            features[key] = new
        chosen.append(key)
        data = serialize_example(features)
        if rng.random() < 0.2:  # the same, with a 10-byte varint the Int64List packs
            data = _with_long_varint(data, features)
        return data

    _rewrite(shard, rng, change)
    return f"example field {chosen[0]} in {shard.name}"


def _with_long_varint(data: bytes, features: dict) -> bytes:
    """Re-encode the Example with one int feature as 10-byte varints past 64 bits."""
    from torchstore.io.records.tfrecord import _tagged

    ints = [k for k, v in features.items() if isinstance(v, np.ndarray) and v.dtype.kind == "i"]
    if not ints:
        return data
    key = ints[0]
    packed = (b"\xff" * 9 + b"\x7f") * max(len(features[key]), 1)
    feature = _tagged(3, _tagged(1, packed))
    rest = serialize_example({k: v for k, v in features.items() if k != key})
    entry = _tagged(1, _tagged(1, key.encode()) + _tagged(2, feature))
    body = parse_body(rest) + entry
    return _tagged(1, body)


def parse_body(example: bytes) -> bytes:
    """The ``Features`` payload of a serialized Example (its one field 1)."""
    from torchstore.io.records.tfrecord import _fields

    for number, _, a, b in _fields(example, 0, len(example)):
        if number == 1:
            return example[a:b]
    return b""


_DEEP = "DEEP_NEST_PLACEHOLDER"
_HUGE_FLOAT = "HUGE_FLOAT_PLACEHOLDER"


def _paths(node, keys=()):
    yield keys
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*keys, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*keys, i))


def _mutate_json(version: Path, rng: random.Random) -> str:
    path = version / rng.choice(("dataset_info.json", "features.json"))
    data = json.loads(path.read_text())
    keys = rng.choice([k for k in _paths(data) if k])
    parent = data
    for k in keys[:-1]:
        parent = parent[k]
    values = ["a", _HUGE_FLOAT, -1, 2**70, None, [], {}, _DEEP, "x" * 100_000, True, 5, "-7"]
    value = rng.choice([*values, "<delete>", "<rename>"])
    if value == "<rename>" and isinstance(parent, dict):
        name = rng.choice(("", " x", "a/b", "steps", "observation", "y" * 300, "\0", "é"))
        parent[name] = parent.pop(keys[-1])
        value = f"<rename to {name[:20]!r}>"
    elif value in ("<delete>", "<rename>") and isinstance(parent, dict):
        del parent[keys[-1]]
    else:
        parent[keys[-1]] = None if value in ("<delete>", "<rename>") else value
    text = json.dumps(data)
    text = text.replace(f'"{_HUGE_FLOAT}"', "1e400").replace(f'"{_DEEP}"', "[" * 5000 + "]" * 5000)
    path.write_text(text)
    return f"{path.name} {'.'.join(map(str, keys))} = {str(value)[:30]}"


_MUTATORS = {
    "framing": _mutate_framing,
    "record bytes": _mutate_record_bytes,
    "example fields": _mutate_example,
    "json": _mutate_json,
}


# ----------------------------------------------------------------- one trial
def _child(source: Path, dest: Path) -> tuple[str, str]:
    from torchstore import TrajectoryStore
    from torchstore.formats import import_rlds

    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_rlds(source, dest, progress=False)
        with TrajectoryStore(dest) as store:
            store.read_slab(0, store.num_rows)
        return "imported", ""
    except MemoryError as exc:
        return "over-memory", f"MemoryError: {exc}"
    except TorchstoreError as exc:
        text = f"{type(exc).__name__}: {exc}"
        one_line = "\n" not in str(exc) and len(text) <= _MESSAGE_LIMIT
        return ("clean error" if one_line else "not one line"), text
    except BaseException as exc:  # noqa: BLE001 - counting raw exceptions is the point
        return "raw", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _forked(source: Path, dest: Path) -> tuple[str, str]:
    """Run one import in a child: (outcome, text); hang / crash / over-memory from outside."""
    baseline, usage = _rss_bytes(), {}

    def report() -> tuple[str, str]:  # short enough for the pipe, long enough to judge
        outcome, text = _child(source, dest)
        return outcome, text[: _MESSAGE_LIMIT + 1000]

    kind, value = kit.forked(
        report,
        _DEADLINE_S,
        address_space=_address_space() + _ADDRESS_SPACE,
        usage=usage,
    )
    if kind == "hang":
        return "hang", f"still running after {_DEADLINE_S:.0f} s"
    if kind != "ok":  # a crash, or an exception _child did not catch
        return ("crash" if kind == "crash" else "raw"), str(value)
    outcome, text = value
    grown = usage["maxrss"] - baseline
    if outcome in GOOD and grown > _MEMORY_BUDGET:
        return "over-memory", f"peak RSS {grown / 2**20:.0f} MiB over the parent's ({text[:200]})"
    return outcome, text


def _trial(workdir: Path, kind: str, rng: random.Random) -> tuple[str, str]:
    root = workdir / "rlds"
    shutil.rmtree(root, ignore_errors=True)
    version = root / "src" / "rlds_tiny" / "1.0.0"
    shutil.copytree(FIXTURE, version)
    what = _MUTATORS[kind](version, rng)
    out = root / "out"
    out.mkdir()
    dest = out / "store.h5"
    outcome, text = _forked(version, dest)
    left = sorted(p.name for p in out.iterdir())
    if outcome == "clean error" and left:
        outcome, text = "partial DEST", f"left {left} after: {text}"
    elif outcome == "imported" and left != ["store.h5"]:
        outcome, text = "partial DEST", f"left {left} after a successful import"
    return outcome, f"{what}: {text}"


def run_section(workdir: Path, trials: int, rng: random.Random) -> tuple[Counter, list[str]]:
    """``trials`` mutated datasets imported (the kinds in turn); counts and off-target notes."""
    import torchstore.data.file.writer  # noqa: F401 - imported once, before the forks
    import torchstore.formats.rlds  # noqa: F401

    counts: Counter = Counter()
    notes: list[str] = []
    for i in range(trials):
        kind = _KINDS[i % len(_KINDS)]
        outcome, text = _trial(workdir, kind, rng)
        counts[outcome] += 1
        if outcome not in GOOD:
            notes.append(f"rlds {kind}: {outcome}: {short(text)}")
    shutil.rmtree(workdir / "rlds", ignore_errors=True)
    return counts, notes
