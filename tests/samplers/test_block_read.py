"""Refill reads straight from a store's chunks: same rows as the store's read, checksums kept,
and every resident byte inside a budget in bytes."""

from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import pytest
import torch

from tests.damage import flip_chunk_byte
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.residency import block_read as block_read_module
from torchstore.data.residency.block_read import ChunkReader
from torchstore.data.store.store import TrajectoryStore
from torchstore.errors import IntegrityError
from torchstore.samplers.philox import PhiloxStream
from torchstore.samplers.sumtree import SumTree
from torchstore.window.block_window import BlockWindow

COLUMNS = [
    ColumnSpec("img", torch.uint8, (40, 25)),  # 1000 bytes a row: 131 rows a chunk
    ColumnSpec("obs", torch.float32, (3,)),
    ColumnSpec("step", torch.int64),
    ColumnSpec("done", torch.bool),
]
ROWS = 6000

#: 4 KiB rows: read straight into the destination's rows (one iovec a row)
FRAMES = [ColumnSpec("frame", torch.uint8, (64, 64)), ColumnSpec("step", torch.int64)]
FRAME_ROWS = 1500


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Episodes of 100 rows; ``step`` holds the row number, ``img`` bytes derived from it."""
    path = tmp_path_factory.mktemp("block_read") / "wide.h5"
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for start in range(0, ROWS, 100):
            rows = np.arange(start, start + 100)
            done = np.zeros(100, dtype=bool)
            done[-1] = True
            w.add_episode(
                {
                    "img": rng.integers(0, 256, (100, 40, 25), dtype=np.uint8),
                    "obs": rng.standard_normal((100, 3), dtype=np.float32),
                    "step": rows,
                    "done": done,
                }
            )
    return path


@pytest.fixture(scope="module")
def frames_path(tmp_path_factory):
    """Episodes of 50 rows of 4 KiB frames; ``step`` holds the row number."""
    path = tmp_path_factory.mktemp("block_read") / "frames.h5"
    rng = np.random.default_rng(5)
    with TrajectoryStoreWriter(path, FRAMES) as w:
        for start in range(0, FRAME_ROWS, 50):
            w.add_episode(
                {
                    "frame": rng.integers(0, 256, (50, 64, 64), dtype=np.uint8),
                    "step": np.arange(start, start + 50),
                }
            )
    return path


def test_chunk_reads_match_the_store_for_any_rows_and_any_strides(store_path):
    with TrajectoryStore(store_path) as store:
        stats: dict = {}
        reader = ChunkReader(
            store,
            [c.name for c in COLUMNS],
            buffer_bytes=300_000,
            lock=threading.Lock(),
            stats=stats,
        )
        rng = np.random.default_rng(1)
        spans = [(0, ROWS), (0, 1), (ROWS - 1, ROWS), (130, 132), (131, 262)]
        spans += [tuple(sorted(rng.integers(0, ROWS + 1, 2))) for _ in range(20)]
        for lo, hi in spans:
            reader.advise([c.name for c in COLUMNS], lo, hi)  # a hint: changes no bytes
            for spec in COLUMNS:
                expected = store.read_column(spec.name, lo, hi)
                # a strided destination, as a window slot's column is
                wide = np.zeros((hi - lo, 2, *expected.shape[1:]), dtype=expected.dtype)
                reader.read(spec.name, lo, hi, wide[:, 1])
                np.testing.assert_array_equal(wide[:, 1], expected)
                assert not wide[:, 0].any()
        reader.close()
    assert stats["direct_chunks"] > 100 and stats["store_reads"] == 0


def test_a_window_reads_its_blocks_from_the_chunks_and_gathers_the_store_rows(store_path):
    with TrajectoryStore(store_path) as store:
        ep = store.episodes
        w = BlockWindow(
            store,
            None,
            segments=(ep.offsets, ep.lengths, torch.arange(len(ep.lengths))),
            budget="4MB",  # a read buffer of a sixth of a slot: more than a chunk
            resident_blocks=2,
            batch_size=32,
        )
        stream = PhiloxStream(3, block=4096)
        for _ in range(400):
            packed, row, seg, _ = w.draw_rows(stream, 32, segments=False)
            assert seg is None
            batch = w.packed.gather(packed)
            assert torch.equal(batch["step"], row)
            expected = torch.from_numpy(store.read_column("img", 0, ROWS))[row]
            assert torch.equal(batch["img"], expected)
        w.close()
    assert w.stats["refills"] > 8 and w.stats["direct_chunks"] > 0
    assert w.stats["store_reads"] == 0


def _flip_a_byte(path, bad, column: str, *, chunk: int, at: int):
    """A copy of the store at ``bad`` with byte ``at`` of ``column``'s chunk ``chunk`` flipped."""
    shutil.copyfile(path, bad)
    flip_chunk_byte(bad, f"columns/{column}", chunk, at)
    return bad


