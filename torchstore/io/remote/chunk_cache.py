"""A bounded local cache of byte ranges fetched from remote objects, shared by processes.

Layout under ``folder`` (by default ``cache_root()/ranges``)::

    <digest>/source.txt     the object's URL (token-free), version and size, for people
    <digest>/<block>.blk    one aligned block: its bytes, then 8 bytes of length and the
                            8-byte xxh3-64 of the bytes (little-endian)
    locks/<stripe>.lock     ``flock`` stripes; a block's fetch holds its stripe

``<digest>`` is a BLAKE2b of the object's URL, version (ETag or Hub commit), size and the
block size, so a changed object or another block size never meets an old entry.

Rules:

- **Crash-safe.** An entry is written to a temporary name and renamed into place, so a
  killed writer leaves a ``.tmp`` file that is never read (and is removed by a later
  eviction). Every read checks the entry's length and xxh3; one that fails is deleted and
  fetched again, never served.
- **No duplicate fetch.** A process that misses takes the exclusive ``flock`` of each
  missing block's stripe (in stripe order, so two processes never deadlock), looks again,
  and fetches only what is still missing; one waiting on the stripe finds the entry there
  when it gets the lock. ``flock`` is per open file, so threads of one process exclude each
  other the same way; the kernel releases the locks of a killed process.
- **Bounded.** ``budget`` bytes (an int, or ``"50GiB"``/``"500MB"``; by default 10 % of the
  disk that holds the cache, measured once with ``shutil.disk_usage``). A read touches the
  entry's mtime; when this process's count of the cache's bytes passes the budget, it scans
  the cache and deletes the least recently used entries down to 90 % of it. The count is
  refreshed by a scan every ``budget / 8`` bytes written, so several processes writing
  together overrun the budget by at most about that much each.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import xxhash

from torchstore.errors import ArgumentError, CacheNotWritableError
from torchstore.io.cache_root import cache_root
from torchstore.validation import size_string_bytes

__all__ = ["ChunkCache", "CachedEntries", "parse_size", "DEFAULT_DISK_FRACTION"]

#: The share of the cache's disk a cache with no budget given may fill.
DEFAULT_DISK_FRACTION = 0.10
#: Lock stripes: two blocks contend only when they share one (1 in 256).
_STRIPES = 256
#: Eviction deletes down to this share of the budget, so it does not run at every write.
_LOW_WATER = 0.9
#: A temporary entry older than this was left by a killed writer; eviction removes it.
_STALE_TMP_S = 3600.0
_TRAILER = struct.Struct("<Q8s")
#: Bytes after an entry's data: its length and xxh3.
TRAILER_BYTES = _TRAILER.size


def parse_size(value: int | str, what: str = "cache") -> int:
    """Bytes from an int or a size string (``"50GiB"``, ``"500MB"``, ``"1_000_000"``).

    Examples:
        >>> parse_size("2KiB"), parse_size(512)
        (2048, 512)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str):
        size = size_string_bytes(value)
        if size is not None:
            return size
    raise ArgumentError(
        f"{what} ({value!r}) must be a byte count >= 1 or a size like '50GiB' or '500MB'"
    )


def _trailer(data: bytes) -> bytes:
    return _TRAILER.pack(len(data), xxhash.xxh3_64_digest(data))


def _decode(raw: bytes) -> memoryview | None:
    """The block's bytes (a view of ``raw``, not a copy) if the entry is whole and matches
    its checksum, else None."""
    if len(raw) < _TRAILER.size:
        return None
    data = memoryview(raw)[: -_TRAILER.size]
    length, digest = _TRAILER.unpack(raw[-_TRAILER.size :])
    if length != len(data) or digest != xxhash.xxh3_64_digest(data):
        return None
    return data


def _write_all(fd: int, parts: list) -> None:
    """Write ``parts`` to ``fd`` whole (``writev``, again after a short write)."""
    parts = [memoryview(p).cast("B") for p in parts]
    while parts:
        n = os.writev(fd, parts)
        if not n:
            left = sum(map(len, parts))
            raise OSError(f"writing a cache entry wrote nothing ({left} bytes left)")
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if parts and n:
            parts[0] = parts[0][n:]


