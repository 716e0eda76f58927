"""Encoded camera columns in a store file: frames kept as codec packets, decoded in runs.

An encoded column (a :class:`~torchstore.data.ColumnSpec` with a ``codec``) keeps two
checksummed datasets instead of one:

- ``/columns/<name>``: int64 ``[rows, 4]``, one row per frame, row-aligned with every other
  column: the frame's packet offset and length in ``/packets/<name>``, its flags (bit 0: a
  keyframe, where decoding may start) and, on an episode's first row, the length of the
  codec extradata (stream parameters) stored right before that packet;
- ``/packets/<name>``: the packets' bytes back to back, episode after episode.

Nothing new goes into the commit record: the committed packet bytes are where the last
committed row's packet ends. So a commit covers the packets as it covers every row, a kill
loses only the open episode (resume cuts the packets back to the committed end, as it cuts
the rows), and both datasets are verified block by block on every read and by ``verify``.

Every episode is its own stream, starting on a keyframe with its own extradata: an episode
decodes without any other, and LeRobot MP4 packets (whose extradata is the MP4's ``av1C`` /
``avcC``) are kept exactly as they came. A read of rows ``[start, stop)`` decodes, per
episode it touches, from the keyframe at or before ``start`` (at most ``gop - 1`` frames
decoded and dropped) with one contiguous read of the packet bytes; the readers of the
windowed residency call it on their refill threads, where the decoders release the GIL.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec
from torchstore.data.episodes import EpisodeIndex
from torchstore.data.file.layout import (
    KEYFRAME,
    PACKET_EXTRA,
    PACKET_FLAGS,
    PACKET_NBYTES,
    PACKET_OFFSET,
    committed_packet_bytes,
)
from torchstore.errors import FrameCodecError, IntegrityError
from torchstore.io.frames.codec import EncodedFrames, FrameDecoder, FrameEncoder, StreamInfo
from torchstore.io.frames.resize import FrameResize
from torchstore.io.hdf5.checksummed import ChecksummedDataset

__all__ = [
    "EncodedColumnWriter",
    "MAX_QUEUED_FRAMES",
    "PacketRun",
    "read_packet_runs",
    "decode_packet_runs",
    "committed_packet_bytes",
    "decoder_cache",
    "decode_pool",
    "decode_threads",
    "split_runs",
    "submit_pieces",
    "wait_all",
]

_OFFSET, _NBYTES, _FLAGS, _EXTRA = PACKET_OFFSET, PACKET_NBYTES, PACKET_FLAGS, PACKET_EXTRA

#: Frames a column's encoding thread may have waiting before ``append`` waits for it: a
#: recorder faster than its codec holds this many raw frames (and the chunk in hand) at
#: most, instead of one more per step (the LeRobot writer's bound too). 64 frames of
#: 480x640 RGB are 56 MiB; with no bound, 400 such appends to an AV1 column grew 353 MiB.
MAX_QUEUED_FRAMES = 64


def _stream_info(spec: ColumnSpec, extradata: bytes) -> StreamInfo:
    height, width, channels = spec.shape
    codec = spec.codec
    return StreamInfo(
        width, height, channels, pix_fmt=codec.pix_fmt if codec.is_video else None,
        extradata=extradata,
    )  # fmt: skip


class EncodedColumnWriter:
    """Encodes one column's frames episode by episode and stages its packets and rows.

    Frames arrive by :meth:`append` (``uint8 [n, H, W, C]``, one encoder per episode so
    every episode starts on a keyframe) or as a whole episode of packets that are already
    encoded (:class:`~torchstore.io.frames.codec.EncodedFrames`, kept byte for byte).
    Frames are copied and encoded on a thread of the column's own, in the order they came,
    so ``append`` returns while the codec works: a recorder's env steps on, and the
    columns of several cameras encode at once. At most :data:`MAX_QUEUED_FRAMES` frames
    wait for that thread: an ``append`` that would queue more waits until the codec has
    caught up (a chunk larger than the bound waits for an empty queue), so a recorder
    faster than its codec is slowed to it rather than growing memory by a frame a step.
    :meth:`finish_episode` waits for that
    thread and stages the episode's packet rows and bytes for the writer's commit (an
    encoder error surfaces there, or at the next ``append``); :meth:`discard_episode`
    drops an episode that will not be committed; :meth:`close` ends the thread.
    """

    def __init__(self, spec: ColumnSpec, index: ChecksummedDataset, packets: ChecksummedDataset):
        self.spec = spec
        self.index = index
        self.packets = packets
        self._bytes = 0  # packet bytes appended (staged or written), committed or not
        self._encoder: FrameEncoder | None = None
        self._given: EncodedFrames | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._jobs: deque[tuple[Future, int]] = deque()  # (encoding job, its frames), in order
        self._queued = 0  # frames in ``_jobs``: copied, not yet known to be encoded
        self._failure: BaseException | None = None  # the first error the thread met
        self._frames = 0  # frames handed to the encoder this episode
        self._staged = 0  # rows of a finished episode staged for a commit not yet made

    def start_writing(self, rows: int) -> None:
        """Cut both datasets back to what ``rows`` committed rows hold."""
        self.index.start_writing(rows)
        self._bytes = committed_packet_bytes(self.index, rows)
        if self.packets.data.shape[0] < self._bytes:
            raise IntegrityError(
                f"{self.packets.label} holds {self.packets.data.shape[0]} bytes but the "
                f"committed rows need {self._bytes}; the file is truncated or damaged"
            )
        self.packets.start_writing(self._bytes)
        self.discard_episode()

    @property
    def pending_frames(self) -> int:
        return len(self._given) if self._given is not None else self._frames

    def append(self, value: Any) -> int:
        """Add frames to the open episode; returns how many. ``value``: uint8 frames
        ``[n, H, W, C]`` (checked by the caller) or an ``EncodedFrames`` episode."""
        if isinstance(value, EncodedFrames):
            if self.pending_frames:
                raise FrameCodecError(
                    f"column '{self.spec.name}': encoded packets must be a whole episode, "
                    f"but {self.pending_frames} frames of this episode were already added"
                )
            self._check_given(value)
            self._given = value
            return len(value)
        if self._given is not None:
            raise FrameCodecError(
                f"column '{self.spec.name}': this episode came as encoded packets; "
                "frames cannot be added to it"
            )
        if self._encoder is None:
            height, width, channels = self.spec.shape
            self._encoder = FrameEncoder(
                self.spec.codec, height=height, width=width, channels=channels
            )
        count = len(value)
        self._settle(room=count)  # before the copy: what waits stays within the bound
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="torchstore-encode")
        # a copy: the caller may reuse its frame buffer as soon as append returns
        frames = np.array(value, dtype=np.uint8, copy=True)
        self._jobs.append((self._worker.submit(self._encoder.add, frames), count))
        self._queued += count
        self._frames += count
        return count

    @property
    def queued_frames(self) -> int:
        """Frames copied for the encoding thread and not yet seen encoded (at most
        :data:`MAX_QUEUED_FRAMES`, or one chunk larger than it)."""
        return self._queued

    def _settle(self, *, room: int | None, episode: int | None = None) -> None:
        """Wait until the encoding thread has at most ``MAX_QUEUED_FRAMES - room`` frames
        waiting (``room=None``: none at all), then raise the first error it met, naming the
        column (and ``episode``). The thread encodes in order: the oldest job goes first."""
        limit = 0 if room is None else max(0, MAX_QUEUED_FRAMES - room)
        while self._jobs and (self._queued > limit or self._jobs[0][0].done()):
            job, count = self._jobs.popleft()
            exc = job.exception()  # waits for the job
            self._queued -= count
            if self._failure is None:
                self._failure = exc
        exc = self._failure
        if exc is None:
            return
        if isinstance(exc, FrameCodecError):
            where = f" episode {episode}" if episode is not None else ""
            raise FrameCodecError(f"column '{self.spec.name}'{where}: {exc}", exc.frame) from exc
        raise exc

    def _check_given(self, value: EncodedFrames) -> None:
        codec, spec = value.codec, self.spec
        if codec.kind != spec.codec.kind:
            raise FrameCodecError(
                f"column '{spec.name}' keeps {spec.codec.kind} frames, got {codec.kind} packets"
            )
        if value.info.frame_shape != spec.shape:
            raise FrameCodecError(
                f"column '{spec.name}' frames are {list(spec.shape)}, the packets' stream is "
                f"{list(value.info.frame_shape)}"
            )
        if codec.is_video and value.info.pix_fmt not in (None, spec.codec.pix_fmt):
            raise FrameCodecError(
                f"column '{spec.name}' keeps {spec.codec.pix_fmt} video, the packets' stream is "
                f"{value.info.pix_fmt}"
            )
        empty = [i for i, p in enumerate(value.packets) if not len(p)]
        if empty:
            raise FrameCodecError(
                f"column '{spec.name}': the packet of frame {empty[0]} is empty", empty[0]
            )
        keys = np.asarray(value.keyframes, dtype=bool)
        if keys.shape != (len(value.packets),) or not len(keys) or not keys[0]:
            raise FrameCodecError(
                f"column '{spec.name}': an episode's packets need one keyframe flag each and "
                "must start on a keyframe",
                0,
            )

    def finish_episode(self, rows: int, episode: int) -> None:
        """Stage the open episode (which must hold ``rows`` frames) for the next commit.

        Called again before :meth:`committed` (the commit was refused for room, and is
        tried again), it keeps what it staged."""
        if self._staged == rows and self._encoder is None and self._given is None:
            return
        if self._given is not None:
            encoded = self._given
        elif self._encoder is not None:
            self._settle(room=None, episode=episode)
            try:
                encoded = self._encoder.finish()
            except FrameCodecError as exc:
                raise FrameCodecError(
                    f"column '{self.spec.name}' episode {episode}: {exc}", exc.frame
                ) from exc
        else:
            encoded = None
        self._encoder, self._given, self._frames = None, None, 0
        count = 0 if encoded is None else len(encoded.packets)
        if count != rows:
            raise FrameCodecError(
                f"column '{self.spec.name}' episode {episode} has {count} frames, the episode "
                f"has {rows} rows"
            )
        extradata = encoded.info.extradata
        sizes = np.fromiter((len(p) for p in encoded.packets), dtype=np.int64, count=rows)
        table = np.zeros((rows, 4), dtype=np.int64)
        table[:, _NBYTES] = sizes
        table[:, _OFFSET] = (
            self._bytes + len(extradata) + np.concatenate([[0], np.cumsum(sizes)[:-1]])
        )
        table[:, _FLAGS] = np.where(np.asarray(encoded.keyframes, dtype=bool), KEYFRAME, 0)
        table[0, _EXTRA] = len(extradata)
        blob = b"".join([extradata, *encoded.packets])
        self.packets.append(np.frombuffer(blob, dtype=np.uint8))
        self.index.append(table)
        self._bytes += len(blob)
        self._staged = rows

    def committed(self) -> None:
        """The writer committed what was staged."""
        self._staged = 0

    def discard_episode(self) -> None:
        self._staged = 0
        for job, _ in self._jobs:  # let the thread finish what it was given, then forget it
            job.exception()
        self._jobs.clear()
        self._queued, self._failure = 0, None
        self._encoder, self._given, self._frames = None, None, 0

    def close(self) -> None:
        """Drop the open episode and end the encoding thread."""
        self.discard_episode()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None


@dataclass(frozen=True, slots=True)
class PacketRun:
    """What decoding one episode's part of a read needs, read from the file (verified):
    the packets from the keyframe at or before the part, the episode's extradata, and where
    the frames go: rows ``[at, at + count)`` of the read, after dropping ``first`` decoded
    frames. ``frame_base``: the frame number of ``packets[0]`` in episode ``episode``."""

    episode: int
    extradata: bytes
    packets: list[memoryview]
    first: int
    frame_base: int
    at: int
    count: int
    #: which of ``packets`` are keyframes (a decoder may start at any of them)
    keys: np.ndarray | None = None

    def split(self, min_frames: int = 1) -> list[PacketRun]:
        """This run cut at its keyframes after ``first``: runs that decode independently,
        so several threads can share one long run. Each piece holds at least
        ``min_frames`` packets where the keyframes allow (a piece is a task and a decoder
        flush: at LeRobot's GOP 2, one per GOP would be one per two frames); 1 cuts at
        every keyframe."""
        if self.keys is None:
            return [self]
        cuts, last = [], 0
        for k in np.flatnonzero(self.keys).tolist():
            if k > self.first and k - last >= min_frames and len(self.packets) - k >= min_frames:
                cuts.append(k)
                last = k
        if not cuts:
            return [self]
        pieces, start, first = [], 0, self.first
        for end in [*cuts, len(self.packets)]:
            out_at = self.at + max(0, start - self.first)
            pieces.append(
                PacketRun(
                    self.episode, self.extradata, self.packets[start:end], first,
                    self.frame_base + start, out_at, end - start - first,
                )
            )  # fmt: skip
            start, first = end, 0
        return pieces


def read_packet_runs(
    spec: ColumnSpec,
    index: ChecksummedDataset,
    packets: ChecksummedDataset,
    episodes: EpisodeIndex,
    start: int,
    stop: int,
    rows: int,
    latest: Callable[[], int] | None = None,
    *,
    packet_bytes: int | None = None,
) -> list[PacketRun]:
    """The packet runs that decode rows ``[start, stop)`` of an encoded column (``rows``
    committed): one read of the packet rows from the start of the first episode the range
    touches, and one contiguous read of the packet bytes from the keyframe at or before
    ``start`` (episodes' packets lie back to back). The file is read here;
    :func:`decode_packet_runs` does not touch it, so a caller sharing the file's handle
    holds its lock for this part only. ``packet_bytes``: :func:`committed_packet_bytes`
    for ``rows``, when the caller keeps it. ``latest`` re-reads the committed rows: with
    it, a block a live writer is rewriting is read again until it verifies (see
    :class:`~torchstore.io.hdf5.checksummed.ChecksummedDataset`), never reported for that."""
    if start == stop:
        return []
    if packet_bytes is None:
        packet_bytes = committed_packet_bytes(index, rows, latest)
    latest_bytes = None
    if latest is not None:  # a live writer moved the commit on: where its packets end now

        def latest_bytes() -> int:
            rows_now = latest()
            index.refresh()  # the rows it counts may lie past this handle's extent
            return committed_packet_bytes(index, rows_now, latest)

    first, last = int(episodes.episode_of(start)), int(episodes.episode_of(stop - 1))
    base = episodes.range(first)[0]
    table = index.read(base, stop, rows, latest)
    parts = [
        _episode_part(spec, ep, table, base, start, stop, episodes) for ep in range(first, last + 1)
    ]
    lo, hi = parts[0].lo, parts[-1].hi
    if any(p.lo < lo or p.hi > hi for p in parts) or hi > packet_bytes:
        raise IntegrityError(
            f"column '{spec.name}' episodes {first}..{last}: packet offsets outside the "
            f"{packet_bytes} committed packet bytes; their packet rows are damaged"
        )
    view = memoryview(packets.read(lo, hi, packet_bytes, latest_bytes))
    runs = []
    for p in parts:
        if p.head >= lo:
            extradata = view[p.head - lo : p.head - lo + p.extra].tobytes()
        else:  # the run starts at a later keyframe: its extradata lies before the read
            extradata = packets.read(p.head, p.head + p.extra, packet_bytes, latest_bytes).tobytes()
        run = p.run
        at = run[:, _OFFSET] - lo
        run_packets = [
            view[int(o) : int(o) + int(n)] for o, n in zip(at, run[:, _NBYTES], strict=True)
        ]
        keys = (run[:, _FLAGS] & KEYFRAME) != 0
        runs.append(
            PacketRun(
                p.episode,
                extradata,
                run_packets,
                p.a - p.ep_start - p.key,
                p.key,
                p.a - start,
                p.z - p.a,
                keys,
            )
        )
    return runs


@dataclass(frozen=True, slots=True)
class _EpisodePart:
    """One episode's rows ``[a, z)`` of a read, and where its packets lie: ``run`` is its
    packet rows from keyframe ``key`` (of the episode) to ``z``, whose bytes span ``[lo, hi)``
    of the packets; its ``extra`` bytes of extradata start at ``head``."""

    episode: int
    ep_start: int
    a: int
    z: int
    key: int
    run: np.ndarray
    extra: int
    head: int
    lo: int
    hi: int


def _episode_part(
    spec: ColumnSpec,
    ep: int,
    table: np.ndarray,
    base: int,
    start: int,
    stop: int,
    episodes: EpisodeIndex,
) -> _EpisodePart:
    """Episode ``ep``'s part of a read of rows ``[start, stop)`` from its packet rows
    (``table``: the rows from ``base``), checked: IntegrityError if they are damaged."""
    ep_start, ep_stop = episodes.range(ep)
    a, z = max(start, ep_start), min(stop, ep_stop)
    rows = table[ep_start - base : z - base]
    keys = np.flatnonzero(rows[: a - ep_start + 1, _FLAGS] & KEYFRAME)
    if not len(keys) or keys[0] != 0:
        raise IntegrityError(
            f"column '{spec.name}' episode {ep} does not start on a keyframe; its packet "
            "rows are damaged"
        )
    key = int(keys[-1])
    run = rows[key:]
    extra = int(rows[0, _EXTRA])
    head = int(rows[0, _OFFSET]) - extra  # the episode's extradata starts here
    lo = head if key == 0 else int(run[0, _OFFSET])
    hi = int(run[-1, _OFFSET] + run[-1, _NBYTES])
    rel = run[:, _OFFSET] - lo
    if (
        extra < 0
        or head < 0
        or lo < 0
        or (run[:, _NBYTES] <= 0).any()
        or (rel < 0).any()
        or (rel + run[:, _NBYTES] > hi - lo).any()
    ):
        raise IntegrityError(
            f"column '{spec.name}' episode {ep}: packet offsets outside its packet bytes; "
            "its packet rows are damaged"
        )
    return _EpisodePart(ep, ep_start, a, z, key, run, extra, head, lo, hi)


def decode_packet_runs(
    spec: ColumnSpec,
    runs: Sequence[PacketRun],
    out: np.ndarray,
    decoders: dict | None = None,
    *,
    threads: int = 1,
    resize: FrameResize | None = None,
    decode_device: str = "cpu",
) -> np.ndarray:
    """Decode ``runs`` (from :func:`read_packet_runs`) into ``out`` (``uint8 [n, H, W, C]``
    for the ``n`` rows read; ``[n, *resize.shape(...)]`` with a ``resize``, applied as each
    frame is decoded). ``decoders``: a dict that keeps one decoder per stream,
    reused from call to call by one thread. ``threads`` > 1 cuts the runs at their
    keyframes and decodes the pieces on that many threads at once (the decoders release
    the GIL). ``decode_device``: ``"cuda"`` decodes video on the GPU's decoder where there
    is one (see :mod:`torchstore.io.frames.decode_device`). FrameCodecError names column,
    episode, frame."""
    pieces = split_runs(runs, threads) if threads > 1 else list(runs)
    if threads > 1 and len(pieces) > 1:
        wait_all(submit_pieces(spec, pieces, out, threads, resize, decode_device))
        return out
    for piece in pieces:
        _decode_piece(spec, piece, out, decoders, resize, decode_device)
    return out


#: pieces a decode thread gets of a read, about: the slowest piece ends a read, so more and
#: smaller pieces even out the threads' shares; fewer and longer ones cost fewer tasks and
#: decoder flushes. Measured on a window over 480x640 + 224x224 AV1 at GOP 2, reuse 1, 2
#: cores, blocks of one 150-frame episode (rows/s, then rows per CPU-second): 4: 379/367,
#: 245/241 (the cores 1.55 busy); 8: 367/369; 16: 397/398; 32: 434/402, 237/220 (1.84
#: busy); a piece per GOP: 368/384, 199/208 (1.85 busy)
PIECES_PER_THREAD = 32


def split_runs(
    runs: Sequence[PacketRun],
    threads: int,
    frames: int | None = None,
    pieces_per_thread: int | None = None,
) -> list[PacketRun]:
    """``runs`` cut at keyframes into pieces for ``threads`` decode threads: about
    ``pieces_per_thread`` (default :data:`PIECES_PER_THREAD`) a thread over ``frames``
    (the runs' own frames by default; a read of several columns passes all of theirs),
    none shorter than it needs to be."""
    if frames is None:
        frames = sum(len(r.packets) for r in runs)
    per_thread = PIECES_PER_THREAD if pieces_per_thread is None else pieces_per_thread
    min_frames = max(1, frames // max(1, threads * per_thread))
    return [piece for run in runs for piece in run.split(min_frames)]


def submit_pieces(
    spec: ColumnSpec,
    pieces: Sequence[PacketRun],
    out: np.ndarray,
    threads: int,
    resize: FrameResize | None = None,
    decode_device: str = "cpu",
) -> list[Future]:
    """Start decoding ``pieces`` (runs cut at keyframes, :meth:`PacketRun.split`) into
    ``out`` on the process's decode threads (at least ``threads`` of them); the caller
    waits with :func:`wait_all`. Several columns' pieces submitted before one wait keep
    every thread busy across the columns of a block (no column waits for the previous
    one's last piece)."""
    pool = decode_pool(threads)
    return [pool.submit(_decode_piece, spec, p, out, None, resize, decode_device) for p in pieces]


def wait_all(jobs: Sequence[Future]) -> None:
    """Wait for every job, then raise the first error among them (no job is left running
    when an error is raised: each writes into memory its caller owns)."""
    for job in jobs:
        job.exception()
    for job in jobs:
        job.result()


def _decode_piece(
    spec: ColumnSpec,
    r: PacketRun,
    out: np.ndarray,
    decoders: dict | None,
    resize: FrameResize | None = None,
    decode_device: str = "cpu",
) -> None:
    if decoders is None:  # a pool thread: its own decoders, kept between calls
        decoders = getattr(_POOL_LOCAL, "decoders", None)
        if decoders is None:
            decoders = _POOL_LOCAL.decoders = decoder_cache()
    decoder = _decoder(spec, r.extradata, decoders, resize, decode_device)
    try:
        decoder.decode(r.packets, out[r.at : r.at + r.count], r.first, frame_base=r.frame_base)
    except FrameCodecError as exc:
        raise FrameCodecError(
            f"column '{spec.name}' episode {r.episode}: {exc}", exc.frame
        ) from exc


#: The threads that decode pieces of runs in parallel (one pool per process: a forked
#: child makes its own, as the parent's threads do not exist in it).
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()
_POOL_LOCAL = threading.local()


def decode_pool(threads: int) -> ThreadPoolExecutor:
    """The process's decode threads, at least ``threads`` of them."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < threads:
            _POOL = (
                os.getpid(),
                threads,
                ThreadPoolExecutor(threads, thread_name_prefix="torchstore-decode"),
            )
        return _POOL[2]


def decode_threads() -> int:
    """Threads a refill decodes on: the cores this process may use (a decode-bound window
    keeps the training thread waiting, so it takes no core of its own: on 2 cores, 2
    threads gave 1.7x the batches/s of 1); ``TORCHSTORE_DECODE_THREADS`` overrides."""
    text = os.environ.get("TORCHSTORE_DECODE_THREADS")
    if text:
        try:
            return max(1, int(text))
        except ValueError:
            pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores)


class DecoderCache(dict):
    """One thread's decoders, by stream (see :func:`decoder_cache`)."""


#: Every decoder cache of this process. A forked child frees the thread-local storage of
#: the parent's other threads, and freeing an FFmpeg context there waits forever on its
#: slice threads, which the child does not have (a fork after a window had decoded hung in
#: ``sws_freeContext``). So before a fork every cached decoder is moved here, where the
#: child keeps it referenced (never freed; the parent lets go of it after the fork).
_CACHES: weakref.WeakValueDictionary[int, DecoderCache] = weakref.WeakValueDictionary()
_PARKED: list[FrameDecoder] = []


def decoder_cache() -> DecoderCache:
    """A new decoder cache for one thread, emptied before every fork (see ``_CACHES``)."""
    cache = DecoderCache()
    _CACHES[id(cache)] = cache
    return cache


def _park_decoders() -> None:
    for cache in list(_CACHES.values()):
        _PARKED.extend(cache.values())
        cache.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_park_decoders, after_in_parent=_PARKED.clear)
    # no thread holds the pool's lock while the process is copied (a child would wait on it)
    os.register_at_fork(
        before=_POOL_LOCK.acquire,
        after_in_parent=_POOL_LOCK.release,
        after_in_child=_POOL_LOCK.release,
    )


def _decoder(
    spec: ColumnSpec,
    extradata: bytes,
    cache: dict | None,
    resize: FrameResize | None = None,
    device: str = "cpu",
) -> FrameDecoder:
    info = _stream_info(spec, extradata)
    if cache is None:
        return FrameDecoder(spec.codec, info, resize=resize, device=device)
    key = (spec.name, spec.codec, extradata, resize, device)
    decoder = cache.get(key)
    if decoder is None:
        if len(cache) >= 16:
            cache.clear()
        decoder = cache[key] = FrameDecoder(spec.codec, info, resize=resize, device=device)
    return decoder
