"""A recorder faster than its codec: ``append`` to an encoded column waits once
``MAX_QUEUED_FRAMES`` frames wait for the encoding thread, so memory stays bounded instead
of growing by a copied frame per step (an unbounded queue grew 353 MiB in 400 appends of
480x640 frames to an AV1 column)."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.file.encoded import MAX_QUEUED_FRAMES
from torchstore.errors import FrameCodecError
from torchstore.io.frames.codec import FrameCodec, FrameEncoder

H, W = 120, 160
FRAMES = 6 * MAX_QUEUED_FRAMES


@pytest.fixture
def slow_codec(monkeypatch):
    """PNG encoding that takes 3 ms a frame: far slower than a recorder's append."""
    real = FrameEncoder.add

    def slow_add(self, frames):
        time.sleep(0.003 * len(frames))
        real(self, frames)

    monkeypatch.setattr(FrameEncoder, "add", slow_add)


def _columns() -> list[ColumnSpec]:
    return [ColumnSpec("cam", torch.uint8, (H, W, 3), codec=FrameCodec.png())]


def test_appends_faster_than_the_codec_hold_a_bounded_number_of_frames(tmp_path, slow_codec):
    frames = np.zeros((FRAMES, H, W, 3), np.uint8)  # tiny packets: the frames are the memory
    frames[:, :, :, 0] = np.arange(FRAMES, dtype=np.uint8)[:, None, None]
    frame_bytes = frames[0].nbytes
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns()) as w:
        w.add_episode({"cam": frames[:2]})  # the codec's modules load outside the measure
        enc = w._encoded["cam"]
        queued = []
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            for t in range(FRAMES):
                w.append({"cam": frames[t : t + 1]})  # a recorder's step: one frame
                queued.append(enc.queued_frames)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        w.end_episode()
    assert max(queued) <= MAX_QUEUED_FRAMES
    # the frames waiting, the one in hand, the episode's packets and the jobs' bookkeeping
    # (about 71 frames' worth measured); an unbounded queue held all of them
    assert peak < (MAX_QUEUED_FRAMES + 16) * frame_bytes, (peak / frame_bytes, max(queued))
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert np.array_equal(store.read_column("cam", 2, 2 + FRAMES), frames)


def test_a_chunk_larger_than_the_bound_waits_for_an_empty_queue(tmp_path, slow_codec):
    chunk = MAX_QUEUED_FRAMES + 10
    frames = np.random.default_rng(0).integers(0, 256, (2 * chunk, H, W, 3), dtype=np.uint8)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns()) as w:
        enc = w._encoded["cam"]
        w.append({"cam": frames[:chunk]})
        assert enc.queued_frames == chunk
        w.append({"cam": frames[chunk:]})
        assert enc.queued_frames == chunk  # the first chunk was encoded before this one queued
        w.end_episode()
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert np.array_equal(store.read_column("cam", 0, 2 * chunk), frames)


def test_an_encoder_error_met_while_waiting_names_the_column(tmp_path, monkeypatch):
    real = FrameEncoder.add

    def failing_add(self, frames):
        if self.frames >= 3:
            raise FrameCodecError(f"frame {self.frames}: the encoder failed", self.frames)
        real(self, frames)

    monkeypatch.setattr(FrameEncoder, "add", failing_add)
    frame = np.zeros((1, H, W, 3), np.uint8)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns()) as w:
        with pytest.raises(FrameCodecError, match="column 'cam': frame 3: the encoder failed"):
            for _ in range(MAX_QUEUED_FRAMES + 5):  # the queue fills: append waits, sees it
                w.append({"cam": frame})
            w.end_episode()
        assert w.pending_rows == 0  # the episode was dropped, the writer goes on
        w.add_episode({"cam": np.zeros((2, H, W, 3), np.uint8)})
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_episodes == 1 and store.num_rows == 2
