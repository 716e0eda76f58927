"""Large CPU gathers reuse their memory once a batch is gone, and never while it is held."""

from __future__ import annotations

import copy
import gc
import pickle

import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.rows.packed import PackedColumns
from torchstore.data.rows.recycled import RECYCLE_BYTES, RecycledBuffers

FRAME = ColumnSpec("frame", torch.uint8, (64, 64, 3))  # 12 KiB a row
ROWS = 400


def _frames() -> PackedColumns:
    packed = PackedColumns([FRAME, ColumnSpec("step", torch.int64)], ROWS)
    steps = torch.arange(ROWS)
    frames = (steps.view(-1, 1, 1, 1) * 7 + torch.arange(3)).to(torch.uint8).expand(-1, 64, 64, 3)
    packed.write(slice(0, ROWS), {"frame": frames.contiguous(), "step": steps})
    return packed


def test_a_buffer_comes_back_only_when_every_view_of_it_is_gone():
    pool = RecycledBuffers(keep=2)
    first = pool.empty(8, 1024, torch.float32)
    first.fill_(1.0)
    row = first[3]  # a view keeps the storage, so the buffer, alive
    del first
    gc.collect()
    second = pool.empty(8, 1024, torch.float32)
    assert second.data_ptr() != row.data_ptr() - 3 * 1024 * 4
    assert pool.reused == 0 and torch.all(row == 1.0)
    ptr = row.data_ptr() - 3 * 1024 * 4
    del row
    gc.collect()
    third = pool.empty(8, 1024, torch.float32)
    assert third.data_ptr() == ptr and pool.reused == 1
    assert third.shape == (8, 1024) and third.dtype == torch.float32
    del second, third


def test_the_pool_keeps_at_most_keep_free_buffers_of_a_size():
    pool = RecycledBuffers(keep=2)
    held = [pool.empty(4, 256, torch.int64) for _ in range(5)]
    del held
    gc.collect()
    assert sum(len(v) for v in pool._free.values()) == 2
    pool.clear()
    assert not pool._free


def test_held_batches_keep_their_rows_while_later_batches_reuse_memory():
    packed = _frames()
    index = torch.randint(0, ROWS, (256,), generator=torch.Generator().manual_seed(0))
    assert 256 * packed.row_bytes >= RECYCLE_BYTES
    kept = packed.gather(index)
    expected = kept["frame"].clone()
    for seed in range(20):  # each batch dropped at once: its buffer comes back
        other = torch.randint(0, ROWS, (256,), generator=torch.Generator().manual_seed(seed + 1))
        batch = packed.gather(other)
        assert torch.equal(batch["step"], other)
        assert torch.equal(batch["frame"][:, 0, 0, 0], (other * 7).to(torch.uint8))
        del batch
    assert torch.equal(kept["frame"], expected)  # never handed out while held
    assert torch.equal(kept["step"], index)
    assert packed._recycled.allocated <= 3 and packed._recycled.reused >= 18


def test_small_gathers_do_not_use_the_pool():
    packed = _frames()
    packed.gather(torch.arange(8))
    assert packed._recycled.allocated == 0


def test_a_pickled_or_copied_pool_starts_empty():
    pool = RecycledBuffers(keep=3)
    pool.empty(4, 1024, torch.uint8)  # dropped at once: one free buffer
    gc.collect()
    for clone in (pickle.loads(pickle.dumps(pool)), copy.deepcopy(pool)):
        assert clone.keep == 3 and not clone._free