def test_a_chunk_damaged_on_disk_still_fails_its_checksum(store_path, tmp_path):
    bad = _flip_a_byte(store_path, tmp_path / "bad.h5", "img", chunk=3, at=17)
    with TrajectoryStore(bad) as store:
        reader = ChunkReader(store, ["img"], buffer_bytes=1 << 16, lock=threading.Lock())
        out = np.empty((ROWS, 40, 25), dtype=np.uint8)
        reader.read("img", 0, 300, out[:300])  # chunks 0-2 are intact
        with pytest.raises(IntegrityError, match="column 'img'.*checksum"):
            reader.read("img", 0, ROWS, out)
        reader.close()


def _episode_window(store, budget: int, resident_blocks: int, priorities=None) -> BlockWindow:
    """A window of whole episodes under a budget of ``budget`` bytes, 8-row batches."""
    ep = store.episodes
    return BlockWindow(
        store,
        None,
        segments=(ep.offsets, ep.lengths, torch.arange(len(ep.lengths))),
        budget=f"{budget}B",
        resident_blocks=resident_blocks,
        batch_size=8,
        priorities=priorities,
    )


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_budget_in_bytes_holds_the_slots_the_read_buffer_and_the_trees(store_path, prioritized):
    budget = 2_400_000  # K = 1: a read buffer of a sixteenth, more than a chunk
    with TrajectoryStore(store_path) as store:
        priorities = None
        if prioritized:
            priorities = SumTree(store.num_rows)
            priorities.update(torch.arange(store.num_rows), torch.ones(store.num_rows))
        w = _episode_window(store, budget, 1, priorities)
        w.draw_rows(PhiloxStream(0, block=256), 8)  # the reader's buffer exists now
        assert w._reader.buffer_bytes > 0
        held = w.packed.nbytes + w._reader.buffer_bytes
        if prioritized:
            held += sum(t.numel() * t.element_size() for t in (w.tree._sum, w.tree._min))
        w.close()
    assert held <= budget
    assert held > 0.7 * budget


def test_without_preadv_every_read_goes_through_the_store(store_path, monkeypatch):
    """Platforms without ``os.preadv`` (Windows) read through h5py: same rows, no error."""
    monkeypatch.delattr("os.preadv")
    with TrajectoryStore(store_path) as store:
        stats: dict = {}
        reader = ChunkReader(
            store, ["obs"], buffer_bytes=300_000, lock=threading.Lock(), stats=stats
        )
        out = np.empty((250, 3), dtype=np.float32)
        reader.read("obs", 100, 350, out)
        np.testing.assert_array_equal(out, store.read_column("obs", 100, 350))
        reader.close()
    assert stats["store_reads"] == 1 and stats.get("direct_chunks", 0) == 0


def test_a_budget_of_a_few_mib_still_reads_from_the_chunks(store_path):
    """A buffer of an eighth of a slot would be under a chunk (131 kB) here; one chunk is
    at most a quarter of a slot, so the window reads by ``preadv`` (the GIL released)
    rather than through h5py, and the budget still holds every byte."""
    budget = 3_000_000
    with TrajectoryStore(store_path) as store:
        w = _episode_window(store, budget, 4)
        stream = PhiloxStream(0, block=256)
        for _ in range(300):
            packed, row, _, _ = w.draw_rows(stream, 8, segments=False)
            assert torch.equal(w.packed.gather(packed)["step"], row)
        assert w._reader.buffer_bytes == w._reader.chunk_bytes
        held = w.packed.nbytes + w._reader.buffer_bytes
        w.close()
    assert held <= budget
    assert w.stats["refills"] > 5 and w.stats["direct_chunks"] > 0
    assert w.stats["store_reads"] == 0


