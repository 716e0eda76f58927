"""A read-only, seekable file object over a remote object, fetched by byte range.

``open_url("https://host/x.h5")`` or ``open_url("hf://datasets/NS/NAME[@REV]/PATH")`` returns
a :class:`RangedFile`: ``read``/``readinto``/``seek``/``tell`` over the object's bytes, so
``h5py.File(ranged, "r")`` opens a store without downloading it. Its rules:

- **One request per range.** Every fetch is ``GET`` with ``Range: bytes=A-B``; the answer
  must be a ``206`` whose ``Content-Range`` is exactly ``A-B`` of the size seen at open, with
  a body of exactly ``B - A + 1`` bytes. A ``200`` where a ``206`` was asked, a wrong range, a
  short or long body, a dropped connection, a timeout, a 5xx or a 429 is retried (with
  backoff, honouring ``Retry-After``) up to ``retries`` more times, then raises one
  :class:`TransferError` naming the URL, the byte range and what was wrong. A server that
  drips bytes is bounded by ``timeout`` plus the time a request takes at 64 KiB/s.
- **Pinned.** Opening reads the size and the ETag (HTTP) or the commit (Hub) once; every
  answer must carry the same ETag and total size, else :class:`RemoteChangedError`: bytes of
  two versions are never mixed. A Hub object is fetched from its commit's URL, so a branch
  that moves on after the open does not change what is read; ``NAME@REVISION`` pins a
  revision from the start.
- **Pages and blocks.** Short reads are served in aligned 16 KiB pages, long ones in
  aligned 1 MiB blocks, through a :class:`~torchstore.io.remote.chunk_cache.ChunkCache`
  when one is given (checksummed entries on disk, shared by processes), plus the last few
  of each in memory (HDF5 reads its metadata a few bytes at a time).
  :meth:`RangedFile.fetch_ranges` fetches a caller's list of ranges, adjacent blocks in
  one request, several requests at once.
- **Exact spans.** :meth:`RangedFile.fetch_spans` (and :meth:`~RangedFile.prefetch_spans`)
  fetch exactly the bytes asked for that no span fetched before covers, cached as spans
  (:mod:`.spans`): a window's blocks, whose chunk spans it knows, fetch no byte past them.
- **Tokens.** HTTP: ``token=`` or ``TORCHSTORE_HTTP_TOKEN`` (sent to the URL's origin only,
  as :class:`~torchstore.io.remote.http.HttpClient` does); Hub: huggingface_hub's token.
  Neither appears in a message, a log line or a ``repr``; URLs are shown without user info
  or query.

Transport plumbing (redirects, origin-only ``Authorization``, retries) is
:class:`~torchstore.io.remote.http.HttpClient`'s; Hub names are resolved through
``huggingface_hub`` (``hf_hub_url``, ``get_hf_file_metadata``, ``HF_ENDPOINT``).
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from torchstore.io.remote.chunk_cache import CachedEntries, ChunkCache
from torchstore.io.remote.range_requests import RangeFetcher, RemoteObject, is_url, locate
from torchstore.io.remote.spans import SpanStore

__all__ = [
    "RemoteObject",
    "RangedFile",
    "is_url",
    "open_url",
    "locate",
    "coalesce",
    "PAGE_BYTES",
    "BLOCK_BYTES",
]

#: The aligned unit of short reads (HDF5's metadata, an episode index's chunks). Measured
#: opening a 10,000-episode, 157 MiB store over loopback HTTP with 20 ms added a request: 33
#: requests at every unit from 16 KiB to 1 MiB (the reads are scattered, one per index
#: chunk), fetching 0.44 % of the file at 16 KiB, 0.76 % at 32 KiB, 1.4 % at 64 KiB, 5.4 %
#: at 256 KiB and 21 % at 1 MiB. So short reads take small pages...
PAGE_BYTES = 16 * 1024
#: ...and long reads (row blocks) 1 MiB blocks, so a cache of 50 GiB holds about 50,000
#: files rather than millions.
BLOCK_BYTES = 1024 * 1024
#: Ranges closer than this are fetched as one request (the gap bytes are cheaper than a
#: round trip at any latency above about 1 ms on a 100 MB/s link).
MAX_GAP_BYTES = 256 * 1024
#: The most bytes one coalesced request asks for.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Requests in flight at once in :meth:`RangedFile.fetch_ranges`.
PARALLEL_REQUESTS = 8
#: Pages and blocks kept in memory by one file object, each (HDF5 reads metadata a few
#: bytes at a time; a slab read follows a few streams, each up to ``_MAX_READAHEAD`` ahead).
_MEMORY_UNITS = 32
#: The most blocks fetched ahead of a stream of sequential long reads (one request of 8 MiB:
#: 42 ms at 200 MB/s, beside a 20 ms round trip), and the streams followed at once.
_MAX_READAHEAD = 8
_STREAMS = 8
#: Prefetches (a window's coming blocks) fetched at once. One at a time, a block of a fast
#: low-dim window (1.9 MB: two requests, 20 ms each plus 10 ms of transfer at 200 MB/s)
#: arrived every 35 ms while the window took one every 25 ms, and its refills waited.
_PREFETCHES = 4

log = logging.getLogger(__name__)


def coalesce(
    ranges: Iterable[tuple[int, int]],
    *,
    max_gap: int = MAX_GAP_BYTES,
    max_request: int = MAX_REQUEST_BYTES,
) -> list[tuple[int, int]]:
    """Half-open ranges merged where they touch, overlap or lie within ``max_gap`` bytes, no
    merged range past ``max_request`` bytes (a single larger range stays whole), sorted.

    Examples:
        >>> coalesce([(100, 200), (0, 50), (60, 90), (5000, 6000)], max_gap=10)
        [(0, 200), (5000, 6000)]
    """
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if out and a - out[-1][1] <= max_gap and max(b, out[-1][1]) - out[-1][0] <= max_request:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


# ----------------------------------------------------------------- the file object
class _Tier:
    """Aligned units of one size: the cache's entries for them and the last few in memory."""

    def __init__(self, unit: int, entries: CachedEntries | None):
        self.unit = unit
        self.entries = entries
        self.memory: OrderedDict[int, bytes] = OrderedDict()


