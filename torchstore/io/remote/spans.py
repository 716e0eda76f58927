"""Exact byte spans of one remote object, fetched and cached as they are asked for.

:class:`~torchstore.io.remote.ranged.RangedFile` reads in aligned blocks (1 MiB): right for
h5py's reads, wasteful for a window's. A window's block is a few chunk spans; rounded out
to whole blocks, a short run that touched scattered blocks fetched 1.55x the bytes its
blocks held (a 92 MiB walker store, 600 batches: 13 blocks). :class:`SpanStore` fetches
the bytes asked for that no span it holds covers yet (and the few between gaps it merges),
and keeps what it fetched:

- **Entries.** A fetched span is one cache entry named by its first byte (the cache's
  checksummed, renamed-into-place entries; see :mod:`.chunk_cache`), and the last
  ``memory_bytes`` of them stay in memory. A read is assembled from the entries that cover
  it; only the gaps between them are fetched, gaps of one call within
  :data:`MERGE_GAP_BYTES` of each other in one request.
- **Overlaps.** Spans may overlap (a merged fetch over bytes a smaller entry holds); a
  read takes, at each byte, the known span that reaches farthest past it.
- **One fetch in flight a byte.** A read whose gaps overlap a fetch another thread of this
  process has in flight waits for it and looks again, rather than fetching those bytes too
  (a refill reading a block whose read-ahead was still arriving fetched its chunks a second
  time, one round trip each).
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

from torchstore.io.remote.chunk_cache import TRAILER_BYTES, CachedEntries, ChunkCache

__all__ = ["SpanStore"]

#: Bytes of fetched spans kept in memory by one file object.
MEMORY_BYTES = 64 * 1024 * 1024
#: Gaps this close are fetched as one span, the bytes between them with it. A window's
#: block is its columns' chunks, a few dozen bytes apart in the file (checksum tables lie
#: between them); fetched apart, a 92 MiB walker store's blocks made 455 requests and cache
#: entries of 200 KB each, whose headers, parsing and file creation (Python, holding the GIL)
#: slowed the training thread.
MERGE_GAP_BYTES = 16 * 1024
_SUFFIX = ".blk"


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
        #: _farthest[i]: the start of the span among _starts[: i + 1] that reaches farthest
        #: (kept for a prefix of _starts, extended as reads need it)
        self._farthest: list[int] = []
        #: fetches in flight in this process: (their spans, set when they end)
        self._inflight: list[tuple[list[tuple[int, int]], threading.Event]] = []
        self._listed = False
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Let go of the spans held in memory (the cache keeps its entries)."""
        with self._lock:
            self._memory.clear()
            self._held = 0
            self._starts, self._stops, self._listed = [], {}, False
            self._farthest = []

    # ----------------------------------------------------------------- the index
    def _know(self, start: int, stop: int) -> None:
        if self._stops.get(start, -1) >= stop:
            return
        i = bisect.bisect_left(self._starts, start)
        if start not in self._stops:
            self._starts.insert(i, start)
        self._stops[start] = stop
        del self._farthest[i:]

    def _forget(self, start: int) -> None:
        if self._stops.pop(start, None) is not None:
            i = bisect.bisect_left(self._starts, start)
            self._starts.pop(i)
            del self._farthest[i:]
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
                start = int(name[: -len(_SUFFIX)])
                if start in self._stops:
                    # known already: an entry is never rewritten shorter, so its stop holds.
                    # (A stat each was 26,000 GIL hand-offs in a 3,000-batch cold run that
                    # listed 400 entries 63 times, and slowed the training thread.)
                    continue
                try:
                    size = entry.stat().st_size - TRAILER_BYTES
                except FileNotFoundError:
                    continue
                if size > 0:
                    self._know(start, start + size)

    def _reaching(self, i: int) -> int:
        """The start of the span among the first ``i + 1`` known that reaches farthest."""
        far, starts, stops = self._farthest, self._starts, self._stops
        for k in range(len(far), i + 1):
            start = starts[k]
            far.append(start if not k or stops[start] > stops[far[k - 1]] else far[k - 1])
        return far[i]

    def _cover(self, a: int, z: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """``[a, z)`` as pieces of known spans ``(span start, from, to)`` and the gaps
        between them."""
        pieces, gaps = [], []
        pos = a
        while pos < z:
            i = bisect.bisect_right(self._starts, pos) - 1
            start = self._reaching(i) if i >= 0 else -1
            if i >= 0 and self._stops[start] > pos:
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
    def read(
        self, ranges: Sequence[tuple[int, int]], assemble: bool = True
    ) -> list[bytes | memoryview]:
        """The bytes of each half-open range, fetching only what no known span holds (a
        range inside one span: a view of it). ``assemble=False`` (a read-ahead): the spans
        held in memory, nothing returned."""
        for _ in range(3):  # an entry evicted or damaged since it was listed: once more
            plans, claim = self._plan(ranges)
            if claim:
                try:
                    self._fetch_gaps(claim[0])
                finally:
                    with self._lock:
                        self._inflight.remove(claim)
                    claim[1].set()
                with self._lock:
                    plans = [self._cover(a, z) for a, z in ranges]
            out = []
            try:
                for pieces, rest in plans:  # one a range
                    if rest:
                        raise _Stale
                    parts = [self._piece(*p) for p in pieces]
                    if assemble:
                        out.append(parts[0] if len(parts) == 1 else b"".join(parts))
                return out
            except _Stale:
                continue
        raise RuntimeError("span entries kept vanishing while being read (cache evicting?)")

    def _plan(self, ranges: Sequence[tuple[int, int]]) -> tuple[list, tuple | None]:
        """Each range's pieces and gaps, once no fetch of this process in flight overlaps
        a gap; and the claim ``(spans, event)`` this thread then holds on the gaps' spans
        (merged, see :data:`MERGE_GAP_BYTES`), or None when there are none."""
        while True:
            with self._lock:
                if not self._listed:
                    self._list()
                    self._listed = True
                plans = [self._cover(a, z) for a, z in ranges]
                spans = merge_spans(sorted({g for _, gs in plans for g in gaps_of(gs)}))
                busy = [
                    done
                    for theirs, done in self._inflight
                    if any(a < tz and ta < z for a, z in spans for ta, tz in theirs)
                ]
                if not busy:
                    if not spans:
                        return plans, None
                    claim = (spans, threading.Event())
                    self._inflight.append(claim)
                    return plans, claim
            for done in busy:
                done.wait()

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
            return i >= 0 and self._stops[self._reaching(i)] > a

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

    def _fetch_gaps(self, spans: list[tuple[int, int]]) -> None:
        """Fetch ``spans`` (sorted, disjoint) and keep each as an entry."""
        if self.entries is None:
            for (a, _), data in zip(spans, self._fetch(spans), strict=True):
                self._keep(a, data)
            return
        cache = self.entries.cache
        with cache._stripes(sorted({self.entries._stripe(a) for a, _ in spans})):
            with self._lock:
                self._list()  # what another process fetched while this one waited
                todo = merge_spans(
                    [(ga, gz) for a, z in spans for ga, gz in gaps_of(self._cover(a, z)[1])]
                )
            if not todo:
                return
            for (a, _), data in zip(todo, self._fetch(todo), strict=True):
                self.entries.put(a, data)
                self.entries.fetched += 1
                self._keep(a, data)


def merge_spans(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``gaps`` with those within :data:`MERGE_GAP_BYTES` of each other as one."""
    out: list[list[int]] = []
    for a, z in gaps:
        if out and a - out[-1][1] <= MERGE_GAP_BYTES:
            out[-1][1] = max(out[-1][1], z)
        else:
            out.append([a, z])
    return [(a, z) for a, z in out]


def gaps_of(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The non-empty gaps."""
    return [(a, z) for a, z in gaps if z > a]


class _Stale(Exception):
    """A span in the index is no longer where it was (evicted, damaged)."""