def _counting_preadv(monkeypatch) -> list[int]:
    """Patch ``os.preadv`` to note how many iovecs each call is given."""
    calls: list[int] = []
    real = os.preadv

    def preadv(fd, parts, offset):
        calls.append(len(parts))
        return real(fd, parts, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    return calls


@pytest.fixture(params=["compiled", "xxhash"])
def read_path(request, monkeypatch):
    """How a direct read reads and checks its chunks: one compiled call a span (the
    default), or ``os.preadv`` and ``xxhash`` chunk by chunk (compiled kernels off).
    Counts the chunks of each compiled call."""
    import torchstore.data.residency.block_read as block_read

    calls: list[int] = []
    if request.param == "xxhash":
        monkeypatch.setattr(block_read, "_direct_kernels", lambda: None)
        return request.param, calls
    kernels = block_read._direct_kernels()

    class Counted:
        @staticmethod
        def read_rows(*args):
            calls.append(args[4].shape[0])
            return kernels.read_rows(*args)

    monkeypatch.setattr(block_read, "_direct_kernels", lambda: Counted)
    return request.param, calls


def test_rows_of_4_kib_land_straight_in_the_destination_across_chunk_gaps(
    frames_path, monkeypatch, read_path
):
    """A frame column is read with one iovec a row into the destination (strided like a
    window slot, or contiguous), a run of chunks in one call across the small gaps the
    store leaves between them; the rows are the store's, every chunk verified (a span's
    chunks in one compiled call by default)."""
    calls = _counting_preadv(monkeypatch)
    with TrajectoryStore(frames_path) as store:
        stats: dict = {}
        reader = ChunkReader(
            store, ["frame", "step"], buffer_bytes=1 << 20, lock=threading.Lock(), stats=stats
        )
        assert reader._columns["frame"].direct and not reader._columns["step"].direct
        chunk = reader._columns["frame"].rows
        rng = np.random.default_rng(2)
        spans = [(0, FRAME_ROWS), (0, 1), (FRAME_ROWS - 1, FRAME_ROWS), (chunk - 1, chunk + 1)]
        spans += [tuple(sorted(rng.integers(0, FRAME_ROWS + 1, 2))) for _ in range(20)]
        for lo, hi in spans:
            expected = store.read_column("frame", lo, hi)
            wide = np.zeros((hi - lo, 2, 64, 64), dtype=np.uint8)
            reader.read("frame", lo, hi, wide[:, 1])
            np.testing.assert_array_equal(wide[:, 1], expected)
            assert not wide[:, 0].any()
            flat = np.zeros((hi - lo, 64, 64), dtype=np.uint8)
            reader.read("frame", lo, hi, flat)
            np.testing.assert_array_equal(flat, expected)
        mode, compiled = read_path
        calls.clear()
        compiled.clear()
        reader.read("frame", 0, FRAME_ROWS, np.empty((FRAME_ROWS, 64, 64), dtype=np.uint8))
        reader.close()
    chunks = -(-FRAME_ROWS // chunk)
    assert stats["direct_chunks"] > 100 and stats["store_reads"] == 0
    if mode == "compiled":  # spans of many chunks, read and checked in one call each
        assert not calls and sum(compiled) == chunks and len(compiled) < chunks / 4
    else:
        assert len(calls) < chunks / 4  # spans of many chunks, not a call a chunk
        assert sum(calls) >= FRAME_ROWS  # an iovec a row at least (and the gaps)


def test_a_damaged_frame_chunk_fails_its_checksum_in_a_direct_read(
    frames_path, tmp_path, read_path
):
    bad = _flip_a_byte(frames_path, tmp_path / "bad.h5", "frame", chunk=3, at=4099)
    with TrajectoryStore(bad) as store:
        chunk = store._ds.columns["frame"].block_rows
        reader = ChunkReader(store, ["frame"], buffer_bytes=1 << 20, lock=threading.Lock())
        assert reader._columns["frame"].direct
        out = np.empty((FRAME_ROWS, 64, 64), dtype=np.uint8)
        reader.read("frame", 0, 3 * chunk, out[: 3 * chunk])  # chunks 0-2 are intact
        np.testing.assert_array_equal(out[: 3 * chunk], store.read_column("frame", 0, 3 * chunk))
        with pytest.raises(IntegrityError, match="column 'frame'.*checksum"):
            reader.read("frame", 0, FRAME_ROWS, out)
        reader.close()
    mode, verified = read_path
    assert (mode == "compiled") == bool(verified)


def test_a_landing_never_sits_1_to_31_bytes_past_its_source_or_its_copy_before_it(store_path):
    """Where a read lands: ``rep movsb`` crawls when a copy's destination is 1 to 31 bytes
    past its source within a page, for the kernel's copy (file offset to landing) and for
    numpy's (landing to the destination ``to``)."""
    with TrajectoryStore(store_path) as store:
        reader = ChunkReader(store, ["obs"], buffer_bytes=300_000, lock=threading.Lock())
        reader.read("obs", 0, 10, np.empty((10, 3), dtype=np.float32))  # the buffer exists
        rng = np.random.default_rng(4)
        slow = range(1, 32)
        for _ in range(2000):
            offset = int(rng.integers(0, 1 << 40))
            to = None if rng.random() < 0.3 else int(rng.integers(0, 1 << 40))
            landing = reader._landing(offset, 1 << 16, to)
            at = landing.ctypes.data
            assert landing.size == 1 << 16
            assert (at - offset) % 4096 not in slow
            if to is None:
                assert at % 64 == 0
            else:
                assert (to - at) % 4096 not in slow
        reader.close()


def test_a_failed_compiled_read_falls_back_to_os_preadv(frames_path, monkeypatch):
    """When the compiled read reports a failed call (-1: a signal, too many iovecs), the
    span is read again through ``os.preadv`` and checked chunk by chunk: same rows."""
    import torchstore.data.residency.block_read as block_read

    class Failing:
        @staticmethod
        def read_rows(*args):
            return -1

    monkeypatch.setattr(block_read, "_direct_kernels", lambda: Failing)
    calls = _counting_preadv(monkeypatch)
    with TrajectoryStore(frames_path) as store:
        stats: dict = {}
        reader = ChunkReader(
            store, ["frame"], buffer_bytes=1 << 20, lock=threading.Lock(), stats=stats
        )
        out = np.zeros((FRAME_ROWS - 7, 2, 64, 64), dtype=np.uint8)
        reader.read("frame", 7, FRAME_ROWS, out[:, 0])
        np.testing.assert_array_equal(out[:, 0], store.read_column("frame", 7, FRAME_ROWS))
        reader.close()
    assert calls and stats["store_reads"] == 0


def test_the_compiled_read_checks_each_chunk_and_stops_at_a_short_read(tmp_path):
    """``read_rows`` on a file of three 2-row chunks with gaps between them: every chunk
    lands in its scattered rows and matches; a file cut inside the last chunk reports how
    far it got and leaves that chunk unverified; a closed file reports -1."""
    import xxhash

    from torchstore.data.residency.direct_read import read_rows

    rng = np.random.default_rng(9)
    rnb, offset, at = 300, 4096, np.array([0, 700, 1500], dtype=np.int64)
    chunks = [rng.integers(0, 256, (2, rnb), dtype=np.uint8) for _ in at]
    blob = bytearray(offset + int(at[-1]) + 2 * rnb)
    sums = np.zeros((3, 2, 2), dtype=np.uint64)
    for i, chunk in enumerate(chunks):
        blob[offset + at[i] : offset + at[i] + 2 * rnb] = chunk.tobytes()
        sums[i, 1] = (2, xxhash.xxh3_64_intdigest(chunk.tobytes()))
    path = tmp_path / "chunks.bin"
    path.write_bytes(bytes(blob))
    memory = np.zeros((6, rnb + 40), dtype=np.uint8)
    rows = memory[:, 20:].__array_interface__["data"][0] + memory.strides[0] * np.arange(6)
    counts, ok = np.array([2, 2, 2], dtype=np.int64), np.zeros(3, dtype=np.bool_)

    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_rows(fd, offset, rows.astype(np.int64), rnb, counts, at, sums, ok) == 2100
        assert ok.all()
        np.testing.assert_array_equal(memory[:, 20 : 20 + rnb], np.concatenate(chunks))
        assert not memory[:, :20].any() and not memory[:, 20 + rnb :].any()
    finally:
        os.close(fd)

    path.write_bytes(bytes(blob[: offset + 1500 + rnb + 10]))  # cut inside the last chunk
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_rows(fd, offset, rows.astype(np.int64), rnb, counts, at, sums, ok)
        assert got == 1500 + rnb + 10 and ok.tolist() == [True, True, False]
    finally:
        os.close(fd)
    assert read_rows(fd, offset, rows.astype(np.int64), rnb, counts, at, sums, ok) == -1
    assert not ok.any()


def test_a_compiled_read_that_cannot_be_built_falls_back_with_one_warning(frames_path, monkeypatch):
    """Where the compiled read raises (its ``preadv`` symbol missing on a platform, say),
    the reader warns once, reads through ``os.preadv`` from then on, and returns the rows."""
    import torchstore.data.residency.block_read as block_read
    from torchstore.data.residency import direct_read

    tries = []

    def broken(*args):
        tries.append(1)
        raise RuntimeError("no symbol preadv")

    monkeypatch.setattr(direct_read, "read_rows", broken)
    monkeypatch.setattr(block_read, "_DIRECT_FAILED", [])
    with TrajectoryStore(frames_path) as store:
        reader = ChunkReader(store, ["frame"], buffer_bytes=1 << 20, lock=threading.Lock())
        out = np.empty((FRAME_ROWS, 64, 64), dtype=np.uint8)
        with pytest.warns(RuntimeWarning, match="compiled read failed.*no symbol preadv"):
            reader.read("frame", 0, FRAME_ROWS // 2, out[: FRAME_ROWS // 2])
        reader.read("frame", FRAME_ROWS // 2, FRAME_ROWS, out[FRAME_ROWS // 2 :])
        np.testing.assert_array_equal(out, store.read_column("frame", 0, FRAME_ROWS))
        reader.close()
    assert len(tries) == 1


def test_2_kib_rows_go_straight_with_the_compiled_read_and_through_the_buffer_without(
    tmp_path, monkeypatch
):
    """Rows of 2 KiB are read straight into their rows by the compiled read, and through
    the buffer with the kernels off (where an iovec and a hash call a row cost more than
    the copy): the same rows either way."""
    path = tmp_path / "mid.h5"
    rng = np.random.default_rng(11)
    with TrajectoryStoreWriter(path, [ColumnSpec("img", torch.uint8, (32, 64))]) as w:
        for _ in range(6):
            w.add_episode({"img": rng.integers(0, 256, (100, 32, 64), dtype=np.uint8)})
    for kernels in (True, False):
        monkeypatch.setattr(block_read_module, "KERNELS", kernels)
        with TrajectoryStore(path) as store:
            stats: dict = {}
            reader = ChunkReader(
                store, ["img"], buffer_bytes=1 << 20, lock=threading.Lock(), stats=stats
            )
            assert reader._columns["img"].direct == kernels
            wide = np.zeros((590, 2, 32, 64), dtype=np.uint8)
            reader.read("img", 5, 595, wide[:, 1])
            np.testing.assert_array_equal(wide[:, 1], store.read_column("img", 5, 595))
            assert not wide[:, 0].any() and stats["store_reads"] == 0
            reader.close()


def test_camera_rows_decode_in_place_in_a_slot_and_through_a_copy_elsewhere(tmp_path, monkeypatch):
    """An encoded column's frames are decoded straight into a window slot's rows (each
    frame contiguous, the rows strided between the other columns' bytes), with no array
    of their own to copy from; a destination whose frames are not contiguous gets the
    same pixels through one."""
    h, w = 24, 32
    path = tmp_path / "cams.h5"
    columns = [
        ColumnSpec("cam", torch.uint8, (h, w, 3), codec="av1"),
        ColumnSpec("step", torch.int64),
    ]
    y, x = np.mgrid[0:h, 0:w]
    with TrajectoryStoreWriter(path, columns) as writer:
        for e in range(3):
            base = (x[None] * 6 + y[None] * 3 + np.arange(20)[:, None, None] * 4 + e * 17) % 256
            frames = np.stack([base, 255 - base, (base + 85) % 256], axis=-1).astype(np.uint8)
            writer.add_episode({"cam": frames, "step": np.arange(20) + 20 * e})
    targets: list[np.ndarray] = []
    submit = block_read_module.submit_pieces

    def spy(spec, pieces, out, *args):
        targets.append(out)
        return submit(spec, pieces, out, *args)

    monkeypatch.setattr(block_read_module, "submit_pieces", spy)
    with TrajectoryStore(path) as store:
        reader = ChunkReader(store, ["cam", "step"], lock=threading.Lock())
        expected = store.read_column("cam", 5, 50)
        # a slot: rows of the frame's bytes and 16 more, the frame at byte 8 of each
        slot = np.zeros((45, h * w * 3 + 16), np.uint8)
        frames = slot[:, 8 : 8 + h * w * 3].reshape(45, h, w, 3)
        steps = np.zeros(45, np.int64)
        reader.read_block(5, 50, {"cam": frames, "step": steps})
        np.testing.assert_array_equal(frames, expected)
        np.testing.assert_array_equal(steps, np.arange(5, 50))
        assert not slot[:, :8].any() and not slot[:, 8 + h * w * 3 :].any()
        assert len(targets) == 1 and np.shares_memory(targets[0], slot)
        flipped = np.zeros((45, h, w, 3), np.uint8)[..., ::-1]  # frames not contiguous
        reader.read_block(5, 50, {"cam": flipped})
        np.testing.assert_array_equal(flipped, expected)
        assert not np.shares_memory(targets[1], flipped)
        reader.close()
