"""The window's plain uniform draw (``draw_plain``, what uniform-row DataModules use) against
its general draw: the same stream positions, the same packed positions and store rows, the
same schedule, over phase changes, epochs, segment gaps and DDP ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.store.store import TrajectoryStore
from torchstore.samplers.philox import PhiloxStream
from torchstore.window.block_window import BlockWindow

LENGTHS = [37, 5, 60, 12, 1, 44, 23, 9, 70, 31, 18, 50, 3, 27, 41, 16]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Episodes of uneven lengths; ``row`` holds the row number."""
    path = tmp_path_factory.mktemp("window_draws") / "uneven.h5"
    columns = [ColumnSpec("row", torch.int64), ColumnSpec("obs", torch.float32, (3,))]
    start = 0
    with TrajectoryStoreWriter(path, columns) as w:
        for n in LENGTHS:
            rows = np.arange(start, start + n)
            w.add_episode({"row": rows, "obs": np.stack([rows, -rows, rows], 1).astype("f4")})
            start += n
    return path


def make(store, episodes, **kw):
    ep = store.episodes
    ids = torch.as_tensor(episodes)
    return BlockWindow(
        store,
        None,
        segments=(ep.offsets[ids], ep.lengths[ids], ids),
        budget=kw.pop("budget", 90),
        resident_blocks=kw.pop("k", 3),
        batch_size=kw.pop("batch", 8),
        **kw,
    )


@pytest.mark.parametrize(
    "episodes, kw",
    [
        (list(range(len(LENGTHS))), {}),  # one run of rows: blocks merge into runs
        (list(range(0, len(LENGTHS), 2)), {}),  # gaps between segments
        (list(range(len(LENGTHS))), {"align": True, "k": 2, "budget": 240}),  # whole episodes
        (list(range(len(LENGTHS))), {"rank": 1, "world_size": 2, "reuse": 3}),
        (list(range(3, len(LENGTHS))), {"k": 9, "budget": 400}),  # every block resident
    ],
)
def test_plain_draws_are_the_general_draws(store_path, episodes, kw):
    with TrajectoryStore(store_path) as store:
        plain, general = make(store, episodes, **kw), make(store, episodes, **kw)
        sp, sg = PhiloxStream(5, block=256), PhiloxStream(5, block=256)
        epochs = set()
        for _ in range(300):
            packed, row = plain.draw_plain(sp, 8)
            g_packed, g_row, seg, weight = general.draw_rows(sg, 8)  # by segment lookup
            assert seg is not None and weight is None
            assert torch.equal(packed, g_packed) and torch.equal(row, g_row)
            assert int(sp.position) == int(sg.position)
            assert plain.state_dict() == general.state_dict()
            # the rows drawn are resident at those positions
            assert torch.equal(plain.packed.gather(packed)["row"], row)
            epochs.add(plain.schedule.epoch)
        # and the general draw without segments (the same run lookup) agrees too
        for _ in range(40):
            packed, row = plain.draw_plain(sp, 8)
            g_packed, g_row, _, _ = general.draw_rows(sg, 8, segments=False)
            assert torch.equal(packed, g_packed) and torch.equal(row, g_row)
        plain.close()
        general.close()
    assert len(epochs) >= 2 and plain.schedule.phase > 2 * plain.schedule.per_epoch


def test_plain_draws_resume_mid_epoch(store_path):
    episodes = list(range(len(LENGTHS)))
    with TrajectoryStore(store_path) as store:
        a, sa = make(store, episodes), PhiloxStream(9, block=512)
        rows = [a.draw_plain(sa, 8)[1] for _ in range(80)]
        b, sb = make(store, episodes), PhiloxStream(9, block=512)
        for _ in range(29):
            b.draw_plain(sb, 8)
        state, position = b.state_dict(), int(sb.position)
        b.close()
        c, sc = make(store, episodes), PhiloxStream(9, block=512)
        c.load_state_dict(state)
        sc.seek(position)
        resumed = [c.draw_plain(sc, 8)[1] for _ in range(51)]
        a.close()
        c.close()
    assert state["phase"] > 0
    assert all(torch.equal(x, y) for x, y in zip(rows[29:], resumed))


def test_plain_draws_return_new_tensors(store_path):
    """Editing a batch's rows in place changes neither the stream nor the next draws."""
    episodes = list(range(len(LENGTHS)))
    with TrajectoryStore(store_path) as store:
        a, sa = make(store, episodes), PhiloxStream(2, block=512)
        b, sb = make(store, episodes), PhiloxStream(2, block=512)
        for _ in range(50):
            packed, row = a.draw_plain(sa, 8)
            expected = b.draw_plain(sb, 8)
            assert torch.equal(packed, expected[0]) and torch.equal(row, expected[1])
            packed.fill_(-1)
            row.fill_(-1)
        sa.seek(0)
        sb.seek(0)
        assert torch.equal(a.draw_plain(sa, 8)[1], b.draw_plain(sb, 8)[1])
        a.close()
        b.close()


def test_a_block_streams_draws_are_mapped_ahead(store_path):
    """A block-mode stream hands the window a view of its block, which the run lookup maps
    once for the phase's next batches instead of once a batch."""
    with TrajectoryStore(store_path) as store:
        window = make(store, list(range(len(LENGTHS))), k=9, budget=400)
        stream = PhiloxStream(5, block=256)
        window.draw_plain(stream, 8)
        ahead = window._ahead
        assert ahead is not None and window.schedule.left > 0
        window.draw_plain(stream, 8)
        assert window._ahead is ahead
        window.close()


@pytest.mark.parametrize(
    "episodes, kw",
    [
        (list(range(len(LENGTHS))), {}),
        (list(range(0, len(LENGTHS), 2)), {}),
        (list(range(len(LENGTHS))), {"rank": 1, "world_size": 2, "reuse": 3}),
    ],
)
def test_drawn_and_gathered_in_one_call_are_the_plain_draws(store_path, episodes, kw):
    """``draw_plain_gathered`` (the compiled draw, run lookup and gather) gives the stream
    positions, store rows and row bytes of ``draw_plain`` and a gather, over phase changes
    and epochs."""
    with TrajectoryStore(store_path) as store:
        fused, plain = make(store, episodes, **kw), make(store, episodes, **kw)
        sf, sp = PhiloxStream(5, block=256), PhiloxStream(5, block=256)
        for _ in range(300):
            source = fused.packed.block_arrays()[0]
            row, gathered = fused.draw_plain_gathered(sf, 8, source)
            packed, expected_row = plain.draw_plain(sp, 8)
            assert torch.equal(row, expected_row)
            np.testing.assert_array_equal(gathered, plain.packed.block_arrays()[0][packed.numpy()])
            assert int(sf.position) == int(sp.position)
            assert fused.state_dict() == plain.state_dict()
        assert plain.schedule.epoch >= 1
        fused.close()
        plain.close()


def test_drawn_and_gathered_needs_the_compiled_path(store_path, monkeypatch):
    """Without a block-mode stream or with the kernels off it draws nothing and says so."""
    from torchstore.samplers import philox

    with TrajectoryStore(store_path) as store:
        window = make(store, list(range(len(LENGTHS))))
        source = window.packed.block_arrays()[0]
        stream = PhiloxStream(5)  # not in block mode
        assert window.draw_plain_gathered(stream, 8, source) is None
        assert int(stream.position) == 0 and window.schedule.phase == 0
        monkeypatch.setattr(philox, "KERNELS", False)
        block_stream = PhiloxStream(5, block=256)
        assert window.draw_plain_gathered(block_stream, 8, source) is None
        assert int(block_stream.position) == 0
        window.close()
