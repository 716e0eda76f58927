"""Quantised columns refuse what uint8 codes cannot hold, in the store writer and the replay
ring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import ColumnError


def _columns(clip=False):
    return [
        ColumnSpec("pix", torch.float32, (3,), quantize=Quantize(0.0, 1.0, clip=clip)),
        ColumnSpec("done", torch.bool),
    ]


@pytest.mark.parametrize(
    "bad, match",
    [
        (float("nan"), "column 'pix' holds NaN"),
        (255.0, "column 'pix' holds 255, outside"),
        (float("inf"), "outside"),
    ],
)
def test_the_writer_refuses_and_keeps_what_was_committed(tmp_path, bad, match):
    path = tmp_path / "q.h5"
    good = np.full((4, 3), 0.5, np.float32)
    with TrajectoryStoreWriter(path, _columns()) as w:
        w.add_episode({"pix": good, "done": np.zeros(4, bool)})
        values = good.copy()
        values[2, 1] = bad
        with pytest.raises(ColumnError, match=match):
            w.add_episode({"pix": values, "done": np.zeros(4, bool)})
        assert w.pending_rows == 0
    with TrajectoryStore(path) as store:
        assert store.num_rows == 4
        assert store.read_slab(0, 4)["pix"].tolist() == torch.full((4, 3), 128 / 255).tolist()


def test_clip_is_an_explicit_opt_in_and_survives_resume(tmp_path):
    path = tmp_path / "q.h5"
    with TrajectoryStoreWriter(path, _columns(clip=True)) as w:
        w.add_episode({"pix": np.array([[-5, 0.5, 300]], np.float32), "done": np.zeros(1, bool)})
    with TrajectoryStoreWriter.resume(path) as w:
        assert w.columns[0].quantize.clip
        w.add_episode({"pix": np.array([[2, 2, 2]], np.float32), "done": np.zeros(1, bool)})
    with TrajectoryStore(path) as store:
        assert store.read_slab(0, 2, raw=True)["pix"].tolist() == [[0, 128, 255], [255, 255, 255]]


def test_the_replay_ring_refuses_nan_and_out_of_range_rows_without_writing():
    from torchrl.data import TensorDictReplayBuffer

    ring = StoreReplay(8, columns=_columns())
    rb = TensorDictReplayBuffer(storage=ring)
    ok = TensorDict(
        {"pix": torch.full((3, 3), 0.25), "done": torch.zeros(3, dtype=torch.bool)}, [3]
    )
    rb.extend(ok)
    before = ring.packed.blocks[0].clone()
    for bad in (float("nan"), 2.0):
        rows = ok.clone()
        rows["pix"][1, 2] = bad
        with pytest.raises(ColumnError, match="column 'pix' holds"):
            rb.extend(rows)
    assert len(ring) == 3 and torch.equal(ring.packed.blocks[0], before)
    clipping = StoreReplay(8, columns=_columns(clip=True))
    rows = ok.clone()
    rows["pix"][1, 2] = 2.0
    TensorDictReplayBuffer(storage=clipping).extend(rows)
    assert clipping.get(torch.tensor([1]))["pix"][0, 2].item() == 1.0