class ChunkCache:
    """The cache folder and its byte budget (see the module's rules).

    Args:
        folder: where entries live; ``cache_root()/ranges`` by default.
        budget: bytes, or a size string; by default 10 % of the disk's free space plus
            what the cache already holds.

    Examples:
        >>> cache = ChunkCache("/tmp/ranges", budget="1GiB")  # doctest: +SKIP
    """

    def __init__(self, folder: str | os.PathLike | None = None, budget: int | str | None = None):
        self.folder = Path(folder) if folder is not None else cache_root() / "ranges"
        try:
            (self.folder / "locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheNotWritableError(
                f"the range cache folder {self.folder} cannot be created ({exc.strerror}); "
                "set TORCHSTORE_CACHE to a writable folder"
            ) from exc
        self._given_budget = budget
        self._budget = None if budget is None else parse_size(budget, "cache budget")
        self._used: int | None = None  # this process's count of the cache's bytes
        self._written_since_scan = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChunkCache({str(self.folder)!r}, budget={self.budget})"

    def __reduce__(self) -> tuple:
        """Pickles as its folder and the budget it was given (a store opened through it
        reopens in a ``DataLoader`` worker through the same folder and budget)."""
        return (type(self), (str(self.folder), self._given_budget))

    @property
    def budget(self) -> int:
        if self._budget is None:
            free = shutil.disk_usage(self.folder).free
            self._budget = max(1, int((free + self.usage()) * DEFAULT_DISK_FRACTION))
        return self._budget

    def entries(self, key: str, block_bytes: int) -> CachedEntries:
        """The blocks of one object version (``key``) at ``block_bytes`` each."""
        return CachedEntries(self, key, block_bytes)

    # ----------------------------------------------------------------- accounting
    def _scan(self) -> list[tuple[float, int, Path]]:
        """``(mtime, size, path)`` of every entry; stale temporary files are removed."""
        out = []
        now = time.time()
        for sub in self.folder.iterdir():
            if not sub.is_dir() or sub.name == "locks":
                continue
            with contextlib.suppress(FileNotFoundError):
                for item in os.scandir(sub):
                    try:
                        st = item.stat()
                    except FileNotFoundError:
                        continue
                    if item.name.endswith(".blk"):
                        out.append((st.st_mtime, st.st_size, Path(item.path)))
                    elif item.name.endswith(".tmp") and now - st.st_mtime > _STALE_TMP_S:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(item.path)
        return out

    def usage(self) -> int:
        """Bytes the cache's entries hold now (every process's)."""
        return sum(size for _, size, _ in self._scan())

    def _added(self, nbytes: int) -> None:
        with self._lock:
            if self._used is None or self._written_since_scan > self.budget // 8:
                self._used, self._written_since_scan = self.usage(), 0
            else:
                self._used += nbytes
                self._written_since_scan += nbytes
            over = self._used > self.budget
        if over:
            self.evict()

    def evict(self) -> int:
        """Delete least recently used entries down to 90 % of the budget; bytes freed.

        One process evicts at a time; a process that finds another evicting skips.
        """
        with self._flock(self.folder / "locks" / "evict.lock", blocking=False) as held:
            if not held:
                return 0
            entries = sorted(self._scan())
            total = sum(size for _, size, _ in entries)
            target, freed = int(self.budget * _LOW_WATER), 0
            for _, size, path in entries:
                if total - freed <= target:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    freed += size
            with self._lock:
                self._used, self._written_since_scan = total - freed, 0
            return freed

    # ----------------------------------------------------------------- locks
    @contextlib.contextmanager
    def _flock(self, path: Path, *, blocking: bool = True) -> Iterator[bool]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    @contextlib.contextmanager
    def _stripes(self, stripes: Sequence[int]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for stripe in sorted(set(stripes)):
                stack.enter_context(self._flock(self.folder / "locks" / f"{stripe:03d}.lock"))
            yield


class CachedEntries:
    """The cached blocks of one object version; counts ``hits`` and ``fetched`` blocks."""

    def __init__(self, cache: ChunkCache, key: str, block_bytes: int):
        self.cache = cache
        self.block_bytes = block_bytes
        self.digest = hashlib.blake2b(f"{key}\n{block_bytes}".encode(), digest_size=16).hexdigest()
        self.folder = cache.folder / self.digest
        self.hits = self.fetched = self.dropped = 0
        try:
            self.folder.mkdir(exist_ok=True)
            source = self.folder / "source.txt"
            if not source.exists():
                source.write_text(f"{key}\nblock bytes: {block_bytes}\n")
        except OSError as exc:
            raise CacheNotWritableError(
                f"the range cache folder {self.folder} cannot be written ({exc.strerror}); "
                "set TORCHSTORE_CACHE to a writable folder"
            ) from exc

    def _path(self, index: int) -> Path:
        return self.folder / f"{index}.blk"

    def _stripe(self, index: int) -> int:
        return zlib.crc32(f"{self.digest}:{index}".encode()) % _STRIPES

    def get(self, index: int) -> memoryview | None:
        """Block ``index`` if cached whole and checked (a view of the entry's bytes read
        from disk); a damaged entry is deleted."""
        path = self._path(index)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        data = _decode(raw)
        if data is None:
            self.dropped += 1
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # the LRU clock
        return data

    def put(self, index: int, data: bytes) -> None:
        """Write block ``index``: to a temporary name, then renamed into place."""
        path = self._path(index)
        tmp = path.with_name(f".{index}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # the bytes and their trailer in one write, without joining them first (a copy)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, [memoryview(data), _trailer(data)])
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        self.cache._added(len(data) + _TRAILER.size)

    def get_or_fetch(
        self, indices: Sequence[int], fetch: Callable[[Sequence[int]], dict[int, bytes]]
    ) -> dict[int, bytes]:
        """Blocks ``indices``: cached ones read, the rest fetched once (under their stripes'
        locks, so another process fetching them at the same time waits and reads them)."""
        out: dict[int, bytes] = {}
        missing = []
        for i in indices:
            data = self.get(i)
            if data is None:
                missing.append(i)
            else:
                out[i] = data
        if not missing:
            self.hits += len(out)
            return out
        with self.cache._stripes([self._stripe(i) for i in missing]):
            still = []
            for i in missing:
                data = self.get(i)
                if data is None:
                    still.append(i)
                else:
                    out[i] = data
            if still:
                fetched = fetch(still)
                for i in still:
                    self.put(i, fetched[i])
                    out[i] = fetched[i]
        self.hits += len(indices) - len(still)
        self.fetched += len(still)
        return out
