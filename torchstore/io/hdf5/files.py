"""HDF5 transport: atomic creation, SWMR opens with capped retries, recovery after a kill.

Everything here is about files, not trajectories. The choices follow measurements on this
stack (h5py 3.16, HDF5 2.0): the latest file format (metadata checksums), paged file space
(no metadata write crosses a page), a single-writer/multiple-reader (SWMR) writer, and
creation under a temporary name so a writer killed while creating leaves nothing half-made.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import glob
import os
import resource
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import h5py

from torchstore.errors import StorageFullError, StoreFormatError, StoreLockedError
from torchstore.io.dataset_folders import not_a_store
from torchstore.io.hdf5.reproducible import lookup3
from torchstore.io.hdf5.writer_lock import WriterLock

__all__ = [
    "create_atomically",
    "create_for_append",
    "open_for_read",
    "open_for_append",
    "file_object_of",
    "opened_bytes",
    "require_hdf5",
    "fsync_file",
    "abandon",
    "MANIFEST_ATTR",
]

#: The root attribute holding a store's manifest (JSON): what makes an HDF5 file a store.
#: Defined here, below the data layer, so that io's destination checks can name it too.
MANIFEST_ATTR = "torchstore_manifest"

#: Metadata read attempts for SWMR readers. HDF5's default retries a failed metadata
#: checksum with growing sleeps (a damaged file held a reader for over 200 s); 10 attempts
#: fail a damaged file in about 10 ms and still ride out a read racing a live writer.
SWMR_READ_ATTEMPTS = 10
_PAGE_SIZE = 4096
#: How long a reader waits for a writer that is opening the file (holding its lock).
LOCK_WAIT_S = 5.0


def _libhdf5() -> ctypes.CDLL:
    """The libhdf5 h5py itself loaded (same file, so the same library instance)."""
    libdir = Path(h5py.__file__).resolve().parent.parent / "h5py.libs"
    candidates = sorted(glob.glob(str(libdir / "libhdf5-*.so*"))) or sorted(
        glob.glob(str(Path(h5py.__file__).resolve().parent / "**" / "libhdf5*.so*"), recursive=True)
    )
    lib = ctypes.CDLL(candidates[0] if candidates else "libhdf5.so")
    lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    lib.H5Pset.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_void_p]
    lib.H5Fincrement_filesize.argtypes = [ctypes.c_int64, ctypes.c_uint64]
    for fn in (lib.H5Pset_metadata_read_attempts, lib.H5Pset, lib.H5Fincrement_filesize):
        fn.restype = ctypes.c_int
    return lib


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = _libhdf5()
    return _LIB


def _fapl(*, read_attempts: int | None = None) -> h5py.h5p.PropFAID:
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    if read_attempts is not None:
        if _lib().H5Pset_metadata_read_attempts(fapl.id, read_attempts) < 0:
            raise OSError("H5Pset_metadata_read_attempts failed")
    return fapl


def require_hdf5(path: str | os.PathLike) -> Path:
    """Fail clearly when ``path`` is missing or is not an HDF5 file at all."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no store at {path}")
    if path.is_dir():
        raise StoreFormatError(not_a_store(path) or f"{path} is a directory, not a store file")
    if not h5py.is_hdf5(path):
        raise StoreFormatError(f"{path} is not an HDF5 file (no HDF5 signature found)")
    return path


