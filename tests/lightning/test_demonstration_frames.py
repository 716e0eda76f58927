"""Per-column frame offsets in DemonstrationDataModule (LeRobot's delta_timestamps).

The store's rows say which episode and step they are, so every gathered frame can be
checked against the offset asked for: clamped into ``t``'s episode, padded exactly where
``t + offset`` leaves it, resident or windowed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.data import ColumnSpec, TrajectoryStoreWriter
from torchstore.errors import ArgumentError, ArgumentTypeError
from torchstore.lightning import DemonstrationDataModule

TAGGED = (
    ColumnSpec("cam", torch.uint8, (4, 6, 3)),  # [0, 0, 0] = episode, [0, 0, 1] = step
    ColumnSpec("state", torch.float32, (2,)),  # (episode, step)
    ColumnSpec("act", torch.float32, (2,)),  # (episode, step + 0.5)
)


def write_tagged(path: Path, lengths, fps: float | None = None) -> Path:
    metadata = {} if fps is None else {"lerobot": {"fps": fps}}
    with TrajectoryStoreWriter(path, TAGGED, overwrite=True, metadata=metadata) as w:
        for e, n in enumerate(lengths):
            step = torch.arange(n, dtype=torch.float32)
            tag = torch.stack([torch.full((n,), float(e)), step], 1)
            cam = torch.zeros(n, 4, 6, 3, dtype=torch.uint8)
            cam[:, :, :, 0] = e
            cam[:, :, :, 1] = torch.arange(n, dtype=torch.uint8)[:, None, None]
            w.add_episode({"cam": cam, "state": tag, "act": tag + torch.tensor([0.0, 0.5])})
    return path


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    return write_tagged(tmp_path_factory.mktemp("offsets") / "tagged.h5", (7, 12, 3, 9), fps=10)


def make(path, **kw):
    kw.setdefault("batch_size", 64)
    kw.setdefault("obs_keys", ["cam", "state"])
    kw.setdefault("action_keys", ["act"])
    kw.setdefault("steps_per_epoch", 2)
    kw.setdefault("device", "cpu")
    kw.setdefault("normalize", False)
    kw.setdefault("stats_cache", False)
    return DemonstrationDataModule(path, **kw)


def first(dm):
    batch = next(iter(dm.train_dataloader()))
    dm.close()
    return batch


def check_frames(batch, offsets: dict, lengths) -> None:
    """Every column's frames: ``t + offset`` clamped to t's episode, pad where it left."""
    starts = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    episode = batch["episode"]
    t_step = batch["index"] - starts[episode]
    length = torch.as_tensor(lengths)[episode].unsqueeze(1)
    for name, offs in offsets.items():
        want = t_step.unsqueeze(1) + torch.as_tensor(offs)
        pad = (want < 0) | (want >= length)
        step = torch.minimum(want.clamp(min=0), length - 1)
        assert torch.equal(batch[f"{name}_is_pad"], pad), name
        role = "action" if name == "act" else "obs"
        leaf = batch[role, name]
        assert leaf.shape[:2] == (len(episode), len(offs)), name
        if name == "cam":
            got_episode, got_step = leaf[:, :, 2, 3, 0].long(), leaf[:, :, 1, 5, 1].long()
        else:
            got_episode, got_step = leaf[..., 0].long(), leaf[..., 1].floor().long()
        assert torch.equal(got_episode, episode.unsqueeze(1).expand_as(want)), name
        assert torch.equal(got_step, step), name


# ------------------------------------------------------------------ frames and pads
@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    cam=st.lists(st.integers(-15, 15), min_size=1, max_size=4),
    act=st.lists(st.integers(-3, 20), min_size=1, max_size=12),
    windowed=st.booleans(),
)
def test_frames_stay_in_the_episode_and_pads_mark_where_offsets_left_it(
    lengths, cam, act, windowed
):
    """Windows never cross an episode; ``<key>_is_pad`` is True exactly where ``t + offset``
    is outside it; resident or with a budget (whole episodes resident)."""
    offsets = {"cam": cam, "act": act, "state": [0]}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tagged(Path(tmp) / "tagged.h5", lengths)
        if windowed:  # whole episodes in blocks of 2 * max(lengths) rows; small batches
            budget = {"resident": 2 * max(lengths) * 3, "resident_blocks": 2, "batch_size": 1}
            dm = make(path, frame_offsets=offsets, steps_per_epoch=16, **budget)
            batches = list(dm.train_dataloader())
            dm.close()
        else:
            batches = [first(make(path, frame_offsets=offsets))]
        for batch in batches:
            check_frames(batch, offsets, lengths)


def test_layout_of_a_per_column_batch(tagged):
    offsets = {"cam": [-10, -5, 0], "act": range(50)}
    batch = first(make(tagged, frame_offsets=offsets))
    assert set(batch.keys()) == {
        "obs", "action", "cam_is_pad", "state_is_pad", "act_is_pad", "index", "episode",
    }  # fmt: skip
    assert (
        batch["obs", "cam"].shape == (64, 3, 4, 6, 3) and batch["obs", "cam"].dtype == torch.uint8
    )
    assert batch["obs", "state"].shape == (64, 1, 2)  # not listed: n_obs_steps (1)
    assert batch["action", "act"].shape == (64, 50, 2)
    assert batch["act_is_pad"].shape == (64, 50) and batch["act_is_pad"].dtype == torch.bool
    check_frames(batch, {"cam": [-10, -5, 0], "act": list(range(50)), "state": [0]}, (7, 12, 3, 9))


def test_unlisted_columns_keep_their_roles_table(tagged):
    batch = first(make(tagged, n_obs_steps=3, action_horizon=4, frame_offsets={"cam": [0]}))
    check_frames(batch, {"cam": [0], "state": [-2, -1, 0], "act": [0, 1, 2, 3]}, (7, 12, 3, 9))
    assert "obs_mask" not in batch.keys()


def test_n_obs_steps_and_action_horizon_are_a_table_of_offsets(tagged):
    """The old arguments give the same frames as the offsets table they stand for, with
    the role masks (True on real steps) in place of the pad masks."""
    old = first(make(tagged, n_obs_steps=2, action_horizon=5, seed=3))
    table = {"cam": [-1, 0], "state": [-1, 0], "act": range(5)}
    new = first(make(tagged, frame_offsets=table, seed=3))
    assert torch.equal(old["index"], new["index"])
    for key in (("obs", "cam"), ("obs", "state"), ("action", "act")):
        assert torch.equal(old[key], new[key])
    assert torch.equal(old["obs_mask"], ~new["cam_is_pad"])
    assert torch.equal(old["action_mask"], ~new["act_is_pad"])


def test_delta_timestamps_at_the_recorded_fps(tagged):
    """Seconds at the store's fps (a LeRobot import records it): 0.1 s is one frame at 10."""
    seconds = {"cam": [-1.0, -0.1, 0.0], "act": [i / 10 for i in range(8)]}
    frames = {"cam": [-10, -1, 0], "act": range(8)}
    by_time = make(tagged, delta_timestamps=seconds, seed=5)
    assert by_time.frame_offsets == {"cam": (-10, -1, 0), "act": tuple(range(8))}
    a, b = first(by_time), first(make(tagged, frame_offsets=frames, seed=5))
    for key in ("cam_is_pad", "act_is_pad", ("obs", "cam"), ("action", "act")):
        assert torch.equal(a[key], b[key])


