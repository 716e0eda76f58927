"""Exact byte spans of one remote object, fetched and cached as they are asked for.

:class:`~torchstore.io.remote.ranged.RangedFile` reads in aligned blocks (1 MiB): right for
h5py's reads, wasteful for a window's. A window's block is a few chunk spans; rounded out
to whole blocks, a short run that touched scattered blocks fetched 1.55x the bytes its
blocks held (a 92 MiB walker store, 600 batches: 13 blocks). :class:`SpanStore` fetches
exactly the bytes asked for that no span it holds covers yet, and keeps what it fetched:

- **Entries.** A fetched span is one cache entry named by its first byte (the cache's
  checksummed, renamed-into-place entries; see :mod:`.chunk_cache`), and the last
  ``memory_bytes`` of them stay in memory. A read is assembled from the entries that cover
  it; only the gaps between them are fetched, adjacent gaps of one call in one request.
- **Shared.** Entries another process (or an earlier run) wrote are found by listing the
  object's cache folder: once when first needed, and again under a gap's lock before
  fetching it, so two processes never fetch the same gap twice.
- An entry that fails its check, or was evicted, is dropped from the index and its bytes
  fetched again, never served.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from torchstore.io.remote.chunk_cache import CachedEntries, ChunkCache

__all__ = ["SpanStore"]

#: Bytes of fetched spans kept in memory by one file object.
MEMORY_BYTES = 64 * 1024 * 1024
_SUFFIX = ".blk"
_TRAILER_BYTES = 16  # an entry's length and xxh3 after its bytes (see chunk_cache)


class SpanStore:
    """Exact spans of one object (see the module's rules).

    Args:
        key: the object version's cache key (:attr:`RemoteObject.key`).
        fetch: ``fetch(spans) -> [bytes, ...]``, verified bytes of each half-open span.
        cache: where entries live; None keeps them in memory only.
        memory_bytes: bytes of spans kept in memory.
    """

    def __init__(
        self,
        key: str,
        fetch: Callable[[Sequence[tuple[int, int]]], list[bytes]],
        cache: ChunkCache | None,
        memory_bytes: int = MEMORY_BYTES,
    ):
        self._fetch = fetch
        # block_bytes 0 names a folder of its own: span entries never meet aligned blocks
        self.entries: CachedEntries | None = None if cache is None else cache.entries(key, 0)
        self.memory_bytes = int(memory_bytes)
        self._memory: OrderedDict[int, bytes] = OrderedDict()  # start -> bytes
        self._held = 0
        self._starts: list[int] = []  # sorted starts of the spans known, memory or cache
        self._stops: dict[int, int] = {}
        self._listed = False
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Let go of the spans held in memory (the cache keeps its entries)."""
        with self._lock:
            self._memory.clear()
            self._held = 0
            self._starts, self._stops, self._listed = [], {}, False

    # ----------------------------------------------------------------- the index
    def _know(self, start: int, stop: int) -> None:
        if self._stops.get(start, -1) >= stop:
            return
        if start not in self._stops:
            bisect.insort(self._starts, start)
        self._stops[start] = stop

    def _forget(self, start: int) -> None:
        if self._stops.pop(start, None) is not None:
            self._starts.pop(bisect.bisect_left(self._starts, start))
        data = self._memory.pop(start, None)
        if data is not None:
            self._held -= len(data)

    def _list(self) -> None:
        """Add the entries in the cache folder (written by any process) to the index."""
        if self.entries is None:
            return
        try:
            scan = list(os.scandir(self.entries.folder))
        except FileNotFoundError:
            return
        for entry in scan:
            name = entry.name
            if name.endswith(_SUFFIX) and name[: -len(_SUFFIX)].isdigit():
                try:
                    size = entry.stat().st_size - _TRAILER_BYTES
                except FileNotFoundError:
                    continue
                if size > 0:
                    start = int(name[: -len(_SUFFIX)])
                    self._know(start, start + size)

    def _cover(self, a: int, z: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """``[a, z)`` as pieces of known spans ``(span start, from, to)`` and the gaps
        between them."""
        pieces, gaps = [], []
        pos = a
        while pos < z:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i >= 0 and self._stops[self._starts[i]] > pos:
                start = self._starts[i]
                end = min(self._stops[start], z)
                pieces.append((start, pos, end))
                pos = end
                continue
            following = self._starts[i + 1] if i + 1 < len(self._starts) else z
            end = min(following, z)
            gaps.append((pos, end))
            pos = end
        return pieces, gaps

    # ----------------------------------------------------------------- reads
    def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each half-open range, fetching only what no known span holds."""
        for _ in range(3):  # an entry evicted or damaged since it was listed: once more
            with self._lock:
                if not self._listed:
                    self._list()
                    self._listed = True
                plans = [self._cover(a, z) for a, z in ranges]
            gaps = sorted({g for _, gs in plans for g in gaps_of(gs)})
            if gaps:
                self._fetch_gaps(gaps)
                with self._lock:
                    plans = [self._cover(a, z) for a, z in ranges]
            out = []
            try:
                for (a, z), (pieces, rest) in zip(ranges, plans, strict=True):
                    if rest:
                        raise _Stale
                    out.append(b"".join(self._piece(*p) for p in pieces) if z > a else b"")
                return out
            except _Stale:
                continue
        raise RuntimeError("span entries kept vanishing while being read (cache evicting?)")

    def _piece(self, start: int, a: int, z: int) -> bytes | memoryview:
        with self._lock:
            data = self._memory.get(start)
            if data is not None:
                self._memory.move_to_end(start)
        if data is None and self.entries is not None:
            data = self.entries.get(start)
            if data is not None:
                self._keep(start, data)
        if data is None or len(data) < z - start:
            with self._lock:
                self._forget(start)
            raise _Stale
        return memoryview(data)[a - start : z - start]

    def _keep(self, start: int, data: bytes) -> None:
        with self._lock:
            old = self._memory.pop(start, None)
            if old is not None:
                self._held -= len(old)
            self._memory[start] = data
            self._held += len(data)
            self._know(start, start + len(data))
            while self._held > self.memory_bytes and len(self._memory) > 1:
                first, dropped = self._memory.popitem(last=False)
                self._held -= len(dropped)
                if self.entries is None:  # held nowhere else now
                    self._forget(first)

    @property
    def known(self) -> int:
        """How many spans are known (in memory or the cache, as last listed)."""
        return len(self._starts)

    def touches(self, a: int, z: int) -> bool:
        """Whether a known span overlaps ``[a, z)``."""
        with self._lock:
            i = bisect.bisect_left(self._starts, z) - 1
            return i >= 0 and self._stops[self._starts[i]] > a

    def held(self, a: int, z: int) -> bytes | memoryview | None:
        """``[a, z)`` if the spans known cover it (from memory or the cache, no fetch);
        None otherwise."""
        with self._lock:
            if not self._starts:
                return None
            pieces, gaps = self._cover(a, z)
        if gaps:
            return None
        try:
            parts = [self._piece(*p) for p in pieces]
        except _Stale:
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _fetch_gaps(self, gaps: list[tuple[int, int]]) -> None:
        """Fetch ``gaps`` (touching ones as one span) and keep each as an entry."""
        spans: list[list[int]] = []
        for a, z in gaps:
            if spans and a <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], z)
            else:
                spans.append([a, z])
        if self.entries is None:
            for (a, _), data in zip(spans, self._fetch([tuple(s) for s in spans]), strict=True):
                self._keep(a, data)
            return
        cache = self.entries.cache
        with cache._stripes(sorted({self.entries._stripe(a) for a, _ in spans})):
            with self._lock:
                self._list()  # what another process fetched while this one waited
                todo = [(ga, gz) for a, z in spans for ga, gz in gaps_of(self._cover(a, z)[1])]
            if not todo:
                return
            for (a, _), data in zip(todo, self._fetch(todo), strict=True):
                self.entries.put(a, data)
                self.entries.fetched += 1
                self._keep(a, data)


def gaps_of(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The non-empty gaps."""
    return [(a, z) for a, z in gaps if z > a]


class _Stale(Exception):
    """A span in the index is no longer where it was (evicted, damaged)."""
