"""A windowed DataModule over a store whose camera column is kept as AV1 packets.

The window's refill decodes each block's frames (on its background thread) into the
resident slots: batches hold exactly the frames a plain read of the store decodes, every
episode and frame is drawn, and a Lightning ``Trainer`` fits from a store ten times the
window's budget.
"""

from __future__ import annotations

import threading

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning_fixtures import QUIET
from torch import nn

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.lightning import OfflineDataModule

H, W = 24, 32
EPISODES, STEPS = 12, 25


def _frames(episode: int, n: int) -> np.ndarray:
    """Smooth moving gradients: camera-like enough for a codec, cheap to make."""
    y, x = np.mgrid[0:H, 0:W]
    t = np.arange(n)[:, None, None]
    base = (x[None] * 6 + y[None] * 3 + t * 4 + episode * 17) % 256
    return np.stack([base, (base + 85) % 256, (255 - base)], axis=-1).astype(np.uint8)


def _windowed(path, **kw) -> OfflineDataModule:
    """A windowed data module of flat batches, no validation split."""
    return OfflineDataModule(path, device="cpu", val_episodes=0, layout="flat", **kw)


@pytest.fixture(scope="module")
def camera_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cameras") / "cam.h5"
    columns = [
        ColumnSpec("obs", torch.float32, (3,)),
        ColumnSpec("cam", torch.uint8, (H, W, 3), codec="av1"),
        ColumnSpec("action", torch.float32, (1,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("done", torch.bool),
    ]
    with TrajectoryStoreWriter(path, columns) as w:
        for e in range(EPISODES):
            rows = np.arange(STEPS, dtype=np.float32) + 100 * e
            w.add_episode(
                {
                    "obs": np.stack([rows, rows, rows], axis=1),
                    "cam": _frames(e, STEPS),
                    "action": rows[:, None],
                    "reward": rows,
                    "done": np.arange(STEPS) == STEPS - 1,
                }
            )
    return path


@pytest.fixture(scope="module")
def decoded(camera_store):
    with TrajectoryStore(camera_store) as store:
        return torch.from_numpy(store.read_column("cam", 0, store.num_rows))


def test_window_batches_hold_the_decoded_frames_of_their_rows(camera_store, decoded):
    dm = _windowed(camera_store, batch_size=16, resident=60, resident_blocks=2, steps_per_epoch=40)
    dm.setup("fit")
    seen = []
    for batch in dm.train_dataloader():
        rows = batch["index"]
        assert torch.equal(batch["cam"], decoded[rows])
        assert torch.equal(batch["obs"][:, 0], batch["reward"])
        seen.append(rows)
    seen = torch.cat(seen)
    assert len(seen) == 40 * 16
    # the window went round the store: every episode was drawn from
    assert set((seen // STEPS).tolist()) == set(range(EPISODES))
    stats = dm.window.stats
    assert stats["refills"] >= 3 and stats.get("decoded_reads", 0) >= 3


@pytest.mark.timeout(120)
def test_the_next_block_starts_decoding_before_the_phase_change(camera_store, decoded, monkeypatch):
    """At a phase's end, while the block the next phase brings in is still decoding, the
    window starts reading the block after it (into the slot the next phase frees), so the
    decode threads never wait for the phase change; every batch still holds its rows'
    frames. The first background read is held until a second read starts beside it: the
    early read (without it, the hold ends after 5 s and the test fails)."""
    from torchstore.data.residency import block_read

    read_block = block_read.ChunkReader.read_block
    state = {"reading": 0, "held": False}
    lock, beside = threading.Lock(), threading.Event()

    def held_read(self, lo, hi, outs):
        with lock:
            if state["reading"]:
                beside.set()
            state["reading"] += 1
            hold = threading.current_thread().name.startswith("torchstore-refill")
            hold, state["held"] = hold and not state["held"], state["held"] or hold
        try:
            if hold:
                beside.wait(5)
            return read_block(self, lo, hi, outs)
        finally:
            with lock:
                state["reading"] -= 1

    monkeypatch.setattr(block_read.ChunkReader, "read_block", held_read)
    dm = _windowed(camera_store, batch_size=16, resident=60, resident_blocks=2, steps_per_epoch=40)
    dm.setup("fit")
    for batch in dm.train_dataloader():
        assert torch.equal(batch["cam"], decoded[batch["index"]])
    assert beside.is_set()
    assert dm.window.stats["refills"] >= 6
    dm.close()


class _CameraPolicy(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(H * W * 3, 1)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        x = batch["cam"].flatten(1).float() / 255
        self.steps += 1
        return nn.functional.mse_loss(self.layer(x), batch["action"] / 1000)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_trainer_fits_from_an_encoded_store_ten_times_the_window(camera_store):
    row_bytes = H * W * 3 + 4 * 3 + 4 + 4 + 1
    budget = EPISODES * STEPS * row_bytes // 10
    dm = _windowed(camera_store, batch_size=8, resident=f"{budget}B", steps_per_epoch=30)
    model = _CameraPolicy()
    trainer = pl.Trainer(max_epochs=2, **QUIET)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 60 and model.steps == 60
    window = dm.window
    # the budget counts decoded bytes: the slots hold decoded frames
    assert window.packed.nbytes <= budget + 4 * window.packed.row_bytes
    assert len(window.blocks) >= 10 and window.stats["refills"] >= len(window.blocks)


@pytest.mark.timeout(120)
def test_a_packet_that_does_not_decode_ends_the_refill_with_its_error(tmp_path):
    """The refill thread's decode fails: the training thread gets that error, never a hang."""
    from torchstore.errors import FrameCodecError
    from torchstore.io.frames.codec import EncodedFrames, FrameCodec, encode_frames

    columns = [
        ColumnSpec("cam", torch.uint8, (H, W, 3), codec=FrameCodec("av1", gop=8)),
        ColumnSpec("action", torch.float32, (1,)),
    ]
    with TrajectoryStoreWriter(tmp_path / "bad.h5", columns) as w:
        for e in range(EPISODES):
            good = encode_frames(FrameCodec("av1", gop=8), _frames(e, STEPS))
            packets = list(good.packets)
            if e == EPISODES - 1:  # damaged at the source: passes its checksum, not the decoder
                packets[10] = bytes(len(packets[10]))
            cam = EncodedFrames(good.codec, good.info, packets, good.keyframes)
            w.add_episode({"cam": cam, "action": np.zeros((STEPS, 1), np.float32)})
    dm = _windowed(
        tmp_path / "bad.h5", batch_size=8, resident=60, resident_blocks=2, steps_per_epoch=200
    )
    dm.setup("fit")
    with pytest.raises(FrameCodecError, match=f"column 'cam' episode {EPISODES - 1}: frame"):
        for _ in dm.train_dataloader():
            pass