def test_fps_argument_wins_over_the_recorded_one(tagged):
    dm = make(tagged, delta_timestamps={"act": [0.0, 0.05, 0.1]}, fps=20)
    assert dm.frame_offsets == {"act": (0, 1, 2)}


def test_windowed_validation_batches_take_the_frames_too(tmp_path):
    lengths = (7, 12, 3, 9, 5)
    path = write_tagged(tmp_path / "t.h5", lengths)
    offsets = {"cam": [-4, 0], "act": [0, 2, 4, 8], "state": [0]}
    dm = make(path, frame_offsets=offsets, resident=40, resident_blocks=2, val_episodes=2)
    batches = list(dm.val_dataloader())
    dm.close()
    assert torch.cat([b["index"] for b in batches]).tolist() == list(range(22, 36))
    for batch in batches:
        check_frames(batch, offsets, lengths)


# ------------------------------------------------------------------ refusals
def test_an_offset_off_the_frame_grid_names_the_key_and_value(tagged):
    with pytest.raises(ArgumentError, match=r"delta_timestamps\['act'\] holds 0\.05 s"):
        make(tagged, delta_timestamps={"act": [0.0, 0.05]})
    # within tolerance_s of a frame: taken
    dm = make(tagged, delta_timestamps={"act": [0.10004]}, tolerance_s=1e-3)
    assert dm.frame_offsets == {"act": (1,)}


def test_delta_timestamps_need_a_frame_rate(tmp_path):
    path = write_tagged(tmp_path / "no_fps.h5", (4, 5))
    with pytest.raises(ArgumentError, match="records no frame rate .*; pass fps="):
        make(path, delta_timestamps={"act": [0.0]})
    assert make(path, delta_timestamps={"act": [0.0, 0.5]}, fps=2).frame_offsets == {"act": (0, 1)}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"frame_offsets": {"act": [0]}, "delta_timestamps": {"act": [0.0]}},
            ArgumentError,
            "not both",
        ),
        ({"frame_offsets": {"nope": [0]}}, ArgumentError, "'nope' is in neither obs_keys"),
        ({"frame_offsets": {"act": [0.5]}}, ArgumentTypeError, "not a whole number of frames"),
        ({"frame_offsets": {"act": []}}, ArgumentError, "at least one offset"),
        ({"frame_offsets": {"act": 3}}, ArgumentTypeError, "must be a list of offsets"),
        ({"frame_offsets": ["act"]}, ArgumentTypeError, "must be a non-empty mapping"),
        (
            {"frame_offsets": {"cam": [0]}, "obs_keys": ["cam", "state"], "action_keys": ["state"]},
            ArgumentError,
            "'state' is in obs_keys and action_keys",
        ),
    ],
)
def test_bad_offset_tables_are_refused(tagged, kwargs, error, match):
    with pytest.raises(error, match=match):
        make(tagged, **kwargs)
