"""Byte-reproducible HDF5 files: no timestamps, no stale bytes.

A store written twice from the same rows differs in two places: the manifest's creation
time (a writer can fix it: ``TrajectoryStoreWriter(..., created=...)``) and the
timestamps HDF5 itself stores in an object header. Datasets and groups are created
without them, but the superblock extension (which holds the persistent free-space
information of a paged file) is created by the library with its default object-creation
properties, which track times, and no property reaches it. Worse, as a paged file grows
that header is rewritten elsewhere, and the space it left keeps bytes of its old
timestamped checksum: clearing the times of the live header is not enough (measured:
4 bytes of such a leftover differed between two runs a second apart).

:func:`reproducible_copy` therefore copies a finished store, object by object
(``H5Ocopy``, in the order of their names), into a new file with HDF5's default
file-space handling: no superblock extension, so no timestamps and no freed space
holding old bytes; same content, same bytes. The copy is an ordinary store (readable,
verifiable, resumable); it only lacks the paged free-space layout the writer uses for
appends. :func:`clear_object_times` zeroes
the timestamps of version-2 object headers in place, for files that keep their layout.

Format facts used (HDF5 file format specification, version 2 object headers and
superblocks): a v2/v3 superblock is ``\\x89HDF\\r\\n\\x1a\\n``, version, size of offsets,
size of lengths, flags, then the base, superblock-extension, end-of-file and root-group
addresses; a v2 object header is ``OHDR``, version 2, flags (bit 5: four 32-bit times
follow; bit 4: two 16-bit attribute phase-change values follow; bits 0-1: width of the
chunk-0 size), the chunk-0 messages, and a Jenkins lookup3 checksum of everything before
it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

__all__ = ["reproducible_copy", "clear_object_times", "lookup3"]

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_TIMES = 0x20
_PHASE_CHANGE = 0x10
_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` of ``data``, the checksum HDF5 metadata uses."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & _MASK
    pos = 0
    while length - pos > 12:
        a = (a + int.from_bytes(data[pos : pos + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[pos + 4 : pos + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[pos + 8 : pos + 12], "little")) & _MASK
        a = (a - c) & _MASK
        a ^= _rot(c, 4)
        c = (c + b) & _MASK  # noqa: E702
        b = (b - a) & _MASK
        b ^= _rot(a, 6)
        a = (a + c) & _MASK  # noqa: E702
        c = (c - b) & _MASK
        c ^= _rot(b, 8)
        b = (b + a) & _MASK  # noqa: E702
        a = (a - c) & _MASK
        a ^= _rot(c, 16)
        c = (c + b) & _MASK  # noqa: E702
        b = (b - a) & _MASK
        b ^= _rot(a, 19)
        a = (a + c) & _MASK  # noqa: E702
        c = (c - b) & _MASK
        c ^= _rot(b, 4)
        b = (b + a) & _MASK  # noqa: E702
        pos += 12
    tail = data[pos:]
    if not tail:
        return c
    tail = tail + bytes(12 - len(tail))
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    c ^= b
    c = (c - _rot(b, 14)) & _MASK  # noqa: E702
    a ^= c
    a = (a - _rot(c, 11)) & _MASK  # noqa: E702
    b ^= a
    b = (b - _rot(a, 25)) & _MASK  # noqa: E702
    c ^= b
    c = (c - _rot(b, 16)) & _MASK  # noqa: E702
    a ^= c
    a = (a - _rot(c, 4)) & _MASK  # noqa: E702
    b ^= a
    b = (b - _rot(a, 14)) & _MASK  # noqa: E702
    c ^= b
    c = (c - _rot(b, 24)) & _MASK  # noqa: E702
    return c


def _object_addresses(path: Path) -> list[int]:
    """The object-header addresses of the root group, every object and the superblock extension."""
    import h5py

    addresses: list[int] = []
    with h5py.File(path, "r") as f:
        addresses.append(h5py.h5o.get_info(f.id).addr)
        f.visititems(lambda _, obj: addresses.append(h5py.h5o.get_info(obj.id).addr))
    with open(path, "rb") as raw:
        head = raw.read(12)
        if head[:8] == _SIGNATURE and head[8] >= 2:
            size = head[9]
            raw.seek(12 + size)  # after the base address: the superblock-extension address
            ext = int.from_bytes(raw.read(size), "little")
            if ext != (1 << (8 * size)) - 1:  # all ones: no extension
                addresses.append(ext)
    return addresses


def clear_object_times(path: str | os.PathLike) -> int:
    """Zero the timestamps of every version-2 object header in the closed file ``path``.

    Returns:
        The number of object headers changed (0 when HDF5 stored no times).
    """
    path = Path(path)
    changed = 0
    with open(path, "r+b") as f:
        for address in sorted(set(_object_addresses(path))):
            f.seek(address)
            head = f.read(6)
            if len(head) < 6 or head[:4] != b"OHDR" or head[4] != 2 or not head[5] & _TIMES:
                continue
            flags = head[5]
            prefix = 6 + 16 + (4 if flags & _PHASE_CHANGE else 0)
            width = 1 << (flags & 0x03)
            f.seek(address)
            header = f.read(prefix + width)
            chunk = int.from_bytes(header[prefix:], "little")
            body = header + f.read(chunk)
            (stored,) = struct.unpack("<I", f.read(4))
            if lookup3(body) != stored:  # not a header this code understands: leave it
                continue
            if body[6:22] == bytes(16):
                continue
            body = body[:6] + bytes(16) + body[22:]
            f.seek(address)
            f.write(body + struct.pack("<I", lookup3(body)))
            changed += 1
    return changed


def reproducible_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the HDF5 file ``src`` to a new file ``dst`` whose bytes depend only on content.

    Root attributes are copied with their stored types and every top-level object with
    ``H5Ocopy``, into a file with the latest format (SWMR-readable) and default file-space
    handling. ``dst`` is created or truncated; ``src`` is only read.
    """
    import h5py

    dst = Path(dst)
    with h5py.File(src, "r") as source, h5py.File(dst, "w", libver="latest") as copy:
        _copy_in_name_order(source, copy)
    clear_object_times(dst)
    return dst


def _copy_in_name_order(source, copy) -> None:
    """``source``'s attributes, then its members by name, groups walked recursively.

    The order objects are copied in is the order their bytes are laid out in: copying a
    whole group with ``H5Ocopy`` follows the order the source's links are stored in, which
    the writer's history decides (a store written by one version of the writer was laid
    out otherwise than the same rows written by the next). By name, the layout depends
    on the content alone."""
    import h5py

    for name in source.attrs:
        stored = source.attrs.get_id(name)
        copy.attrs.create(name, source.attrs[name], shape=stored.shape, dtype=stored.dtype)
    for name in sorted(source):
        member = source[name]
        if isinstance(member, h5py.Group):
            _copy_in_name_order(member, copy.create_group(name))
        else:
            source.copy(member, copy, name=name)
