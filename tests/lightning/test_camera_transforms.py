"""Camera transforms in the DataModules: frames resized once as they are decoded, training
batches augmented on their device per sample, validation batches left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _camera_frames import camera_frames  # noqa: E402

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.errors import ArgumentError  # noqa: E402
from torchstore.io.frames.codec import FrameCodec  # noqa: E402
from torchstore.io.frames.resize import FrameResize  # noqa: E402
from torchstore.lightning import DemonstrationDataModule, OfflineDataModule  # noqa: E402
from torchstore.lightning.augment import ColorJitter, RandomShift  # noqa: E402

H, W, EPISODES, STEPS = 60, 80, 4, 30


def _store(path: Path, codec: FrameCodec | None) -> Path:
    columns = [
        ColumnSpec("cam", torch.uint8, (H, W, 3), codec=codec),
        ColumnSpec("state", torch.float32, (3,)),
        ColumnSpec("action", torch.float32, (2,)),
    ]
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(path, columns) as writer:
        for e in range(EPISODES):
            writer.add_episode(
                {
                    "cam": camera_frames(STEPS, H, W, episode=e),
                    "state": rng.normal(size=(STEPS, 3)).astype(np.float32),
                    "action": rng.normal(size=(STEPS, 2)).astype(np.float32),
                }
            )
    return path


@pytest.fixture(scope="module", params=["raw", "av1"])
def store(request, tmp_path_factory) -> Path:
    codec = None if request.param == "raw" else FrameCodec("av1", gop=4)
    return _store(tmp_path_factory.mktemp("cams") / "s.h5", codec)


def _demo(store: Path, **kw) -> DemonstrationDataModule:
    options = dict(
        batch_size=16, obs_keys=["cam", "state"], action_keys=["action"], n_obs_steps=2,
        action_horizon=4, device="cpu", stats_cache=False, seed=7,
    )  # fmt: skip
    options.update(kw)
    dm = DemonstrationDataModule(store, **options)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("resident", ["all", "3MB"])
def test_batches_hold_the_frames_the_store_gives_resized(store, resident):
    resize = FrameResize(30, 40, crop=(0, 10, 60, 60))
    dm = _demo(store, resident=resident, resize={"cam": resize})
    try:
        batch = next(iter(dm.train_dataloader()))
        frames, rows = batch["obs", "cam"], batch["index"]
        assert frames.shape == (16, 2, 30, 40, 3) and frames.dtype == torch.uint8
        source = TrajectoryStore(store)
        for b in range(4):  # step t's frame is the store's frame resized, exactly
            t = int(rows[b])
            expected = source.read_column("cam", t, t + 1, resize=resize)[0]
            assert np.array_equal(frames[b, -1].numpy(), expected)
        source.close()
        if dm.window is not None:  # a budget holds resized rows: more of them
            full = _demo(store, resident=resident)
            assert dm.window.budget_rows > 2 * full.window.budget_rows
            full.close()
    finally:
        dm.close()


def test_resized_windowed_and_resident_batches_are_equal(store):
    batches = []
    for resident in ("all", "1MB"):
        dm = _demo(store, resident=resident, resize=[24, 32], val_episodes=1)
        val = next(iter(dm.val_dataloader()))
        batches.append(val["obs", "cam"])
        dm.close()
    assert batches[0].shape[-3:] == (24, 32, 3)
    assert torch.equal(batches[0], batches[1])


def test_augmentations_apply_per_sample_to_training_batches_only(store):
    plain = _demo(store, val_episodes=1)
    shifted = _demo(store, val_episodes=1, augment={"cam": [RandomShift(6)]})
    a, b = next(iter(plain.train_dataloader())), next(iter(shifted.train_dataloader()))
    assert torch.equal(a["index"], b["index"])  # augmenting draws nothing from the stream
    moved = (a["obs", "cam"] != b["obs", "cam"]).flatten(1).any(1)
    assert moved.sum() >= 12  # 1 sample in 169 draws no shift
    # one shift per sample, shared by its history: the two frames moved alike
    sample = b["obs", "cam"][0]
    again = RandomShift(0)(a["obs", "cam"][0].movedim(-1, -3))
    assert again.shape == sample.movedim(-1, -3).shape
    assert torch.equal(next(iter(plain.val_dataloader()))["obs", "cam"],
                       next(iter(shifted.val_dataloader()))["obs", "cam"])  # fmt: skip
    # a resumed copy augments its next batches as the original does
    state = shifted.state_dict()
    original = next(iter(shifted.train_dataloader()))
    resumed = _demo(store, val_episodes=1, augment={"cam": [RandomShift(6)]})
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed.train_dataloader()))["obs", "cam"], original["obs", "cam"])
    for dm in (plain, shifted, resumed):
        dm.close()


def test_random_shift_is_replicate_pad_then_crop():
    frames = torch.randint(0, 255, (5, 2, 3, 12, 10), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(3)
    out = RandomShift(3)(frames, generator)
    shift = torch.randint(-3, 4, (2, 5), generator=torch.Generator().manual_seed(3))
    padded = torch.nn.functional.pad(frames.flatten(0, 1).float(), (3, 3, 3, 3), mode="replicate")
    padded = padded.unflatten(0, (5, 2)).to(torch.uint8)
    for b in range(5):
        dy, dx = int(shift[0, b]) + 3, int(shift[1, b]) + 3
        assert torch.equal(out[b], padded[b, :, :, dy : dy + 12, dx : dx + 10])


def test_colour_jitter_keeps_dtype_and_range_and_is_identity_at_zero():
    frames = torch.randint(0, 255, (6, 3, 8, 8), dtype=torch.uint8)
    assert torch.equal(ColorJitter()(frames), frames)
    out = ColorJitter(0.5, 0.5, 0.5)(frames, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and not torch.equal(out, frames)
    means = out.float().mean(dim=(1, 2, 3)) / frames.float().mean(dim=(1, 2, 3))
    assert means.std() > 0.01  # every sample its own factors


def test_any_callable_on_channels_first_frames_augments(store):
    seen = []

    def invert(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return 255 - x

    dm = OfflineDataModule(store, batch_size=8, device="cpu", resize=[20, 20], augment=invert)
    plain = OfflineDataModule(store, batch_size=8, device="cpu", resize=[20, 20])
    dm.setup("fit")
    plain.setup("fit")
    a, b = next(iter(dm.train_dataloader())), next(iter(plain.train_dataloader()))
    assert seen == [(8, 3, 20, 20)]
    assert torch.equal(a["cam"], 255 - b["cam"]) and torch.equal(a["state"], b["state"])


def test_bad_transform_options_are_refused_naming_the_column(store):
    with pytest.raises(ArgumentError, match="'state' holds \\[3\\] rows"):
        _demo(store, resize={"state": [8, 8]})
    with pytest.raises(ArgumentError, match="'state' is not a camera column"):
        _demo(store, augment={"state": RandomShift(2)})
    with pytest.raises(ArgumentError, match="is not callable"):
        _demo(store, augment={"cam": ["shift"]})
    with pytest.raises(ArgumentError, match="returned"):
        dm = _demo(store, augment=lambda x: x[:, 0])
        next(iter(dm.train_dataloader()))


def test_torchrl_replay_buffer_over_a_window_storage_samples_resized_frames(store):
    from torchrl.data import TensorDictReplayBuffer

    from torchstore.window import WindowSampler, WindowStorage

    storage = WindowStorage(store, resident="1MB", resize={"cam": [20, 24]})
    try:
        buffer = TensorDictReplayBuffer(
            storage=storage, sampler=WindowSampler(storage), batch_size=8
        )
        batch, info = buffer.sample(return_info=True)
        assert batch["cam"].shape == (8, 20, 24, 3) and batch["cam"].dtype == torch.uint8
        row = int(info["index"][0])
        with TrajectoryStore(store) as source:
            expected = source.read_column("cam", row, row + 1, resize=FrameResize(20, 24))
        assert np.array_equal(batch["cam"][0].numpy(), expected[0])
    finally:
        storage.close()