@contextlib.contextmanager
def _built_beside(path: Path, build: Callable[[h5py.File], None]) -> Iterator[Path]:
    """Build the file under a hidden temporary name beside ``path`` and yield that name; it
    is removed on the way out unless the caller renamed it into place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        create_in_place(tmp, build)
        yield tmp
    finally:
        if tmp.exists():
            tmp.unlink()


def create_atomically(path: str | os.PathLike, build: Callable[[h5py.File], None]) -> None:
    """Create ``path`` by building it under a temporary name, closing it, then renaming.

    A writer killed during the first writes of a new HDF5 file leaves a file that cannot
    be opened; the rename makes creation all-or-nothing.
    """
    path = Path(path)
    with _built_beside(path, build) as tmp:
        os.replace(tmp, path)


def create_for_append(path: str | os.PathLike, build: Callable[[h5py.File], None]) -> h5py.File:
    """Create ``path`` as :func:`create_atomically` does and return it open as its SWMR writer.

    The temporary file is opened for SWMR writing *before* it is renamed into place, so
    ``path`` never names a file that is not already held in SWMR-write mode. (Renaming a
    closed file and opening it afterwards left a gap in which a reader that opened it took
    HDF5's file lock and locked the writer out.) The caller holds the writer lock of
    ``path`` (and closes the returned file).
    """
    path = Path(path)
    with _built_beside(path, build) as tmp:
        f = _open_locked(tmp)
        try:
            os.replace(tmp, path)  # the open file moves with its name: HDF5 holds the fd
        except BaseException:
            f.close()
            raise
    return f


def create_in_place(path: str | os.PathLike, build: Callable[[h5py.File], None]) -> None:
    """Create ``path`` directly, for a file no reader looks at until it is renamed.

    Paged file space (no metadata write crosses a page), but its free-space state is not
    persisted: a persisting file rewrote the superblock extension and its free-space
    managers at every open and close (11 writes per close, and one more page each time),
    and a kill inside a close followed by a kill inside the next resume could leave that
    extension unreadable ("invalid file space strategy"). Without persistence a close
    makes 2 writes inside the first page (the extension's header, rewritten in place with
    the same messages, and the superblock), nothing moves, and the file does not grow
    across resumes.
    """
    with h5py.File(
        path, "w", libver="latest", fs_strategy="page", fs_page_size=_PAGE_SIZE, fs_persist=False
    ) as f:
        build(f)


def _open_waiting_for_lock(path: Path, flags: int, fapl: h5py.h5p.PropFAID) -> h5py.h5f.FileID:
    """``h5f.open``, retrying for a moment while a writer holds the lock to enter SWMR mode."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return h5py.h5f.open(os.fsencode(path), flags, fapl=fapl)
        except OSError as exc:
            if "unable to lock file" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


class _SharedReadFile(h5py.File):
    """A read-only SWMR file shared by every reader of one file in this process.

    HDF5 shares one file structure between all opens of a file in a process, and
    ``H5Drefresh`` on one open of a dataset corrupts reads through another open of the same
    dataset ("can't insert duplicate key"). So readers share one ``File`` and one object per
    dataset (``__getitem__`` caches them); the file closes when its last reader does.
    """

    def __getitem__(self, name):  # type: ignore[override]
        if not isinstance(name, str):
            return super().__getitem__(name)
        cache = self._torchstore_objects
        obj = cache.get(name)
        if obj is None:
            obj = cache[name] = super().__getitem__(name)
        return obj

    def close(self) -> None:
        with _READERS_LOCK:
            key = self._torchstore_key
            self._torchstore_users -= 1
            if self._torchstore_users > 0:
                return
            if _READERS.get(key) is self:
                del _READERS[key]
        self._torchstore_objects.clear()
        super().close()


_READERS: dict[tuple[int, int], _SharedReadFile] = {}
_READERS_LOCK = threading.Lock()


def open_for_read(path: str | os.PathLike | BinaryIO) -> h5py.File:
    """Open read-only in SWMR mode (live writers allowed) with capped metadata retries.

    Opens of the same file in one process share one handle (see ``_SharedReadFile``);
    close each one when done. ``path`` may also be a readable, seekable binary file object
    (a remote object read by byte range): it is opened through h5py's ``fileobj`` driver,
    not shared, and closed with the file.
    """
    if hasattr(path, "readinto") and hasattr(path, "seek"):
        return _open_fileobj_for_read(path)
    path = require_hdf5(path)
    stat = path.stat()
    key = (stat.st_dev, stat.st_ino)
    _check_not_abandoned(path, key)
    with _READERS_LOCK:
        shared = _READERS.get(key)
        if shared is not None and shared.id.valid:
            shared._torchstore_users += 1
            return shared
        fapl = _fapl(read_attempts=SWMR_READ_ATTEMPTS)
        try:
            fid = _open_waiting_for_lock(path, h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl)
        except OSError as exc:
            text = str(exc)
            if "unable to lock file" in text:
                raise OSError(f"{path} is locked by a writer that is not in SWMR mode") from exc
            if "superblock version" in text or "libver" in text:
                raise StoreFormatError(
                    f"{path} is an HDF5 file in an older format; it was not written by torchstore"
                ) from exc
            raise StoreFormatError(
                f"{path} cannot be opened as a store (damaged or truncated?): {exc}"
            ) from exc
        shared = _SharedReadFile(fid)
        shared._torchstore_key = key
        shared._torchstore_users = 1
        shared._torchstore_objects = {}
        _READERS[key] = shared
        return shared


class _FileObjFile(h5py.File):
    """A read-only file over a file object; closing it closes the file object too."""

    def close(self) -> None:
        _FILEOBJ_FILES.discard(self)
        super().close()
        self._torchstore_fileobj.close()


#: Files open over file objects, closed at exit before h5py's own exit handler runs (left
#: to it, HDF5 called into a half-finalized file object and crashed the interpreter).
_FILEOBJ_FILES: weakref.WeakSet[_FileObjFile] = weakref.WeakSet()


@atexit.register
def _close_fileobj_files() -> None:
    for f in list(_FILEOBJ_FILES):
        with contextlib.suppress(Exception):
            f.close()


def _open_fileobj_for_read(fileobj: BinaryIO) -> h5py.File:
    name = str(getattr(fileobj, "name", "file object"))
    fileobj.seek(0)
    if fileobj.read(len(_HDF5_SIGNATURE)) != _HDF5_SIGNATURE:
        fileobj.close()
        raise StoreFormatError(f"{name} is not an HDF5 file (no HDF5 signature found)")
    fapl = _fapl(read_attempts=SWMR_READ_ATTEMPTS)
    fapl.set_fileobj_driver(h5py.h5fd.fileobj_driver, fileobj)
    try:
        fid = h5py.h5f.open(os.fsencode(name), h5py.h5f.ACC_RDONLY, fapl=fapl)
    except OSError as exc:
        fileobj.close()
        if "superblock version" in str(exc) or "libver" in str(exc):
            raise StoreFormatError(
                f"{name} is an HDF5 file in an older format; it was not written by torchstore"
            ) from exc
        raise StoreFormatError(
            f"{name} cannot be opened as a store (damaged or truncated?): {exc}"
        ) from exc
    f = _FileObjFile(fid)
    f._torchstore_fileobj = fileobj
    _FILEOBJ_FILES.add(f)
    return f


def file_object_of(f: h5py.File) -> Any:
    """The file object ``f`` was opened over (a store opened by URL: its ``RangedFile``), or
    None for a file on disk."""
    return getattr(f, "_torchstore_fileobj", None)


def opened_bytes(f: h5py.File) -> int:
    """The bytes of what ``f`` reads: its file object's (a URL's remote object), or its file's
    on disk."""
    fileobj = file_object_of(f)
    return os.path.getsize(f.filename) if fileobj is None else int(fileobj.size)


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Version 2/3 superblock: signature, version, offset and length sizes, status flags, base
#: address, extension address, end-of-allocation (EOA) address, root group address, checksum.
_SUPERBLOCK = struct.Struct("<8sBBBBQQQQI")


def _raise_stored_eoa_to_eof(path: Path) -> None:
    """Make the superblock's end-of-allocation at least the file's end, before HDF5 opens it.

    A writer killed inside a flush or a close can leave metadata written past the EOA its
    superblock records (the superblock is written last), including metadata the superblock
    itself points to: a close moves the superblock extension's continuation chunk, and a
    kill before the superblock write left it exactly at the recorded EOA. SWMR readers
    read past the EOA, but a read-write open reads that metadata before anything can raise
    the EOA and fails with "addr overflow". This is ``H5Fincrement_filesize(fid, 0)`` (what
    ``h5clear --increment=0`` does) done on the raw superblock, rounded up to whole pages
    (the file grows to match): one 48-byte write inside the first page, so a kill leaves
    either the old superblock or the new one.
    """
    with open(path, "r+b") as f:
        head = f.read(_SUPERBLOCK.size)
        if len(head) < _SUPERBLOCK.size:
            return  # too short for a superblock: HDF5's own open reports it
        sig, version, offsets, lengths, flags, base, ext, eoa, root, stored = _SUPERBLOCK.unpack(
            head
        )
        if sig != _HDF5_SIGNATURE or version not in (2, 3) or (offsets, lengths) != (8, 8):
            return  # not the superblock torchstore writes: HDF5's own open reports it
        if lookup3(head[:-4]) != stored:
            raise StoreFormatError(
                f"{path} cannot be recovered for appending: its superblock fails its checksum"
            )
        eof = os.fstat(f.fileno()).st_size
        # Whole pages: the file's space is paged, so no metadata write crosses a page (and
        # none can be torn by a kill); an EOA inside a page would start allocations there.
        end = -(-max(eoa, eof) // _PAGE_SIZE) * _PAGE_SIZE
        if base != 0 or end == eoa == eof:
            return
        if eof < end:
            os.ftruncate(f.fileno(), end)  # zeros: first, so a kill leaves EOA <= EOF
        body = _SUPERBLOCK.pack(sig, version, offsets, lengths, flags, base, ext, end, root, 0)
        body = body[:-4] + struct.pack("<I", lookup3(body[:-4]))
        os.pwrite(f.fileno(), body, 0)


def _recover_after_kill(path: Path) -> None:
    """Clear the 'open for writing' flags a killed writer left and set EOA = EOF.

    Clearing the flag alone and appending again crashed or corrupted 37 of 314 measured
    crash states (a crash inside a flush leaves metadata beyond the EOA the superblock
    records, and a reopened writer allocates over it). Clearing the flag, raising the EOA
    to the end of the file and skipping the EOF check fixed all of them. h5py has no API
    for this; the library's own properties and ``H5Fincrement_filesize`` do it.

    The recovery open is itself a SWMR-write open: it marks the file "open for SWMR
    writing", the state the killed writer left and the one SWMR readers accept, so a kill
    at any point of the recovery leaves a file readers open and the next resume recovers.
    (A plain read-write open marks it "open for writing", which readers refuse.)
    """
    _raise_stored_eoa_to_eof(path)
    lib = _lib()
    fapl = _fapl(read_attempts=SWMR_READ_ATTEMPTS)
    on = ctypes.c_bool(True)
    # ``null_fsm_addr`` forgets the free-space managers a store created before
    # ``create_in_place`` stopped persisting them saved at its last close: a killed writer
    # may have reused (or half-rewritten) that space, and a read-write open loads them first
    # (1 kill in about 130 inside a resume left one that failed its checksum). Forgetting
    # them costs the free space they tracked, nothing else; newer stores have none.
    for prop in (b"clear_status_flags", b"skip_eof_check", b"null_fsm_addr"):
        if lib.H5Pset(fapl.id, prop, ctypes.byref(on)) < 0:
            raise OSError(
                f"this HDF5 build lacks the '{prop.decode()}' property; run h5clear -s "
                f"--increment=0 {path}"
            )
    try:
        fid = h5py.h5f.open(
            os.fsencode(path), h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE, fapl=fapl
        )
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise StoreFormatError(
            f"{path} cannot be recovered for appending (damaged?): {exc}"
        ) from exc
    try:
        if lib.H5Fincrement_filesize(fid.id, 0) < 0:
            raise StoreFormatError(
                f"{path} cannot be recovered for appending: H5Fincrement_filesize failed"
            )
    finally:
        fid.close()


def _open_swmr_writer(path: Path) -> h5py.File:
    # Opened straight into SWMR-write mode: a file opened plainly for writing and switched
    # to SWMR afterwards is unreadable (status flag set) if the writer dies in between.
    # Metadata read attempts are capped as for readers: HDF5's default retries a damaged
    # object header for minutes before it gives up.
    fapl = _fapl(read_attempts=SWMR_READ_ATTEMPTS)
    return h5py.File(
        _open_waiting_for_lock(path, h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE, fapl)
    )


class _WriterFile(h5py.File):
    """A SWMR writer's file that releases the writer lock it owns when it closes."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            lock, self._torchstore_lock = getattr(self, "_torchstore_lock", None), None
            if lock is not None:
                lock.release()


#: superblock (v2+) file consistency flag: the file is open for SWMR writing
SWMR_WRITE_FLAG = 0x04


def superblock_flags(path: str | os.PathLike) -> int:
    """The file consistency flags of a v2+ superblock (0 when unreadable, not HDF5, or an
    older superblock, which keeps none): non-zero while a writer has the file open."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return 0
    if len(head) < 12 or head[:8] != _HDF5_SIGNATURE or head[8] < 2:
        return 0
    return head[11]


def _left_open_for_writing(path: Path) -> bool:
    """Whether the superblock still says "open for writing" (its writer never closed it)."""
    return superblock_flags(path) != 0


def _open_locked(path: Path) -> h5py.File:
    try:
        return _open_swmr_writer(path)
    except OSError as exc:
        text = str(exc)
        if "unable to lock file" in text or "errno = 11" in text:
            raise StoreLockedError(
                f"{path} is open in another process: a writer that takes no torchstore lock, or "
                "a reader that opened it before any writer did (live readers must open after "
                "the writer)"
            ) from exc
        if "already open for read-only" in text:  # HDF5's list of this process's files
            raise StoreLockedError(
                f"{path} is open for reading in this process (a TrajectoryStore, StoreReader "
                "or h5py.File): close it before writing to the store (readers that follow "
                "a live writer open after it)"
            ) from exc
        known = "already open for" in text or "truncated file" in text
        # A killed writer's metadata past the end-of-allocation the superblock records can
        # also fail its checksum until the recovery raises that end.
        if not known and not _left_open_for_writing(path):
            raise StoreFormatError(f"{path} cannot be opened for appending: {exc}") from exc
    except (RuntimeError, KeyError, ValueError) as exc:
        if not _left_open_for_writing(path):
            raise StoreFormatError(
                f"{path} cannot be opened for appending (damaged?): {exc}"
            ) from exc
    # The caller holds the writer lock, so no live torchstore writer has this file open:
    # "already open for writing" is the mark of a killed one.
    _recover_after_kill(path)
    try:
        return _open_swmr_writer(path)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise StoreFormatError(f"{path} cannot be opened for appending (damaged?): {exc}") from exc


def open_for_append(path: str | os.PathLike, *, lock: WriterLock | None = None) -> h5py.File:
    """Open an existing store as its single SWMR writer, recovering it if its writer was killed.

    Args:
        path: the store file.
        lock: the writer lock the caller already holds for this file (the caller releases
            it). Without one, the lock is taken here and released when the returned file
            closes.

    Raises:
        StoreLockedError: another live process is writing ``path``.
        StoreFormatError: ``path`` is damaged or not a store file.
    """
    path = require_hdf5(path)
    _check_not_abandoned(path)
    if lock is not None:
        return _open_locked(path)
    own = WriterLock.acquire(path)
    try:
        fid = _open_locked(path).id
    except BaseException:
        own.release()
        raise
    f = _WriterFile(fid)
    f._torchstore_lock = own
    return f


#: Files this process gave up after the disk refused a write, by (device, inode), whose
#: close did not complete: held so h5py never frees them, and never opened again here.
_ABANDONED: dict[tuple[int, int], h5py.File] = {}


def abandon(f: h5py.File) -> None:
    """Close ``f`` without writing another byte to its file (after the disk refused a write).

    HDF5 cannot close a file one of whose writes failed: the close writes what the refused
    write left dirty, fails again and leaves the file open in the library, which tries once
    more at exit and shares that state with any later open of the file in this process.
    Pointing the file's descriptor at an in-memory file lets the close finish without
    touching the file, so the file keeps exactly what reached it: what a killed writer
    leaves, which readers open and the next resume recovers (every committed episode
    intact). In-memory files obey a file-size limit too, so the soft limit is lifted to the
    hard one for the moment of that close. A close that still fails is never retried (HDF5
    may have freed part of the file's state: touching it again crashed); the file stays
    held here and this process refuses to reopen it.
    """
    if not f.id.valid:
        return
    handle = f.id.get_vfd_handle()
    st = os.fstat(handle)
    if hasattr(os, "memfd_create"):
        sink = os.memfd_create("torchstore-abandoned")  # takes writes and the extending truncate
    else:
        sink = os.open(os.devnull, os.O_RDWR)  # takes writes only
    try:
        os.dup2(sink, handle)
    finally:
        os.close(sink)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        f.close()
    except Exception:  # noqa: BLE001 - HDF5 kept the file: never touch it again
        pass
    finally:
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    if f.id.valid:
        _ABANDONED[(st.st_dev, st.st_ino)] = f


def _check_not_abandoned(path: Path, key: tuple[int, int] | None = None) -> None:
    if key is None:
        try:
            st = path.stat()
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
    if key in _ABANDONED:
        raise StorageFullError(
            errno.EFBIG,
            f"{path}: this process gave the store up after the disk refused a write, and "
            "HDF5 here cannot let go of it; its committed episodes are intact: open it from "
            "another process",
            str(path),
        )


def fsync_file(f: h5py.File) -> None:
    """Push the file's written pages to the disk (HDF5's flush is not an fsync)."""
    handle = f.id.get_vfd_handle()
    os.fsync(handle)