class RangedFile(io.RawIOBase):
    """A read-only, seekable binary file over a remote object (see the module's rules).

    Reads shorter than ``page_bytes * 4`` (HDF5's metadata, an episode index's scattered
    chunks) go through aligned pages of ``page_bytes``; longer reads and
    :meth:`fetch_ranges` through aligned blocks of ``block_bytes``. Both are cached.

    Args:
        fetcher: what :func:`locate` returns (its object's size and version read).
        cache: a :class:`ChunkCache` to read through; None keeps units in memory only.
        page_bytes, block_bytes: the two aligned units of fetching and caching.
        parallel: requests in flight at once in :meth:`fetch_ranges`.
    """

    def __init__(
        self,
        fetcher: RangeFetcher,
        *,
        cache: ChunkCache | None = None,
        page_bytes: int = PAGE_BYTES,
        block_bytes: int = BLOCK_BYTES,
        parallel: int = PARALLEL_REQUESTS,
    ):
        super().__init__()
        if min(page_bytes, block_bytes, parallel) < 1:
            raise ValueError(
                f"page_bytes ({page_bytes}), block_bytes ({block_bytes}) and parallel "
                f"({parallel}) must be >= 1"
            )
        self.obj: RemoteObject = fetcher.obj
        obj = self.obj
        self.parallel = int(parallel)
        self._fetcher = fetcher
        self._page, self._block = (
            _Tier(int(unit), None if cache is None else cache.entries(obj.key, int(unit)))
            for unit in (page_bytes, block_bytes)
        )
        #: exact spans for the window's reads (fetch_spans, prefetch_spans)
        self._spans = SpanStore(obj.key, self._fetch_exact, cache)
        self._memory_lock = threading.Lock()
        self._local = threading.local()  # whether this thread reads for h5py now
        self._pid = os.getpid()
        self._pos = 0
        self._pool: ThreadPoolExecutor | None = None
        self._prefetcher: ThreadPoolExecutor | None = None
        self._streams: OrderedDict[int, int] = OrderedDict()  # last block -> readahead
        #: set by a window reading this file (it fetches its blocks as exact spans): long
        #: reads are exact spans too, short ones pages, none with a stream's read-ahead. A
        #: camera window's first reads (packet tables, before any span was fetched) took
        #: 1 MiB blocks and read-ahead, and 15 % of the bytes it fetched were fetched twice.
        self.exact_reads = False

    def __repr__(self) -> str:
        return f"RangedFile({self.obj.shown!r}, size={self.obj.size})"

    @property
    def name(self) -> str:
        return self.obj.shown

    @property
    def size(self) -> int:
        return self.obj.size

    @property
    def bytes_fetched(self) -> int:
        """Body bytes received from the server by this file object (every attempt)."""
        return self._fetcher.bytes_fetched

    @property
    def requests(self) -> int:
        """Range requests this file object sent (every attempt)."""
        return self._fetcher.requests

    @property
    def cached(self) -> tuple[CachedEntries, ...]:
        """The cache entries read through (pages, blocks); empty without a cache."""
        return tuple(t.entries for t in (self._page, self._block) if t.entries is not None)

    # ----------------------------------------------------------------- io.RawIOBase
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.obj.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        stop = min(self._pos + len(view), self.obj.size)
        if stop <= self._pos:
            return 0
        n = stop - self._pos
        # h5py calls this holding its global lock: the fetches run in this thread, not on
        # the pool (a pool thread that freed an h5py object while this one waited would
        # wait for that lock, and neither would move)
        self._local.in_h5py = True
        try:
            view[:n] = self._view(self._pos, stop)
        finally:
            self._local.in_h5py = False
        self._pos = stop
        return n

    def _one_thread(self) -> bool:
        return getattr(self._local, "in_h5py", False)

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True, cancel_futures=True)
            self._prefetcher = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for tier in (self._page, self._block):
            tier.memory.clear()
        self._spans.clear()
        self._fetcher.close()
        super().close()

    # ----------------------------------------------------------------- reads
    def pread(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` (clipped to the object), through pages or blocks."""
        return bytes(self._view(start, min(stop, self.obj.size)))

    def _view(self, start: int, stop: int) -> memoryview | bytes:
        self._after_fork()
        if stop <= start:
            return b""
        held = self._spans.held(start, stop)  # spans fetched ahead for a window, say
        if held is not None:
            return held
        # a window reading this file fetches what it needs as spans: a long read, or one
        # next to spans it fetched, takes its own bytes exactly (no blocks, no stream's
        # read-ahead past them); the short reads around them (checksums, metadata) pages
        window = self.exact_reads or bool(self._spans.known)
        if window and (stop - start >= self._block.unit or self._spans.touches(start, stop)):
            return self._spans.read([(start, stop)])[0]
        if stop - start < 4 * self._page.unit or window:
            # a block in memory (fetched ahead for the window, say) serves a short read too
            u = self._block.unit
            if start // u == (stop - 1) // u:
                with self._memory_lock:
                    block = self._block.memory.get(start // u)
                if block is not None:
                    at = start - start // u * u
                    return memoryview(block)[at : at + stop - start]
            return self._read(self._page, [(start, stop)])[0]
        return self._read(self._block, [(start, stop)], ahead=self._ahead(start, stop))[0]

    def _ahead(self, start: int, stop: int) -> int:
        """Blocks to fetch past a long read that continues a stream of reads (one column's
        chunks; a slab reads several columns at once, so up to ``_STREAMS`` streams are
        followed): doubling while the stream goes on, up to ``_MAX_READAHEAD``; none for a
        read that continues no stream."""
        u = self._block.unit
        first, last = start // u, (stop - 1) // u
        with self._memory_lock:
            streams = self._streams
            end = next((e for e in (first, first - 1) if e in streams), None)
            ahead = 0 if end is None else min(max(2 * streams.pop(end), 1), _MAX_READAHEAD)
            streams[last] = ahead
            while len(streams) > _STREAMS:
                streams.popitem(last=False)
        return ahead

    def fetch_spans(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | memoryview]:
        """The bytes of each half-open range, fetched exactly (no aligned blocks): what no
        span fetched before covers is fetched, cached as spans (see
        :class:`~torchstore.io.remote.spans.SpanStore`). For reads that know their byte
        spans (a window's chunks), where blocks would fetch past their ends."""
        return self._spans.read(self._checked(ranges))

    def prefetch_spans(self, ranges: Sequence[tuple[int, int]]) -> Future:
        """:meth:`fetch_spans` in the background; returns at once (see :meth:`prefetch`)."""
        return self._background(self._spans.read, self._checked(ranges), False)

    def _checked(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """``ranges`` as ints, each inside the object (in a forked child, after this file
        object forgot its parent's threads, locks and fetches in flight)."""
        self._after_fork()
        ranges = [(int(a), int(z)) for a, z in ranges]
        for a, z in ranges:
            if not 0 <= a <= z <= self.obj.size:
                raise ValueError(
                    f"byte range [{a}, {z}) is outside {self.obj.shown} ({self.obj.size} bytes)"
                )
        return ranges

    def _fetch_all(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """One request a span, up to ``parallel`` at once on the pool (in this thread, one
        after another, inside h5py or for a single span)."""
        if len(spans) == 1 or self._one_thread():
            return [self._fetcher.fetch(*span) for span in spans]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="ts-range")
        return list(self._pool.map(lambda span: self._fetcher.fetch(*span), spans))

    def _fetch_exact(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each span in one request (longer ones split at ``MAX_REQUEST_BYTES``)."""
        step = MAX_REQUEST_BYTES
        parts = [(at, min(at + step, z)) for a, z in spans for at in range(a, z, step)]
        bodies = self._fetch_all(parts)
        out, k = [], 0
        for a, z in spans:
            n = -(-(z - a) // step)
            out.append(bodies[k] if n == 1 else b"".join(bodies[k : k + n]))
            k += n
        return out

    def fetch_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each half-open range, in the order given.

        The blocks they cover are fetched (or taken from the cache) with adjacent blocks
        coalesced into one request each and up to ``parallel`` requests in flight.
        """
        return [bytes(v) for v in self._read(self._block, self._checked(ranges))]

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> Future:
        """Start fetching the blocks ``ranges`` cover, in the background, and return at once
        (the remote counterpart of ``posix_fadvise(WILLNEED)``): they land in the cache (and
        memory), where the read that needs them finds them. A failure is logged and left
        for that read to meet again and raise."""
        return self._background(self._read, self._block, self._checked(ranges))

    def _background(self, read, *args) -> Future:
        """``read(*args)`` on a prefetch thread; a failure is logged and left for the read
        that needs those bytes to meet again and raise."""
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(_PREFETCHES, thread_name_prefix="ts-prefetch")
        return self._prefetcher.submit(self._quietly, read, *args)

    def _quietly(self, read, *args) -> None:
        try:
            read(*args)
        except Exception as exc:  # the read that needs these bytes raises it for real
            log.debug("prefetch of %s failed: %s", self.obj.shown, exc)

    def _read(
        self, tier: _Tier, ranges: Sequence[tuple[int, int]], ahead: int = 0
    ) -> list[memoryview | bytes]:
        """Views of the bytes of each range (no copy for a range inside one unit)."""
        u = tier.unit
        wanted: set[int] = set()
        for a, z in ranges:
            if z > a:
                wanted.update(range(a // u, (z - 1) // u + 1))
        if ahead and wanted and max(wanted) + 1 not in tier.memory:
            # the stream's next block is not here yet: fetch a window of them in one go
            last, end = max(wanted), -(-self.obj.size // u)
            wanted.update(range(last + 1, min(last + 1 + ahead, end)))
        units = self._units(tier, sorted(wanted))
        out = []
        for a, z in ranges:
            if z <= a:
                out.append(b"")
                continue
            first, last = a // u, (z - 1) // u
            if first == last:
                out.append(memoryview(units[first])[a - first * u : z - first * u])
                continue
            data = b"".join(units[i] for i in range(first, last + 1))
            out.append(memoryview(data)[a - first * u : z - first * u])
        return out

    def _after_fork(self) -> None:
        """In a forked child (a ``DataLoader`` worker that inherited this file): a lock of
        its own and no thread pool (the parent's threads do not exist here)."""
        if self._pid != os.getpid():
            self._memory_lock, self._pid = threading.Lock(), os.getpid()
            self._spans._lock = threading.Lock()
            self._spans._inflight = []  # the parent's fetches, not this process's
            self._pool = self._prefetcher = None

    def _units(self, tier: _Tier, indices: Sequence[int]) -> dict[int, bytes]:
        """The units at ``indices``: from memory, the cache, or fetched (and then kept)."""
        self._after_fork()
        out: dict[int, bytes] = {}
        missing = []
        with self._memory_lock:
            for i in indices:
                data = tier.memory.get(i)
                if data is None:
                    missing.append(i)
                else:
                    tier.memory.move_to_end(i)
                    out[i] = data
        if missing:
            fetch = lambda idx: self._fetch_units(tier.unit, idx)  # noqa: E731
            if tier.entries is None:
                fetched = fetch(missing)
            else:
                fetched = tier.entries.get_or_fetch(missing, fetch)
            out.update(fetched)
            with self._memory_lock:
                for i in missing[-_MEMORY_UNITS:]:
                    tier.memory[i] = fetched[i]
                while len(tier.memory) > _MEMORY_UNITS:
                    tier.memory.popitem(last=False)
        return out

    def _fetch_units(self, u: int, indices: Sequence[int]) -> dict[int, bytes]:
        """Fetch whole units: adjacent ones in one request."""
        size = self.obj.size
        spans = coalesce(
            ((i * u, min((i + 1) * u, size)) for i in indices),
            max_gap=0,
            max_request=max(MAX_REQUEST_BYTES, u),
        )
        bodies = self._fetch_all(spans)
        out: dict[int, bytes] = {}
        for (a, z), body in zip(spans, bodies, strict=True):
            for i in range(a // u, (z - 1) // u + 1):
                out[i] = body[i * u - a : min((i + 1) * u, size) - a]
        return {i: out[i] for i in indices}


def open_url(
    url: str,
    *,
    cache: ChunkCache | None | bool = True,
    token: str | None = None,
    timeout: float = 30.0,
    retries: int = 5,
    page_bytes: int = PAGE_BYTES,
    block_bytes: int = BLOCK_BYTES,
) -> RangedFile:
    """A :class:`RangedFile` over ``url``; ``cache=True`` reads through the default
    :class:`ChunkCache` (under ``cache_root()``), a :class:`ChunkCache` through that one,
    ``False``/``None`` through memory only."""
    if not is_url(url):
        raise ValueError(
            f"{url!r} is not a URL this opens (http://, https://, hf://, s3://, gs://)"
        )
    fetcher = locate(url, token=token, timeout=timeout, retries=retries)
    if cache is True:
        cache = ChunkCache()
    return RangedFile(fetcher, cache=cache or None, page_bytes=page_bytes, block_bytes=block_bytes)
