"""The refill schedule and the block window: blocks, order, uniform frequency, resume, errors."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.store.store import TrajectoryStore
from torchstore.errors import IntegrityError, ResidencyError, RowIndexError
from torchstore.samplers.philox import PhiloxStream
from torchstore.samplers.refill import RefillSchedule, cut_blocks, parse_budget
from torchstore.samplers.sumtree import SumTree
from torchstore.window.block_window import BlockWindow

LENGTHS = [37, 5, 60, 12, 1, 44, 23, 9, 70, 31, 18, 50, 3, 27, 41, 16]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Episodes of uneven lengths; ``obs`` holds the row number, ``ep`` the episode."""
    path = tmp_path_factory.mktemp("refill") / "uneven.h5"
    row = 0
    columns = [ColumnSpec("obs", torch.float32, (2,)), ColumnSpec("ep", torch.int64)]
    with TrajectoryStoreWriter(path, columns) as w:
        for e, n in enumerate(LENGTHS):
            rows = torch.arange(row, row + n, dtype=torch.float32)
            w.add_episode({"obs": torch.stack([rows, -rows], 1), "ep": torch.full((n,), e)})
            row += n
    return path


def segments(store):
    ep = store.episodes
    return ep.offsets, ep.lengths, torch.arange(len(ep.lengths))


def window(store, budget, *, k=3, batch=16, **kw):
    return BlockWindow(
        store,
        None,
        segments=segments(store),
        budget=budget,
        resident_blocks=k,
        batch_size=batch,
        **kw,
    )


