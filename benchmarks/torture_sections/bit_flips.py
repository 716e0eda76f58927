"""One flipped bit in each region of a store file, the file then read completely."""

from __future__ import annotations

import random
import struct
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

from torchstore.data import TrajectoryStoreWriter
from torture_sections.kit import (
    COLUMNS,
    episode_rows,
    forked,
    read_everything,
    short,
)

# ----------------------------------------------------------------- corruption regions
_HDF5_SIGNATURES = (
    b"BTHD",
    b"BTIN",
    b"BTLF",
    b"EAHD",
    b"EAIB",
    b"EASB",
    b"EADB",
    b"FAHD",
    b"FADB",
    b"FSHD",
    b"FSSE",
    b"FRHP",
    b"FHDB",
    b"FHIB",
    b"OCHK",
    b"TREE",
    b"SNOD",
    b"HEAP",
)


def _ohdr_length(data: bytes, addr: int) -> int:
    """Bytes of a version-2 object header's first chunk (signature to checksum)."""
    flags = data[addr + 5]
    pos = addr + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 0x03)
    size = int.from_bytes(data[pos : pos + width], "little")
    return 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0) + width + size + 4


_REGION_KINDS = (
    "superblock",
    "object headers",
    "HDF5 indexes",
    "global heap",
    "manifest",
    "checksum tables",
    "episode tables",
    "commit record",
    "data",
)
_RAW_KINDS = ("commit record", "checksum tables", "episode tables", "data")


def _chunk_ranges(ds: h5py.Dataset) -> list[tuple[int, int]]:
    """The bytes of each chunk that hold rows (a chunk's tail past the last row is unused)."""
    out = []
    row_bytes = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
    for i in range(ds.id.get_num_chunks()):
        info = ds.id.get_chunk_info(i)
        rows = max(0, min(ds.chunks[0], ds.shape[0] - info.chunk_offset[0]))
        out.append((info.byte_offset, info.byte_offset + min(info.size, rows * row_bytes)))
    return out


def _dataset_regions(path: Path, data: bytes, regions: dict) -> tuple[set[int], bytes]:
    """Fill the raw-data regions; returns every object header address and the manifest."""
    with h5py.File(path, "r") as f:
        addrs = {h5py.h5o.get_info(f.id).addr}

        def visit(name, obj):
            addrs.add(h5py.h5o.get_info(obj.id).addr)
            if not isinstance(obj, h5py.Dataset):
                return
            if name == "commit":
                off = obj.id.get_offset()
                regions["commit record"].append((off, off + obj.id.get_storage_size()))
            elif name.startswith("checksums/"):
                regions["checksum tables"] += _chunk_ranges(obj)
            elif name.startswith("episodes/"):
                regions["episode tables"] += _chunk_ranges(obj)
            else:
                regions["data"] += _chunk_ranges(obj)

        f.visititems(visit)
        ext = struct.unpack("<Q", data[20:28])[0]  # superblock extension object header
        if ext != 0xFFFFFFFFFFFFFFFF:
            addrs.add(ext)
        manifest = f.attrs["torchstore_manifest"]
    return addrs, manifest.encode() if isinstance(manifest, str) else manifest


def _global_heap_regions(data: bytes, start: int, text: bytes) -> list[tuple[int, int]]:
    """Global heap collections, less the manifest's bytes (at ``start``) where one holds it."""
    out = []
    pos = data.find(b"GCOL")
    while pos >= 0:
        size = struct.unpack("<Q", data[pos + 8 : pos + 16])[0]
        if 0 < size < len(data):
            lo, hi = pos, min(pos + size, len(data))
            if start >= 0 and lo <= start < hi:
                out += [(lo, start), (start + len(text), hi)]
            else:
                out.append((lo, hi))
        pos = data.find(b"GCOL", pos + 4)
    return out


def _index_regions(data: bytes, raw_ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """256 bytes from each HDF5 index signature found outside the raw data."""
    out = []
    for sig in _HDF5_SIGNATURES:
        pos = data.find(sig)
        while pos >= 0:
            if not any(a <= pos < b for a, b in raw_ranges):
                out.append((pos, min(pos + 256, len(data))))
            pos = data.find(sig, pos + 4)
    return out


def file_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of each kind of thing in a store file."""
    data = path.read_bytes()
    regions: dict[str, list[tuple[int, int]]] = {k: [] for k in _REGION_KINDS}
    regions["superblock"].append((0, 48))
    addrs, text = _dataset_regions(path, data, regions)
    raw_ranges = [r for key in _RAW_KINDS for r in regions[key]]
    for addr in sorted(addrs):
        if data[addr : addr + 4] == b"OHDR":
            regions["object headers"].append((addr, addr + _ohdr_length(data, addr)))
    start = data.find(text)
    if start >= 0:
        regions["manifest"].append((start, start + len(text)))
    regions["global heap"] += _global_heap_regions(data, start, text)
    regions["HDF5 indexes"] += _index_regions(data, raw_ranges)
    return {k: [(a, b) for a, b in v if b > a] for k, v in regions.items()}


_PRISTINE: dict[str, bytes] = {}  # the first store built in this process, as bytes


def _pristine_store(path: Path) -> None:
    """A store of 600 committed episodes at ``path``: built once a process (600 commits),
    copied after that (the region-map test and a torture run in one test process)."""
    if "bytes" in _PRISTINE:
        path.write_bytes(_PRISTINE["bytes"])
        return
    with TrajectoryStoreWriter(
        path, COLUMNS, env_id="CartPole-v1", seed=3, metadata={"note": "torture"}
    ) as w:
        for i in range(600):
            w.add_episode(episode_rows(i), metadata={"i": i})
    _PRISTINE["bytes"] = path.read_bytes()


def corruptions(
    workdir: Path, trials: int, rng: random.Random
) -> tuple[dict[str, Counter], list[str]]:
    good = workdir / "pristine.h5"
    _pristine_store(good)
    kind, reference = forked(lambda: read_everything(good), timeout=120)
    assert kind == "ok", reference
    regions = file_regions(good)
    names = [k for k, v in regions.items() if v]
    data = good.read_bytes()
    results: dict[str, Counter] = {k: Counter() for k in names}
    notes = []
    bad = workdir / "bad.h5"
    for trial in range(trials):
        region = names[trial % len(names)]
        lo, hi = rng.choice(regions[region])
        offset = rng.randrange(lo, hi)
        bit = rng.randrange(8)
        damaged = bytearray(data)
        damaged[offset] ^= 1 << bit
        bad.write_bytes(damaged)
        kind, value = forked(lambda: read_everything(bad), timeout=30)
        if kind == "ok":
            label = "identical" if value == reference else "SILENT"
        else:
            label = {"torchstore": "clean error", "raw": "raw", "crash": "crash", "hang": "hang"}[
                kind
            ]
        results[region][label] += 1
        if label not in ("identical", "clean error"):
            notes.append(f"{region} byte {offset} bit {bit}: {label}: {short(value)}")
    return results, notes
