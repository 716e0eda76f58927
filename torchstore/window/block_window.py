"""``K`` resident blocks of a store larger than memory, moved by the refill schedule.

:class:`BlockWindow` is the runtime of :mod:`torchstore.samplers.refill`: it reads blocks
of the store (the chunks of each column, read by :mod:`~torchstore.data.residency.block_read`
with the GIL released and verified chunk by chunk) on a background thread into
:class:`~torchstore.data.rows.packed.PackedColumns` slots and draws rows or windows from the
active ones. What the DataModules' ``resident=`` budgets and
:class:`~torchstore.window.window_storage.WindowStorage` sample.

Across a process boundary a window travels as its recipe, never as its live state: pickled
(a spawned ``DataLoader`` worker, a ``multiprocessing`` child) it is the store's path, the
budget, the seed and the schedule's position, and the other side opens the store, its slots
and its refill thread itself (sharing the slots would let two processes refill one
memory). A fork copies the process instead: a handler registered with
``os.register_at_fork`` holds every window's file lock while the process is copied (no
refill thread is then inside an h5py call), and in the child gives each window a thread
pool of its own, forgets the reads in flight and the resident blocks, and reads the
position's blocks again at the first batch; the child draws the batches the parent would
have drawn next.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchstore.data.residency.block_read import MAX_READ_BYTES, ChunkReader
from torchstore.data.rows.packed import PackedColumns
from torchstore.errors import ResidencyError, RowIndexError
from torchstore.io.frames.resize import frame_resizes
from torchstore.samplers.draws import importance_weight
from torchstore.samplers.philox import cpu_kernels
from torchstore.samplers.refill import RefillSchedule, cut_blocks, parse_budget
from torchstore.samplers.sumtree import SumTree
from torchstore.samplers.windows import RowSet, choose_windows, window_counts
from torchstore.validation import positive_int

if TYPE_CHECKING:
    from torchstore.data.store.store import TrajectoryStore

__all__ = ["BlockWindow"]

#: uniform draws mapped to packed positions and store rows at once (see BlockWindow._lookup)
_AHEAD = 1 << 12


def _buffer_bytes(kind: str, amount: int, row_bytes: int, k: int, chunk_bytes: int) -> int:
    """The refill read buffer a budget affords: about an eighth of a slot, at most
    ``MAX_READ_BYTES``, and at least one chunk while that is at most a quarter of a slot
    (a budget of a few MiB still reads with the GIL released); 0 (reads through the
    store, h5py holding the GIL) only below that."""
    total = amount * row_bytes if kind == "rows" else amount
    size = min(MAX_READ_BYTES, total // (8 * (k + 1)))
    if chunk_bytes and size < chunk_bytes <= total // (4 * (k + 1)):
        size = chunk_bytes
    return size if chunk_bytes and size >= chunk_bytes else 0


def _budget_rows(kind: str, amount: int, row_bytes: int, buffer: int, tree_item: int | None) -> int:
    """Slot rows of a budget. A budget in bytes holds every resident byte the window adds:
    its ``K + 1`` slots, the read ``buffer`` and, prioritized, the window's two trees (two
    nodes per leaf each, a power of two of leaves); a budget in rows counts slot rows."""
    if kind == "rows":
        return amount
    room = amount - buffer
    tree = 0 if tree_item is None else 4 * tree_item
    rows = room // (row_bytes + tree)
    leaves = lambda n: 1 << max(n - 1, 0).bit_length()  # noqa: E731
    while rows > 0 and rows * row_bytes + tree * leaves(rows) > room:
        rows = max(0, (room - tree * leaves(rows)) // row_bytes)
    return rows


class _DiskColumns:
    """Just enough of a resident view for :func:`~torchstore.lightning.normalizer.column_stats`:
    ``packed.view(name)[a:b]`` reads rows ``[a, b)`` from the store (verified)."""

    def __init__(self, window: BlockWindow):
        self._window = window
        self.packed = self
        self.columns = window.packed.columns
        self.num_rows = window.store.num_rows

    def view(self, name: str) -> _DiskColumns._Column:
        return _DiskColumns._Column(self._window, name)

    class _Column:
        def __init__(self, window: BlockWindow, name: str):
            self._window, self._name = window, name
            self.device = torch.device("cpu")

        def __getitem__(self, rows: slice) -> torch.Tensor:
            stop = min(rows.stop, self._window.store.num_rows)
            with self._window.lock:
                value = self._window.store.read_column(self._name, rows.start, stop)
            return torch.from_numpy(value)


class BlockWindow:
    """``K`` resident blocks of a store larger than memory, refilled on a background thread.

    The runtime of the refill schedule (:mod:`torchstore.samplers.refill`, which explains
    the blocks, their Philox order and why every row is drawn as often as under uniform
    sampling over the whole store). The window holds ``K + 1`` slots of ``block_rows`` rows
    in one :class:`~torchstore.data.rows.packed.PackedColumns`; ``K`` are sampled from while a
    thread reads the next block into the spare one, column by column from the file's chunks
    (:class:`~torchstore.data.residency.block_read.ChunkReader`: ``preadv`` into a small buffer,
    each chunk checked against its checksum, one copy into the slot; the GIL is released
    while it reads, hashes and copies, so sampling goes on; camera frames are decoded into
    the slot on the decode threads, and at a phase's end, with that read still in flight,
    the read after it starts into the slot the next phase frees). A budget in rows is the
    slots' rows, ``(K + 1) * block_rows``; a budget in bytes holds every byte the window keeps: the
    slots, the read buffer (about an eighth of a slot, at most 1 MiB; none when that is
    less than a chunk, and blocks are then read through the store) and, prioritized, the
    window's two trees. The whole-store priorities (``priorities=``) are not in the budget:
    they hold a leaf for every row of the store, not of the window, and are the caller's
    (two trees of two nodes a leaf, leaves padded to a power of two: 512 MiB in float64 for
    10 M rows, half that in float32); count them beside the budget. Going to the next phase
    waits only when that read has not finished; waits are counted in :attr:`stats`.

    Draws return *packed* positions (what to gather) and *store* rows (what a batch
    reports as ``"index"``). The segments are the sampled episodes (or one run of rows);
    with ``align=True`` blocks hold whole episodes, so windows and context steps never
    leave the resident episode.

    Prioritized (``priorities=`` a whole-store :class:`~torchstore.samplers.SumTree` of
    stored values ``(p + eps) ** alpha``, one leaf per store row): a second tree over the
    slots mirrors the active rows' leaves; a phase lasts in proportion to its blocks'
    mass (each block thus gets its share of draws by its mass) and rows within are drawn
    by theirs, so over an epoch row ``i`` is drawn with probability ``p_i / sum(p)``, the
    whole-store prioritized marginal, and the importance weight is the whole-store one:
    ``(p_i / p_min) ** -beta`` with ``p_min`` over the store. The bias that remains: a
    phase's length is fixed by the mass when it opens, and a row's priority only counts
    while its block is resident; a priority raised while the block is away is seen on the
    block's next turn (at most one epoch later) rather than at once. The weights do not
    correct that lag (it is bounded by one epoch and shrinks with ``K``); they correct the
    prioritisation itself exactly as the whole-store sampler's do.
    """

    def __init__(
        self,
        store: TrajectoryStore,
        columns: Sequence[str] | None,
        *,
        segments: tuple[Any, Any, Any],
        budget: int | str,
        resident_blocks: int = 4,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        align: bool = False,
        window: int | None = None,
        priorities: Any = None,
        beta: float = 0.4,
        reuse: float = 1.0,
        lock: threading.Lock | None = None,
        resize: Any = None,
        decode_device: str = "cpu",
    ):
        self.store = store
        #: whether :meth:`close` closes the store (a window opened from its recipe does)
        self._owns_store = False
        self.lock = lock if lock is not None else threading.Lock()
        specs = store.select_columns(columns)
        #: camera columns kept at training resolution: ``{column: FrameResize}``
        self.resize = frame_resizes(resize, {spec.name: spec.shape for spec in specs})
        specs = [
            spec
            if spec.name not in self.resize
            else dataclasses.replace(spec, shape=self.resize[spec.name].shape(spec.shape))
            for spec in specs
        ]
        kind, amount = parse_budget(budget)
        if kind == "all":
            raise ResidencyError("a BlockWindow needs a budget in rows or bytes, not 'all'")
        k = positive_int("resident_blocks", resident_blocks, error=ResidencyError)
        row_bytes = PackedColumns(specs, 1, "cpu").row_bytes
        #: refills, rows and bytes read, seconds spent reading, waits and seconds waited,
        #: chunks read straight from the file and reads through the store (block_read)
        self.stats = {"refills": 0, "rows": 0, "bytes": 0, "read_s": 0.0, "waits": 0, "wait_s": 0.0}
        self._reader = ChunkReader(
            store,
            [s.name for s in specs],
            lock=self.lock,
            stats=self.stats,
            resize=self.resize,
            decode_device=decode_device,
        )
        self._reader.set_buffer(_buffer_bytes(kind, amount, row_bytes, k, self._reader.chunk_bytes))
        tree_item = None if priorities is None else priorities.dtype.itemsize
        budget_rows = _budget_rows(kind, amount, row_bytes, self._reader.buffer_bytes, tree_item)
        block_rows = budget_rows // (k + 1)
        if block_rows < 1:
            raise ResidencyError(
                f"resident budget {budget!r} holds {budget_rows} rows ({row_bytes} bytes a row): "
                f"too few for {k} blocks and a spare; raise it or lower resident_blocks"
            )
        start, length, episode = (
            np.asarray(torch.as_tensor(x).cpu(), dtype=np.int64) for x in segments
        )
        self.window = window
        align = align or window is not None
        self.blocks = cut_blocks(start, length, block_rows, align=align)
        if len(self.blocks) == 0:
            raise ResidencyError("nothing to sample: the segments hold no rows")
        self.seg_start, self.seg_length, self.seg_episode = start, length, episode
        #: what opens this window again in another process (see __reduce__)
        self._recipe = {
            "columns": [spec.name for spec in specs],
            "budget": budget,
            "resident_blocks": k,
            "seed": seed,
            "rank": rank,
            "world_size": world_size,
            "align": align,
            "window": window,
            "beta": beta,
            "reuse": reuse,
            "resize": self.resize or None,
            "decode_device": decode_device,
        }
        self.schedule = RefillSchedule(
            len(self.blocks),
            k,
            batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            reuse=reuse,
        )
        self.k = self.schedule.k
        self.block_rows = int(self.blocks.rows.max())
        self.budget_rows = budget_rows
        self.packed = PackedColumns(specs, (self.k + 1) * self.block_rows, device)
        self.device = self.packed.device
        #: what one block weighs in draws: rows, or valid windows of length ``window``
        if window is None:
            self._block_units = self.blocks.rows.astype(np.float64)
        else:
            self._block_units = np.array(
                [
                    float(window_counts(torch.as_tensor(self._clip(b)[1]), window).sum())
                    for b in range(len(self.blocks))
                ]
            )
        self.total_units = float(self._block_units.sum())
        self.priorities = priorities
        self.beta = float(beta)
        self.tree = None
        if priorities is not None:
            self.tree = SumTree(self.packed.capacity, dtype=priorities.dtype, device=self.device)
        self._pool = _refill_pool()
        self._pending: Future | None = None
        #: a read started before its phase change (see _read_early): (slot, block, read)
        self._early: tuple[int, int, Future] | None = None
        #: guards the stats two refill reads may count at once
        self._stats_lock = threading.Lock()
        self._opened = False
        self._slots: list[int] = []  # active slots, phase order
        #: the slots to read the position's blocks into at the first batch (a window
        #: opened from its recipe or copied by a fork), else None
        self._resume: list[int] | None = None
        self._slot_block = [-1] * (self.k + 1)
        self._spare = self.k
        self._spare_block = -1
        self._started = False
        #: blocks hinted to the kernel and not read since (see _advise)
        self._advised: set[int] = set()
        #: per block, its segments clipped to its rows (see _clipped)
        self._clips: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        _OPEN.add(self)

    # ------------------------------------------------------------ blocks and slots
    def _clip(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Segments of block ``b`` clipped to its rows: ``(start, length, episode)``."""
        lo, hi = int(self.blocks.lo[b]), int(self.blocks.hi[b])
        sl = slice(int(self.blocks.seg_lo[b]), int(self.blocks.seg_hi[b]))
        a = np.maximum(self.seg_start[sl], lo)
        e = np.minimum(self.seg_start[sl] + self.seg_length[sl], hi)
        return a, e - a, self.seg_episode[sl]

    def _advise(self, blocks: Sequence[int]) -> None:
        """Ask the kernel to start reading ``blocks`` into the page cache (no resident
        bytes: page cache, not the process's memory), once per block until it is read:
        a hint costs a system call per chunk run (about 7 us each, page cache or not)."""
        names = [spec.name for spec in self.packed.columns]
        for block in blocks:
            if block in self._advised:
                continue
            self._advised.add(block)
            self._reader.advise(names, int(self.blocks.lo[block]), int(self.blocks.hi[block]))

    def _read(self, slot: int, block: int, ahead: Sequence[int] = ()) -> None:
        """Read block ``block`` into slot ``slot``: one contiguous read per column; then
        hint the kernel to read ``ahead`` (the blocks of the next phase change) from disk
        while this phase samples, so a store not in the page cache is read one phase ahead
        of its refills instead of at them."""
        lo, hi = int(self.blocks.lo[block]), int(self.blocks.hi[block])
        base = slot * self.block_rows
        t0 = time.perf_counter()
        self._advise([block])
        if self.device.type == "cpu":
            # straight into the slot's strided rows, GIL released, every camera decoded at
            # once over the decode threads (see ChunkReader.read_block)
            outs = {
                spec.name: self.packed.view(spec.name).numpy()[base : base + hi - lo]
                for spec in self.packed.columns
            }
            self._reader.read_block(lo, hi, outs)
        else:  # read on the host, then one copy per column to the device
            outs = self._host_rows(hi - lo)
            self._reader.read_block(lo, hi, outs)
            self.packed.write(
                slice(base, base + hi - lo),
                {name: torch.from_numpy(out) for name, out in outs.items()},
            )
        self._advised.discard(block)
        with self._stats_lock:
            self.stats["read_s"] += time.perf_counter() - t0
            self.stats["refills"] += 1
            self.stats["rows"] += hi - lo
            self.stats["bytes"] += (hi - lo) * self.packed.row_bytes
        self._advise(ahead)

    def _host_rows(self, rows: int) -> dict[str, np.ndarray]:
        """Empty host arrays for ``rows`` rows of each column, as the window holds them."""
        outs = {}
        for spec in self.packed.columns:
            view = self.packed.view(spec.name)
            dtype = torch.empty((), dtype=view.dtype).numpy().dtype
            outs[spec.name] = np.empty((rows, *view.shape[1:]), dtype=dtype)
        return outs

    def _prefetch(self) -> None:
        """Start reading the block the next phase brings into the spare slot (if any), or
        take on the read :meth:`_read_early` started for it."""
        block = self.schedule.incoming()
        self._spare_block = -1
        self._slot_block[self._spare] = -1
        early, self._early = self._early, None
        if early is not None and early[:2] != (self._spare, block):
            _finish(early[2])  # not the read this phase makes (never expected): let it end
            early = None
        if block < 0:
            return
        self._spare_block = block
        if early is not None:
            self._pending = early[2]
        else:
            self._pending = self._submit_read(self._spare, block, self.schedule.phase)

    def _submit_read(self, slot: int, block: int, phase: int) -> Future:
        """Start reading ``block``, the one phase ``phase`` brings in at its end, into
        ``slot`` on a refill thread."""
        return self._pool.submit(self._read, slot, block, self._coming(phase + 1))

    def _coming(self, phase: int) -> list[int]:
        """The blocks the ends of phases ``phase, phase + 1, ...`` bring in (at an epoch's
        end up to K blocks, otherwise one), as far ahead as the reader reads: one phase
        from a local file, several from a URL (:attr:`ChunkReader.ahead_phases`)."""
        coming: list[int] = []
        for p in range(phase, phase + self._reader.ahead_phases):
            now = set(self.schedule.active(p))
            coming += [b for b in self.schedule.active(p + 1) if b not in now and b not in coming]
        return coming

    def _read_early(self) -> None:
        """At a phase's end, while the block the next phase brings in is still being read:
        start reading the block after it, the one the next phase's spare will take, now.

        That spare is the slot of the block the next phase drops, which this phase's
        batches have finished with, so nothing reads it any more. Its pieces queue behind
        the read in flight on the decode threads, which thus go from one block to the next
        without waiting for the phase change. A decode-bound window waits for every block,
        and the end of each block's read (a thread with no piece left while the other
        decodes its last) and the start of the next (its packets read) left the decode
        threads without a piece 6-8 % of the time; 1-4 % with this (480x640 + 240x320
        AV1, 150-row blocks, reuse 1, 2 busy cores). Only where the next phase needs no
        read of its own at the change (inside an epoch), so the slots are those
        :meth:`_advance` then gives."""
        pending = self._pending
        if pending is None or pending.done() or self._early is not None:
            return
        phase = self.schedule.phase + 1
        held = {self._slot_block[s]: s for s in self._slots}
        held[self._spare_block] = self._spare
        blocks = self.schedule.active(phase)
        block = self.schedule.incoming(phase)
        if block < 0 or any(b not in held for b in blocks):
            return
        slots = {held[b] for b in blocks}
        slot = next(s for s in range(self.k + 1) if s not in slots)
        self._early = (slot, block, self._submit_read(slot, block, phase))

    def _read_into(self, slot: int, block: int) -> None:
        self._read(slot, block)
        self._slot_block[slot] = block

    def _start(self, slots: list[int] | None = None) -> None:
        """Read the current phase's blocks (blocking) and start reading the next one.

        ``slots``: the slot of each active block (a checkpoint's layout: prioritized draws
        descend a tree over slot positions, so a resumed window keeps the layout).
        """
        self._slots = list(range(self.k)) if slots is None else [int(s) for s in slots]
        self._resume = None
        self._spare = next(s for s in range(self.k + 1) if s not in self._slots)
        self._slot_block = [-1] * (self.k + 1)
        # all the first reads in flight at once, and behind them the blocks the first
        # phases bring in (from a URL each is a round trip and its transfer: hinted only
        # once sampling begins, they could still be arriving at the first phase changes)
        phase = self.schedule.phase
        self._advise([*self.schedule.active(), *self._coming(phase)])
        for slot, block in zip(self._slots, self.schedule.active()):
            self._read_into(slot, block)
        self._activate()
        self._prefetch()
        self._started = True

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if not pending.done():
            t0 = time.perf_counter()
            pending.result()
            self.stats["waits"] += 1
            self.stats["wait_s"] += time.perf_counter() - t0
        else:
            pending.result()  # raises what the read raised (an IntegrityError, ...)
        self._slot_block[self._spare] = self._spare_block

    def _advance(self) -> None:
        """Next phase: blocks that stay keep their slots, the prefetched one enters, and
        any other newcomer (the first phase of an epoch) is read now.

        The layout depends only on the phase and the previous layout (the spare counts
        only for the block prefetched this phase), so a resumed window repeats it.
        """
        self._read_early()
        self._wait()
        self.schedule.next_phase()
        self._opened = False
        held = {self._slot_block[s]: s for s in self._slots}
        if self._spare_block >= 0:
            held[self._spare_block] = self._spare
        blocks = self.schedule.active()
        slots = [held.get(b, -1) for b in blocks]
        free = [s for s in range(self.k + 1) if s not in slots]
        for i, b in enumerate(blocks):
            if slots[i] < 0:
                slots[i] = free.pop(0)
                self._read_into(slots[i], b)
        self._slots, self._spare = slots, free[0]
        self._activate()
        self._prefetch()

    def _activate(self) -> None:
        """Set up the active phase: its runs (uniform rows), the slot offsets and, with
        priorities, the window tree. The segments in packed coordinates (:attr:`rows`,
        what window and segment draws use) are built when first asked for."""
        starts, lengths, deltas = [], [], []
        for slot in self._slots:
            b = self._slot_block[slot]
            a, n, _ = self._clipped(b)
            packed = slot * self.block_rows + (a - int(self.blocks.lo[b]))
            starts.append(packed)
            lengths.append(n)
            deltas.append(a - packed)
        start, length, delta = (np.concatenate(x) for x in (starts, lengths, deltas))
        #: active rows: what a uniform draw of a phase draws below
        self._total = int(length.sum())
        self._phase_rows = None
        self._phase_segments = (start, length, delta)
        self._runs(start, length, delta)
        if self.tree is not None:
            slot_delta = np.zeros(self.k + 1, dtype=np.int64)
            for slot in self._slots:
                b = self._slot_block[slot]
                slot_delta[slot] = int(self.blocks.lo[b]) - slot * self.block_rows
            self._slot_delta = torch.as_tensor(slot_delta, device=self.device)
            self.tree.clear()
            for slot in self._slots:
                self._mirror(slot)

    def _clipped(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_clip` of block ``b``, worked out once (blocks never change)."""
        clip = self._clips.get(b)
        if clip is None:
            clip = self._clips[b] = self._clip(b)
        return clip

    def _segments(self) -> tuple[RowSet, torch.Tensor, int]:
        """The active segments in packed coordinates, per segment store row minus packed
        position, and the phase's valid windows (window mode; else 0); built on the phase's
        first window or segment draw."""
        if self._phase_rows is None:
            start, length, delta = self._phase_segments
            episode = np.concatenate([self._clipped(self._slot_block[s])[2] for s in self._slots])
            cat = lambda x: torch.as_tensor(x, device=self.device)  # noqa: E731
            rows = RowSet(cat(start), cat(length), cat(episode))
            windows = 0
            if self.window is not None:
                windows = int(window_counts(rows.length, self.window).sum())
            self._phase_rows = (rows, cat(delta), windows)
        return self._phase_rows

    @property
    def rows(self) -> RowSet:
        """The active segments in packed coordinates (episodes of :attr:`seg_episode`)."""
        return self._segments()[0]

    def _runs(self, start: np.ndarray, length: np.ndarray, delta: np.ndarray) -> None:
        """The active segments merged into runs contiguous in packed and store rows, for
        uniform draws without a segment lookup: draw ``g`` lies in run ``q`` (the first
        whose cumulative length exceeds it) at packed ``g + off[0, q]``, store row
        ``g + off[1, q]``; the same rows as :meth:`RowSet.locate` numbers them."""
        new = np.ones(len(start), dtype=bool)
        new[1:] = (start[1:] != start[:-1] + length[:-1]) | (delta[1:] != delta[:-1])
        first = np.flatnonzero(new)
        run_length = np.add.reduceat(length, first)
        cum = np.cumsum(run_length)
        off = start[first] - (cum - run_length)
        store_off = off + delta[first]
        self._ahead = None
        if self.device.type == "cpu":
            self._host_runs = (cum, off, store_off)
            return
        self._host_runs = None
        self._run_cum = torch.as_tensor(cum, device=self.device)
        self._run_off = torch.as_tensor(np.stack([off, store_off]), device=self.device)

    def _map_host(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(packed, store_row)`` of uniform draws ``x`` of the phase, by the runs (numpy)."""
        cum, packed_off, store_off = self._host_runs
        q = cum.searchsorted(x, side="right")
        packed, store = packed_off.take(q), store_off.take(q)
        packed += x
        store += x
        return packed, store

    def _lookup(self, g: torch.Tensor, *, fresh: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed, store_row)`` of uniform draws ``g`` of the phase, by the runs.

        On the CPU, draws that are a slice of a stream's computed block (what
        :meth:`PhiloxStream.randint_view` returns) are mapped ahead: the draws of
        the block from ``g`` on, as many as the phase has left (at most ``_AHEAD``), in
        one numpy pass kept until the phase ends; a batch then takes two slices of that
        map, the store rows copied (they leave with the batch). Mapping 256 draws on their
        own (eight numpy and tensor calls) cost about 15 us of a walker batch's ~100 on the
        thread clock; two slices and a copy cost a few. The packed positions are a view of
        the map (read-only: gather with them) unless ``fresh``.
        """
        if self._host_runs is None:
            if self._run_off.shape[1] == 1:
                both = self._run_off + g
            else:
                q = torch.searchsorted(self._run_cum, g, right=True)
                both = torch.index_select(self._run_off, 1, q) + g
            return both[0], both[1]
        n, base = g.shape[0], g._base
        if base is None or base.ndim != 1 or not (g.is_contiguous() and base.is_contiguous()):
            packed, store = self._map_host(g.numpy())
            return torch.from_numpy(packed), torch.from_numpy(store)
        at = g.storage_offset() - base.storage_offset()
        ahead = self._ahead
        if ahead is None or ahead[0] is not base or not ahead[1] <= at <= ahead[2] - n:
            span = min(_AHEAD, n * (self.schedule.left + 1))
            hi = min(base.shape[0], at + max(n, span))
            packed, store = self._map_host(base[at:hi].numpy())
            ahead = (base, at, hi, torch.from_numpy(packed), torch.from_numpy(store))
            self._ahead = ahead
        i = at - ahead[1]
        packed = ahead[3][i : i + n]
        return (packed.clone() if fresh else packed), ahead[4][i : i + n].clone()

    def _mirror(self, slot: int, rows: torch.Tensor | None = None) -> None:
        """Copy whole-store priorities of (some of) ``slot``'s rows into the window tree."""
        b = self._slot_block[slot]
        lo, hi = int(self.blocks.lo[b]), int(self.blocks.hi[b])
        if rows is None:
            rows = torch.arange(lo, hi, device=self.device)
        else:
            rows = rows[(rows >= lo) & (rows < hi)]
            if not rows.numel():
                return
        base = slot * self.block_rows
        self.tree.update(rows - lo + base, self.priorities.values(rows), check=False)

    def refresh_priorities(self, rows: torch.Tensor) -> None:
        """Mirror whole-store priorities of store ``rows`` that are resident and active."""
        if self.tree is None or not self._started:
            return
        rows = rows.reshape(-1).to(self.device)
        for slot in self._slots:
            self._mirror(slot, rows)

    def _phase_weight(self) -> float:
        if self.tree is None:
            return float(sum(self._block_units[self._slot_block[s]] for s in self._slots))
        total = float(self.priorities.values().sum())
        if total <= 0:
            return 0.0
        return float(self.tree.values().sum()) / total * self.total_units

    def _ready(self) -> None:
        """Take one batch of the current phase (opening or advancing phases as needed)."""
        schedule = self.schedule
        if self._started and self._opened and schedule.left > 0:  # most batches: no loop
            schedule.take()
            return
        if not self._started:
            self._start(self._resume)
        for _ in range(self.schedule.per_epoch * 4 + 8):
            if not self._opened:
                self.schedule.start_phase(self._phase_weight())
                self._opened = True
            if self.schedule.left > 0:
                self.schedule.take()
                return
            self._advance()
        raise ResidencyError(
            f"no phase of the window schedule draws a batch of {self.schedule.batch_size}: "
            f"the sampled rows hold {self.total_units:.0f} draws in all; use a smaller "
            "batch_size or a larger resident budget"
        )

    # ------------------------------------------------------------ draws
    def draw_rows(
        self, stream: Any, n: int, *, segments: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``n`` rows of the current phase: ``(packed, store_row, segment, weight or None)``.

        ``segment`` indexes :attr:`rows` (``rows.start[segment]``/``rows.length[segment]``
        are the row's episode in packed positions); ``None`` with ``segments=False``, which
        draws the same rows with fewer steps.
        """
        self._ready()
        if self.tree is None:
            g = self._uniform_draws(stream, n)
            if not segments:
                return (*self._lookup(g, fresh=True), None, None)
            packed, seg = self._segments()[0].locate(g)
            weight = None
        else:
            u = stream.uniform(n, dtype=self.tree.dtype)
            packed, value, _ = self.tree.sample_whole(u)
            weight = importance_weight(value, self.priorities.min_whole(), self.beta)
            if not segments:
                store = (
                    packed
                    + self._slot_delta[torch.div(packed, self.block_rows, rounding_mode="floor")]
                )
                return packed, store, None, weight
            seg = self._segments()[0].segment_of(packed)
        return packed, packed + self._segments()[1][seg], seg, weight

    def draw_plain(self, stream: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed, store_row)`` of ``n`` uniform rows of the current phase, for a window
        without priorities: what ``draw_rows(stream, n, segments=False)`` returns (the same
        stream positions, the same rows), less its general cases: per batch the schedule's
        count, one stream draw and the run lookup (:meth:`_lookup`). ``store_row`` is a new
        tensor; ``packed`` may be a view of the window's map of the phase's draws: gather
        with it, do not edit it."""
        self._ready()
        return self._lookup(self._uniform_draws(stream, n), fresh=False)

    def draw_plain_gathered(
        self, stream: Any, n: int, source: np.ndarray
    ) -> tuple[torch.Tensor, np.ndarray] | None:
        """:meth:`draw_plain` and the gather of its rows from ``source`` (the window's one
        packed block, as a numpy array) in one compiled call: ``(store_row, rows)``, a new
        tensor and a new array. The same stream positions and rows as :meth:`draw_plain`;
        None, having drawn nothing, where there is no compiled path (an accelerator, a
        stream not in block mode, kernels off).

        The fully resident DataModule's batch is one such call too. Measured on a 10 M-row
        walker store at a tenth resident (256-row batches, ``resident_reuse=4``): 17.9k
        batches/s against 14.3k through :meth:`draw_plain` and a gather (fully resident
        22.5k; medians of four runs taking turns).
        """
        if self.device.type != "cpu" or not getattr(stream, "block", 0):
            return None
        kernels = cpu_kernels(stream.key)
        if kernels is None:
            return None
        self._ready()
        words, first = stream.block_words(n)
        out = self.packed.batch_array(0, n)
        index = kernels.draw_runs_gather(words, first, self._total, self._host_runs, source, out)
        return torch.from_numpy(index), out

    def _uniform_draws(self, stream: Any, n: int) -> torch.Tensor:
        """``n`` uniform draws of the phase's rows; from a block-mode stream, a view of its
        block that :meth:`_lookup` maps ahead."""
        if getattr(stream, "block", 0):
            return stream.randint_view(n, self._total)
        return stream.randint(n, self._total)

    def draw_windows(self, stream: Any, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` windows of ``window`` rows of the current phase.

        Returns ``(packed, store_rows, episode)``.
        """
        self._ready()
        rows, delta, total = self._segments()
        g = stream.randint(n, total)
        w = choose_windows(
            rows.start, rows.length, rows.episode, g, capacity=self.packed.capacity, T=self.window
        )
        return w.index, w.index + delta[w.segment].unsqueeze(1), w.episode_id

    def to_packed(self, rows: torch.Tensor) -> torch.Tensor:
        """Packed positions of store ``rows`` resident in an active slot.

        Raises:
            RowIndexError: for a row that is not resident now.
        """
        rows = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        out = torch.full_like(rows, -1)
        for slot in self._slots:
            b = self._slot_block[slot]
            lo, hi = int(self.blocks.lo[b]), int(self.blocks.hi[b])
            inside = (rows >= lo) & (rows < hi)
            out = torch.where(inside, rows - lo + slot * self.block_rows, out)
        if out.numel() and bool((out < 0).any()):
            bad = int(rows[out < 0][0])
            raise RowIndexError(
                f"row {bad} is not resident in the window now (active blocks {self.active_blocks})"
            )
        return out

    @property
    def active_blocks(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` of the active blocks, oldest first."""
        return [
            (int(self.blocks.lo[self._slot_block[s]]), int(self.blocks.hi[self._slot_block[s]]))
            for s in self._slots
        ]

    def read_rows(self, lo: int, hi: int) -> PackedColumns:
        """Rows ``[lo, hi)`` read now into their own packed block (validation batches)."""
        packed = PackedColumns(self.packed.columns, max(hi - lo, 1), self.device)
        outs = self._host_rows(hi - lo)
        self._reader.read_block(lo, hi, outs)  # resized as the window's blocks are
        packed.write(slice(0, hi - lo), {name: torch.from_numpy(out) for name, out in outs.items()})
        return packed

    def disk_columns(self) -> _DiskColumns:
        """The store's columns read in chunks from disk, for statistics over all rows."""
        return _DiskColumns(self)

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        slots = self._slots if self._started else (self._resume or list(range(self.k)))
        return {
            **self.schedule.state_dict(),
            "opened": self._opened,
            "slots": list(slots),
            "blocks": len(self.blocks),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        slots = self._checked_slots(state)
        self.close_reads()
        self.schedule.load_state_dict(state)
        self._opened = bool(state["opened"])
        self._start(slots)

    def _checked_slots(self, state: dict[str, Any]) -> list[int]:
        """The active slots of :meth:`state_dict` output, checked against this window."""
        slots = [int(s) for s in state["slots"]]
        if (
            int(state["blocks"]) != len(self.blocks)
            or len(slots) != self.k
            or len(set(slots)) != self.k
            or not set(slots) <= set(range(self.k + 1))
        ):
            raise ResidencyError(
                f"the checkpoint's window cut the rows into {state['blocks']} blocks and held "
                f"{len(slots)} resident, this one {len(self.blocks)} and {self.k}; resume with the "
                "same resident budget and resident_blocks"
            )
        return slots

    def _resume_at(self, state: dict[str, Any]) -> None:
        """Take :meth:`state_dict` output's position without reading: the first batch
        reads its blocks (what a window opened from its recipe does)."""
        slots = self._checked_slots(state)
        self.close_reads()
        self.schedule.load_state_dict(state)
        self._opened = bool(state["opened"])
        self._slots, self._resume = [], slots

    # ------------------------------------------------------------ processes
    def __reduce__(self) -> tuple[Any, ...]:
        """The window's recipe: its store (which pickles as its path), the options it was
        made with and its position (:meth:`state_dict`); never its slots, thread or file.
        Pickled here into bytes of their own, so priorities travel as a copy (the caller's
        tree stays the caller's, and stays out of a worker pickler's shared memory)."""
        recipe = dict(self._recipe)
        recipe.update(
            segments=(self.seg_start, self.seg_length, self.seg_episode),
            batch_size=self.schedule.batch_size,
            device=str(self.device),
            priorities=self.priorities,
        )
        return (_reopened, (pickle.dumps((self.store, recipe, self.state_dict())),))

    def _after_fork_in_child(self) -> None:
        """In a forked child: a thread pool of the child's own (the parent's refill thread
        does not exist here, and its pool would wait for it for ever), no read in flight,
        and the resident blocks read again at the first batch (the spare slot may hold half
        a block; live slots are never inherited)."""
        self._pool = _refill_pool()
        self._pending = self._early = None
        self._reader.after_fork_in_child()
        self._advised.clear()
        if self._started:
            self._started = False
            self._slots, self._resume = [], self._slots

    def close_reads(self) -> None:
        """Finish the read in flight (if any) and forget the resident blocks."""
        for read in (self._pending, self._early[2] if self._early is not None else None):
            if read is not None:
                read.cancel()
                _finish(read)
        self._pending = self._early = None
        self._advised.clear()
        self._started = False

    def close(self) -> None:
        self.close_reads()
        _OPEN.discard(self)
        self._pool.shutdown(wait=True)
        self._reader.close()
        if self._owns_store:
            self.store.close()

    def __repr__(self) -> str:
        return (
            f"BlockWindow({len(self.blocks)} blocks of <= {self.block_rows} rows, K={self.k}, "
            f"budget {self.budget_rows} rows, phase {self.schedule.phase}, device={self.device})"
        )


def _refill_pool() -> ThreadPoolExecutor:
    """A window's refill threads: one read at a time, and one started early beside it
    (:meth:`BlockWindow._read_early`)."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="torchstore-refill")


def _finish(read: Future) -> None:
    """Wait for a read that is no longer wanted (a failed one is redone on restart)."""
    try:
        read.result()
    except Exception:  # noqa: BLE001
        pass


def _reopened(recipe: bytes) -> BlockWindow:
    """A window made from its recipe (see :meth:`BlockWindow.__reduce__`), at its position."""
    store, options, state = pickle.loads(recipe)
    window = BlockWindow(store, **options)
    window._owns_store = True
    window._resume_at(state)
    return window


#: every open window of this process, for the fork handlers below
_OPEN: weakref.WeakSet[BlockWindow] = weakref.WeakSet()
#: the windows' file locks held across a fork (taken before it, let go on both sides)
_HELD: list[threading.Lock] = []


def _before_fork() -> None:
    """Take every open window's file lock, so that no refill thread is inside an h5py call
    (whose library lock the child would inherit taken) while the process is copied."""
    for lock in {id(w.lock): w.lock for w in list(_OPEN)}.values():
        lock.acquire()
        _HELD.append(lock)


def _release_held() -> None:
    while _HELD:
        _HELD.pop().release()


def _after_fork_in_child() -> None:
    _release_held()
    for window in list(_OPEN):
        window._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_release_held, after_in_child=_after_fork_in_child
    )