# ------------------------------------------------------------------ pure schedule
@pytest.mark.parametrize(
    "value, expected",
    [
        ("all", ("all", None)),
        (" ALL ", ("all", None)),
        (1000, ("rows", 1000)),
        ("8GiB", ("bytes", 8 * 2**30)),
        ("512MB", ("bytes", 512 * 10**6)),
        ("1_000B", ("bytes", 1000)),
        ("1.5KiB", ("bytes", 1536)),
        ("4096", ("bytes", 4096)),
    ],
)
def test_budgets_parse(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", [0, -5, True, "8 gigs", "", "GiB", 2.5, None, "-1GB", "0B"])
def test_bad_budgets_are_refused_by_name(value):
    with pytest.raises(ResidencyError, match="resident"):
        parse_budget(value)


def test_aligned_blocks_hold_whole_episodes_and_never_span_a_gap():
    start = np.array([0, 10, 15, 40, 45])  # rows 30..39 are not sampled (a gap)
    length = np.array([10, 5, 15, 5, 20])
    b = cut_blocks(start, length, 20, align=True)
    assert list(zip(b.lo, b.hi)) == [(0, 15), (15, 30), (40, 45), (45, 65)]
    assert list(zip(b.seg_lo, b.seg_hi)) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    u = cut_blocks(start, length, 20, align=False)
    assert list(zip(u.lo, u.hi)) == [(0, 20), (20, 30), (40, 60), (60, 65)]
    assert (u.rows <= 20).all()
    with pytest.raises(ResidencyError, match="longest training episode has 20 rows.*19 rows"):
        cut_blocks(start, length, 19, align=True)


def test_block_order_is_reproducible_and_ranks_read_disjoint_blocks():
    a = RefillSchedule(23, 3, 8, seed=4)
    b = RefillSchedule(23, 3, 8, seed=4)
    for epoch in range(3):
        assert sorted(a.epoch_order(epoch)) == list(range(23))
        assert a.epoch_order(epoch).tolist() == b.epoch_order(epoch).tolist()
    assert a.epoch_order(0).tolist() != a.epoch_order(1).tolist()
    assert a.epoch_order(0).tolist() != RefillSchedule(23, 3, 8, seed=5).epoch_order(0).tolist()
    ranks = [RefillSchedule(23, 3, 8, seed=4, rank=r, world_size=3) for r in range(3)]
    for epoch in range(3):
        parts = [set(s.epoch_order(epoch).tolist()) for s in ranks]
        assert set().union(*parts) == set(range(23))
        assert sum(map(len, parts)) == 23  # disjoint
    with pytest.raises(ResidencyError, match="fewer than the 4 ranks"):
        RefillSchedule(3, 2, 8, world_size=4)


@pytest.mark.parametrize("n, k, world", [(8, 4, 1), (23, 3, 1), (23, 3, 3), (5, 5, 1), (9, 1, 2)])
def test_every_block_is_active_in_k_phases_of_every_epoch_the_first_included(n, k, world):
    for rank in range(world):
        s = RefillSchedule(n, k, 1, seed=1, rank=rank, world_size=world)
        per = s.per_epoch
        for epoch in range(3):
            phases = range(epoch * per, (epoch + 1) * per)
            counts = {}
            for p in phases:
                active = s.active(p)
                assert len(set(active)) == s.k
                assert set(active) <= set(s.epoch_order(epoch).tolist())  # disjoint ranks
                for b in active:
                    counts[b] = counts.get(b, 0) + 1
            assert sorted(counts) == sorted(s.epoch_order(epoch).tolist())
            assert set(counts.values()) == {s.k}
            # inside an epoch one block enters per phase; the prefetched one is among them
            for p in phases:
                new = set(s.active(p + 1)) - set(s.active(p))
                assert len(new) <= (1 if p + 1 < (epoch + 1) * per else s.k)
                assert s.incoming(p) in new if new else s.incoming(p) == -1


def test_the_reviewers_case_block_phase_counts_in_the_first_epoch():
    s = RefillSchedule(8, 4, 1, seed=1)
    counts = np.zeros(8, dtype=np.int64)
    for p in range(8):
        counts[s.active(p)] += 1
    assert counts.tolist() == [4] * 8


def test_one_epoch_of_draws_is_uniform_over_the_rows(store_path):
    """The first epoch alone (no later epoch to make up for it) draws every row equally."""
    with TrajectoryStore(store_path) as store:
        n = store.num_rows
        w = window(store, 120, k=3, batch=16, reuse=20)
        assert len(w.blocks) > 2 * w.k
        stream = PhiloxStream(11, block=4096)
        counts = torch.zeros(n, dtype=torch.int64)
        batches = 0
        while True:
            row = w.draw_rows(stream, 16)[1]
            if w.schedule.epoch >= 1:
                break
            counts += torch.bincount(row, minlength=n)
            batches += 1
        w.close()
    assert abs(batches * 16 - 20 * n) <= 16 * w.schedule.per_epoch
    assert counts.min() > 0
    assert chisquare(counts.numpy()).pvalue > 1e-3


# ------------------------------------------------------------------ the window
def test_batches_are_the_store_rows_and_every_row_is_drawn_as_often_as_uniform(store_path):
    with TrajectoryStore(store_path) as store:
        n = store.num_rows
        w = window(store, 120, k=3, batch=16)
        stream = PhiloxStream(7, block=4096)
        counts = torch.zeros(n, dtype=torch.int64)
        for _ in range(3000):
            packed, row, _, weight = w.draw_rows(stream, 16)
            assert weight is None
            batch = w.packed.gather(packed)
            assert torch.equal(batch["obs"][:, 0], row.float())  # the rows reported are gathered
            counts += torch.bincount(row, minlength=n)
        w.close()
    assert w.stats["refills"] > 10 * len(w.blocks) and w.stats["bytes"] > 0
    assert counts.min() > 0
    # rows of every block, every episode, drawn with the expected frequency of uniform draws
    assert chisquare(counts.numpy()).pvalue > 1e-3
    # a sampler stuck in a few blocks would fail it
    skewed = counts.clone()
    skewed[: n // 4] += counts[: n // 4] // 5
    assert chisquare(skewed.numpy()).pvalue < 1e-6


def test_reuse_reads_less_and_keeps_the_frequencies(store_path):
    with TrajectoryStore(store_path) as store:
        n = store.num_rows
        counts = {}
        refills = {}
        for reuse in (1, 4):
            w = window(store, 120, k=3, batch=16, reuse=reuse)
            stream = PhiloxStream(5, block=4096)
            c = torch.zeros(n, dtype=torch.int64)
            for _ in range(1500):
                c += torch.bincount(w.draw_rows(stream, 16)[1], minlength=n)
            w.close()
            counts[reuse], refills[reuse] = c, w.stats["refills"]
    assert refills[4] * 3 < refills[1]
    assert chisquare(counts[4].numpy()).pvalue > 1e-3
    with pytest.raises(ResidencyError, match="reuse"):
        RefillSchedule(4, 2, 8, reuse=0)


def test_prioritized_draws_follow_the_whole_store_priorities(store_path):
    with TrajectoryStore(store_path) as store:
        n = store.num_rows
        tree = SumTree(n)
        prio = (torch.arange(n) % 5 + 1).double()
        tree.update(torch.arange(n), prio)
        w = window(store, 240, k=3, batch=64, priorities=tree, beta=0.5)
        stream = PhiloxStream(3, block=4096)
        counts = torch.zeros(n, dtype=torch.int64)
        for _ in range(1200):
            _, row, _, weight = w.draw_rows(stream, 64)
            torch.testing.assert_close(weight, (prio[row] / prio.min()).pow(-0.5).float())
            counts += torch.bincount(row, minlength=n)
        w.close()
    expected = prio / prio.sum() * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


def test_sequence_windows_never_cross_an_episode_or_a_block(store_path):
    with TrajectoryStore(store_path) as store:
        ep = store.read_column("ep", 0, store.num_rows)
        w = window(store, 4 * 80, k=3, batch=8, window=6)
        assert all(int(h - lo) <= w.block_rows for lo, h in zip(w.blocks.lo, w.blocks.hi))
        stream = PhiloxStream(1, block=1024)
        seen = set()
        for _ in range(300):
            packed, rows, episode = w.draw_windows(stream, 8)
            assert (rows[:, 1:] - rows[:, :-1] == 1).all()
            assert (torch.from_numpy(ep)[rows] == episode.unsqueeze(1)).all()
            got = w.packed.gather(packed.reshape(-1))["obs"][:, 0].reshape(rows.shape)
            assert torch.equal(got, rows.float())
            seen.update(episode.tolist())
        w.close()
    assert seen == {e for e, n in enumerate(LENGTHS) if n >= 6}


def test_resume_mid_epoch_draws_the_same_rows(store_path):
    with TrajectoryStore(store_path) as store:
        a = window(store, 100, k=2, batch=8)
        sa = PhiloxStream(9, block=512)
        rows = [a.draw_rows(sa, 8)[1] for _ in range(60)]
        b = window(store, 100, k=2, batch=8)
        sb = PhiloxStream(9, block=512)
        for _ in range(23):
            b.draw_rows(sb, 8)
        state, position = b.state_dict(), int(sb.position)
        b.close()
        c = window(store, 100, k=2, batch=8)
        c.load_state_dict(state)
        sc = PhiloxStream(9, block=512)
        sc.seek(position)
        resumed = [c.draw_rows(sc, 8)[1] for _ in range(37)]
        a.close()
        c.close()
    assert state["phase"] > 0
    assert all(torch.equal(x, y) for x, y in zip(rows[23:], resumed))


def test_rows_not_resident_are_refused(store_path):
    with TrajectoryStore(store_path) as store:
        w = window(store, 100, k=2, batch=8)
        w.draw_rows(PhiloxStream(0), 8)
        lo, hi = w.active_blocks[0]
        assert w.to_packed(torch.tensor([lo, hi - 1])).tolist() == [
            w.to_packed(torch.tensor([lo]))[0].item(),
            w.to_packed(torch.tensor([lo]))[0].item() + hi - 1 - lo,
        ]
        resident = {r for a, b in w.active_blocks for r in range(a, b)}
        away = next(r for r in range(store.num_rows) if r not in resident)
        with pytest.raises(RowIndexError, match=f"row {away} is not resident"):
            w.to_packed(torch.tensor([lo, away]))
        w.close()


def test_budget_too_small_and_episode_too_long_are_clear_errors(store_path):
    with TrajectoryStore(store_path) as store:
        with pytest.raises(ResidencyError, match="too few for 4 blocks"):
            window(store, 3, k=4)
        with pytest.raises(ResidencyError, match="longest training episode has 70 rows"):
            window(store, 200, k=3, window=4)
        with pytest.raises(ResidencyError, match="not 'all'"):
            window(store, "all")


def test_a_damaged_block_fails_its_checksum_on_refill(store_path, tmp_path):
    bad = tmp_path / "bad.h5"
    shutil.copyfile(store_path, bad)
    with TrajectoryStore(bad) as store:
        ds = store._ds.columns["obs"].data
        offset = ds.id.get_chunk_info(0).byte_offset
    with open(bad, "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)[0]
        f.seek(offset + 5)
        f.write(bytes([byte ^ 0x04]))
    with TrajectoryStore(bad) as store:
        w = window(store, 60, k=2, batch=8)
        stream = PhiloxStream(0, block=256)
        with pytest.raises(IntegrityError, match="column 'obs'.*checksum"):
            for _ in range(500):
                w.draw_rows(stream, 8)
        w.close()
