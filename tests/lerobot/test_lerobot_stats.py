"""Tests of torchstore.lerobot.stats: exact per-episode stats, aggregation, stats.json I/O."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.stats import (
    QUANTILES,
    STAT_NAMES,
    ImageStatsAccumulator,
    RunningStats,
    aggregate_features,
    aggregate_stats,
    numeric_stats,
    stats_from_json,
    stats_to_json,
)


def histogram_quantile(column: np.ndarray, q: float) -> float:
    """lerobot 0.6's quantile, written out step by step: 5000 bins over the padded range,
    walk the bins until the running count reaches q * count, interpolate inside that bin."""
    # lerobot 0.6 first promotes to result_type(dtype, float32): bool, uint8 and float32 data
    # get float32 edges, int64 and float64 data float64 edges
    column = column.astype(np.result_type(column.dtype, np.float32))
    lo, hi = column.min(), column.max()
    edges = np.linspace(lo - 1e-10, hi + 1e-10, 5001)
    counts, _ = np.histogram(column, bins=edges)
    target, running = q * len(column), 0
    for k, c in enumerate(counts):
        if running + c >= target:
            if k == 0:
                return edges[0]
            if c == 0:
                return edges[k]
            return edges[k] + (target - running) / c * (edges[k + 1] - edges[k])
        running += c
    return edges[-1]


def reference_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Stats computed the obvious way with numpy, reducing every axis but the last."""
    raw = np.asarray(values)
    raw = raw[:, None] if raw.ndim == 1 else raw.reshape(-1, raw.shape[-1])
    x = raw.astype(np.float64)
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
        "count": np.array([len(values)]),
    }
    for name, q in QUANTILES.items():
        if len(values) < 2:
            out[name] = out["mean"]
        else:
            out[name] = np.array([histogram_quantile(raw[:, k], q) for k in range(x.shape[1])])
    return out


def assert_stats_close(got, want, rtol=1e-12, atol=0.0):
    assert list(got) == list(STAT_NAMES)
    for name in STAT_NAMES:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def test_constants():
    assert STAT_NAMES == ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
    assert QUANTILES == {"q01": 0.01, "q10": 0.10, "q50": 0.5, "q90": 0.9, "q99": 0.99}


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((300, 14), np.float32),
        ((57,), np.float64),
        ((1, 6), np.float32),
        ((40, 1), np.float32),
        ((33, 4, 5), np.float64),
        ((25, 3), np.int64),
        ((25,), np.int64),
        ((31, 7), np.bool_),
        ((9, 2), np.uint8),
    ],
)
def test_numeric_stats_match_numpy(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    if dtype == np.bool_:
        values = rng.random(shape) < 0.3
    elif np.issubdtype(dtype, np.integer):
        values = rng.integers(0, 200, shape).astype(dtype)
    else:
        values = (rng.standard_normal(shape) * 10 + 3).astype(dtype)
    got = numeric_stats(values)
    want = reference_stats(values)
    assert_stats_close(got, want)
    expected_shape = shape[-1:] if len(shape) > 1 else (1,)  # every axis but the last reduced
    for name in STAT_NAMES:
        assert got[name].dtype == (np.int64 if name == "count" else np.float64)
        assert got[name].shape == ((1,) if name == "count" else expected_shape)
    assert got["count"].tolist() == [shape[0]]


def test_numeric_stats_default_feature_shapes():
    n = 12
    frame_index = np.arange(n, dtype=np.int64)
    timestamp = (frame_index / 30).astype(np.float32)
    for values in (frame_index, timestamp, frame_index[:, None]):
        stats = numeric_stats(values)
        assert all(stats[k].shape == (1,) for k in STAT_NAMES)
    stats = numeric_stats(frame_index)
    assert stats["min"].tolist() == [0.0] and stats["max"].tolist() == [11.0]
    # lerobot's histogram: the 6th of 12 values (5) closes the median's bin, whose upper
    # edge is the median; the first value's bin already holds 1 % of the frames
    width = (11 + 2e-10) / 5000
    bin_of_5 = int((5 + 1e-10) / width)
    assert stats["q50"][0] == pytest.approx(-1e-10 + (bin_of_5 + 1) * width, abs=1e-9)
    assert stats["q01"][0] == pytest.approx(-1e-10, abs=1e-15)


def test_stats_of_a_2d_feature_reduce_all_but_the_last_axis():
    """A (2, 3) feature gets stats of shape (3,), counted in frames (lerobot 0.6)."""
    values = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    stats = numeric_stats(values)
    assert {stats[k].shape for k in STAT_NAMES if k != "count"} == {(3,)}
    assert stats["count"].tolist() == [5]
    np.testing.assert_array_equal(stats["min"], [0, 1, 2])
    np.testing.assert_array_equal(stats["max"], [27, 28, 29])
    np.testing.assert_allclose(stats["mean"], values.reshape(-1, 3).mean(0))


def test_bool_min_max_are_floats_through_aggregation_and_json():
    """lerobot 0.6 casts a bool feature to float32 before its stats: min/max are 0.0/1.0."""
    a = numeric_stats(np.array([[True, False], [True, False]]))
    b = numeric_stats(np.array([[True, True]]))
    assert a["min"].dtype == np.float64 and a["min"].tolist() == [1.0, 0.0]
    agg = aggregate_stats([a, b])
    assert agg["min"].tolist() == [1.0, 0.0] and agg["max"].tolist() == [1.0, 1.0]
    data = json.loads(json.dumps(stats_to_json({"grip": agg})))
    assert data["grip"]["min"] == [1.0, 0.0] and data["grip"]["max"] == [1.0, 1.0]
    assert all(type(v) is float for v in data["grip"]["min"] + data["grip"]["max"])
    back = stats_from_json(data)
    assert back["grip"]["max"].dtype == np.float64


def test_bool_stats_quantiles_use_lerobot_06s_float32_histogram():
    """The padded range of a bool column in float32 is [-1e-10, 1.0] (1 + 1e-10 rounds to 1)."""
    values = np.array([True, False, False, True, True, False, True])[:, None]
    got = numeric_stats(values)
    want = reference_stats(values)
    for name in QUANTILES:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    edges = np.linspace(np.float32(0) - 1e-10, np.float32(1) + 1e-10, 5001)
    assert edges.dtype == np.float32 and edges[-1] == 1.0
    # 3 False then 4 True: q99 * 7 = 6.93 falls (6.93 - 3) / 4 of the way into the last bin
    assert got["q99"][0] == pytest.approx(
        float(edges[-2]) + 3.93 / 4 * float(edges[-1] - edges[-2])
    )


# Two episodes of a bool feature of shape [2], [[1, 0], [0, 0], [1, 0], [0, 0]] and
# [[1, 0], [1, 1]]: their stats as lerobot 0.6.1 writes them (compute_episode_stats, then
# serialize_dict, as in the episodes table and stats.json), and its aggregate of the two.
# lerobot 0.4 (and torchstore before it followed 0.6) wrote min/max as booleans.
LEROBOT_06_BOOL_EPISODES = [
    {
        "min": [0.0, 0.0],
        "max": [1.0, 0.0],
        "mean": [0.5, 0.0],
        "std": [0.5, 0.0],
        "count": [4],
        "q01": [-1.000000013351432e-10, 3.9995784462121265e-16],
        "q10": [-1.000000013351432e-10, 3.999578446212126e-15],
        "q50": [-1.000000013351432e-10, 1.9997892231060632e-14],
        "q90": [0.9999599933624268, 3.599620601590914e-14],
        "q99": [0.9999959993362427, 3.959582661750005e-14],
    },
    {
        "min": [1.0, 0.0],
        "max": [1.0, 1.0],
        "mean": [1.0, 0.5],
        "std": [0.0, 0.5],
        "count": [2],
        "q01": [1.0, -1.000000013351432e-10],
        "q10": [1.0, -1.000000013351432e-10],
        "q50": [1.0, -1.000000013351432e-10],
        "q90": [1.0, 0.9999599933624268],
        "q99": [1.0, 0.9999959993362427],
    },
]
LEROBOT_06_BOOL_AGGREGATE = {
    "min": [0.0, 0.0],
    "max": [1.0, 1.0],
    "mean": [0.6666666666666666, 0.16666666666666666],
    "std": [0.4714045207910317, 0.372677996249965],
    "count": [6],
    "q01": [0.33333333326666664, -3.3333067139817986e-11],
    "q10": [0.33333333326666664, -3.3330667392750253e-11],
    "q50": [0.33333333326666664, -3.332000185022702e-11],
    "q90": [0.9999733289082845, 0.3333199977874996],
    "q99": [0.9999973328908286, 0.333331999778774],
}
LEROBOT_06_BOOL_FRAMES = [
    np.array([[1, 0], [0, 0], [1, 0], [0, 0]], dtype=bool),
    np.array([[1, 0], [1, 1]], dtype=bool),
]


def test_bool_episode_stats_are_what_lerobot_06_writes():
    for frames, theirs in zip(LEROBOT_06_BOOL_FRAMES, LEROBOT_06_BOOL_EPISODES, strict=True):
        ours = json.loads(json.dumps(stats_to_json({"grip": numeric_stats(frames)})))["grip"]
        assert ours == theirs


def _as_booleans(stats: dict) -> dict:
    """The same stats with min/max as booleans, as lerobot 0.4 wrote them."""
    return {k: [bool(x) for x in v] if k in ("min", "max") else v for k, v in stats.items()}


def test_stats_written_as_lerobot_06_or_04_aggregate_the_same():
    """A dataset whose episodes were written by lerobot 0.4 (booleans) and extended by
    lerobot 0.6 (floats), or the other way, aggregates to the numbers of an all-0.6 one."""
    as06 = [stats_from_json({"grip": e})["grip"] for e in LEROBOT_06_BOOL_EPISODES]
    as04 = [stats_from_json({"grip": _as_booleans(e)})["grip"] for e in LEROBOT_06_BOOL_EPISODES]
    assert as04[0]["min"].dtype == np.float64 and as04[0]["max"].tolist() == [1.0, 0.0]
    want = aggregate_stats(as06)
    theirs = stats_from_json({"grip": LEROBOT_06_BOOL_AGGREGATE})["grip"]
    for name, value in theirs.items():
        np.testing.assert_allclose(want[name], value, rtol=1e-12, atol=1e-20, err_msg=name)
    for mixed in ([as04[0], as06[1]], [as06[0], as04[1]], as04):
        got = aggregate_stats(mixed)
        running = RunningStats()
        for e in mixed:
            running = running.plus({"grip": e})
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
            np.testing.assert_allclose(running.result()["grip"][name], value, err_msg=name)
            assert got[name].dtype == value.dtype, name


def test_numeric_stats_single_frame_quantiles_equal_mean():
    stats = numeric_stats(np.array([[1.5, -2.0]], dtype=np.float32))
    for name in QUANTILES:
        np.testing.assert_array_equal(stats[name], stats["mean"])
    assert stats["std"].tolist() == [0.0, 0.0]


def test_numeric_stats_accepts_torch():
    values = torch.randn(20, 3)
    assert_stats_close(numeric_stats(values), reference_stats(values.numpy()))


def test_numeric_stats_nan_propagates_like_numpy():
    values = np.arange(10, dtype=np.float64).reshape(5, 2)
    values[2, 1] = np.nan
    stats = numeric_stats(values)
    for name in ("max", "mean", "std", *QUANTILES):
        assert np.isnan(stats[name][1]) and not np.isnan(stats[name][0]), name


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (np.zeros((0, 3)), "at least one frame"),
        (np.float64(1.0), "0-d"),
        (np.array(["a", "b"]), "numeric or bool"),
        (np.ones(3, dtype=np.complex128), "numeric or bool"),
    ],
)
def test_numeric_stats_rejects(values, match):
    with pytest.raises(ValueError, match=match):
        numeric_stats(values)


def image_reference(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of raw uint8 pixels [..., C] / 255, shaped (C, 1, 1); quantiles by
    lerobot's histogram over the 0..255 values, then scaled."""
    raw = pixels.reshape(-1, pixels.shape[-1]).astype(np.float64)
    x = raw / 255.0
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
    }
    for name, q in QUANTILES.items():
        out[name] = (
            np.array([histogram_quantile(raw[:, c], q) for c in range(raw.shape[1])]) / 255.0
        )
    out = {k: v.reshape(-1, 1, 1) for k, v in out.items()}
    return out


def test_image_stats_match_numpy_on_raw_pixels():
    rng = np.random.default_rng(7)
    frames = rng.integers(0, 256, (12, 24, 20, 3), dtype=np.uint8)
    frames[..., 1] //= 3  # a skewed channel
    frames[..., 2] = 200  # a constant channel
    acc = ImageStatsAccumulator()
    acc.update(frames)
    got = acc.result()
    want = image_reference(frames)
    assert acc.count == 12
    assert got["count"].dtype == np.int64 and got["count"].tolist() == [12]
    for name in STAT_NAMES:
        if name == "count":
            continue
        assert got[name].shape == (3, 1, 1) and got[name].dtype == np.float64, name
        # numpy's own float sums carry ~1e-13 error (e.g. std of a constant channel)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)
    for name in ("min", "max"):  # these are exact
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # the histogram's integer moments are exact: a constant channel has std exactly 0
    assert got["std"][2, 0, 0] == 0.0 and got["mean"][2, 0, 0] == 200 / 255
    assert np.all((got["min"] >= 0) & (got["max"] <= 1))


@pytest.mark.parametrize("pixels", [2, 3, 5, 99, 100, 101, 1000])
def test_image_quantiles_match_lerobots_histogram_for_small_counts(pixels):
    rng = np.random.default_rng(pixels)
    frame = rng.integers(0, 256, (1, pixels, 3), dtype=np.uint8)
    acc = ImageStatsAccumulator()
    acc.update(frame)
    got, want = acc.result(), image_reference(frame)
    for name in QUANTILES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14, err_msg=name)


def test_image_streaming_equals_one_update():
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (10, 16, 16, 3), dtype=np.uint8)
    whole = ImageStatsAccumulator()
    whole.update(frames)
    pieces = ImageStatsAccumulator()
    pieces.update(frames[0])  # a single [H, W, C] frame
    pieces.update(torch.from_numpy(frames[1:4]))  # a torch batch
    pieces.update(frames[4:4])  # an empty batch changes nothing
    pieces.update(frames[4:])
    assert pieces.count == whole.count == 10
    a, b = whole.result(), pieces.result()
    for name in STAT_NAMES:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_image_other_channel_counts():
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
    acc = ImageStatsAccumulator(channels=1)
    acc.update(frames)
    got = acc.result()
    assert got["mean"].shape == (1, 1, 1)
    np.testing.assert_allclose(got["mean"], image_reference(frames)["mean"], rtol=1e-12)


def test_image_rejects_bad_input():
    acc = ImageStatsAccumulator()
    with pytest.raises(ValueError, match="pass uint8"):
        acc.update(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="pass uint8"):
        acc.update(torch.zeros(4, 4, 3))
    with pytest.raises(ValueError, match="uint8"):
        acc.update(np.zeros((4, 4, 3), dtype=np.uint16))
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        acc.update(np.zeros((3, 4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        acc.update(np.zeros((4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="no pixels"):
        acc.update(np.zeros((0, 4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="at least one frame"):
        acc.result()
    with pytest.raises(ValueError, match="channels"):
        ImageStatsAccumulator(channels=0)


episode_lengths = st.lists(st.integers(1, 50), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    lengths=episode_lengths,
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    offset=st.sampled_from([0.0, -5.0, 1e4]),
    integer=st.booleans(),
)
def test_aggregate_equals_stats_of_concatenation(lengths, seed, scale, offset, integer):
    rng = np.random.default_rng(seed)
    episodes = []
    for n in lengths:
        values = rng.standard_normal((n, 3)) * scale * rng.uniform(0.1, 3) + offset
        if integer:
            values = np.round(values).astype(np.int64)
        episodes.append(values)
    per_episode = [numeric_stats(v) for v in episodes]
    agg = aggregate_stats(per_episode)
    want = reference_stats(np.concatenate(episodes))
    magnitude = max(1.0, float(np.abs(np.concatenate(episodes)).max()))
    assert agg["count"].dtype == np.int64 and agg["count"].tolist() == [sum(lengths)]
    np.testing.assert_array_equal(agg["min"], want["min"])
    np.testing.assert_array_equal(agg["max"], want["max"])
    for name in ("mean", "std"):
        np.testing.assert_allclose(
            agg[name], want[name], rtol=1e-9, atol=1e-12 * magnitude, err_msg=name
        )
    counts = np.array(lengths, dtype=np.float64)[:, None]
    for name in QUANTILES:
        stacked = np.stack([s[name] for s in per_episode])
        weighted = (stacked * counts).sum(0) / counts.sum()
        np.testing.assert_allclose(agg[name], weighted, rtol=1e-12, atol=1e-12 * magnitude)
    assert list(agg) == list(STAT_NAMES)


def test_aggregate_image_stats_shapes():
    rng = np.random.default_rng(5)
    per_episode, all_frames = [], []
    for n in (2, 5):
        frames = rng.integers(0, 256, (n, 6, 6, 3), dtype=np.uint8)
        acc = ImageStatsAccumulator()
        acc.update(frames)
        per_episode.append(acc.result())
        all_frames.append(frames)
    agg = aggregate_stats(per_episode)
    want = image_reference(np.concatenate(all_frames))
    assert all(agg[k].shape == (3, 1, 1) for k in STAT_NAMES if k != "count")
    assert agg["count"].tolist() == [7]
    # weights are frame counts; every frame has the same pixel count, so the mean is exact
    for name in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(agg[name], want[name], rtol=1e-12, err_msg=name)


def test_aggregate_keeps_quantiles_only_when_all_episodes_have_them():
    a = numeric_stats(np.arange(4.0))
    b = {k: v for k, v in numeric_stats(np.arange(6.0)).items() if k != "q50"}
    agg = aggregate_stats([a, b])
    assert "q50" not in agg and "q01" in agg


@pytest.mark.parametrize(
    ("per_episode", "error", "match"),
    [
        ([], ValueError, "at least one"),
        ([{"min": [0.0], "max": [1.0], "mean": [0.5], "std": [0.1]}], LeRobotFormatError, "count"),
        ([{**numeric_stats(np.ones(3)), "count": np.array([0])}], ValueError, "no frames"),
        ([{**numeric_stats(np.ones(3)), "count": np.array([1.5])}], LeRobotFormatError, "count"),
        ([numeric_stats(np.ones((3, 2))), numeric_stats(np.ones(3))], LeRobotFormatError, "shape"),
    ],
)
def test_aggregate_rejects(per_episode, error, match):
    with pytest.raises(error, match=match):
        aggregate_stats(per_episode)


def test_aggregate_features_handles_missing_features():
    rng = np.random.default_rng(6)
    x = [rng.standard_normal((n, 2)) for n in (3, 4, 5)]
    episodes = [
        {"state": numeric_stats(x[0]), "frame_index": numeric_stats(np.arange(3))},
        {"frame_index": numeric_stats(np.arange(4))},
        {"state": numeric_stats(x[2]), "frame_index": numeric_stats(np.arange(5))},
    ]
    agg = aggregate_features(episodes)
    assert list(agg) == ["state", "frame_index"]
    assert agg["state"]["count"].tolist() == [8]
    np.testing.assert_allclose(agg["state"]["mean"], np.concatenate([x[0], x[2]]).mean(0))
    assert agg["frame_index"]["count"].tolist() == [12]
    assert agg["frame_index"]["max"].tolist() == [4.0]


def test_aggregate_features_error_names_feature():
    bad = {k: v for k, v in numeric_stats(np.ones(3)).items() if k != "std"}
    with pytest.raises(LeRobotFormatError, match="'action'.*'std'"):
        aggregate_features([{"action": bad}])


def test_json_round_trip():
    rng = np.random.default_rng(8)
    acc = ImageStatsAccumulator()
    acc.update(rng.integers(0, 256, (2, 5, 5, 3), dtype=np.uint8))
    stats = {
        "observation.state": numeric_stats(rng.standard_normal((10, 4)).astype(np.float32)),
        "timestamp": numeric_stats((np.arange(10) / 30).astype(np.float32)),
        "index": numeric_stats(np.arange(10, 20)),
        "observation.images.top": acc.result(),
    }
    data = stats_to_json(stats)
    text = json.dumps(data, allow_nan=False)
    loaded = json.loads(text)
    assert loaded == data
    assert type(data["index"]["count"][0]) is int
    assert type(data["index"]["mean"][0]) is float
    assert np.asarray(data["observation.images.top"]["mean"]).shape == (3, 1, 1)
    back = stats_from_json(loaded)
    assert list(back) == list(stats)
    for feature, feature_stats in stats.items():
        assert list(back[feature]) == list(STAT_NAMES)
        for name, value in feature_stats.items():
            got = back[feature][name]
            assert got.dtype == (np.int64 if name == "count" else np.float64)
            assert got.shape == value.shape
            np.testing.assert_array_equal(got, value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_stats_to_json_rejects_non_finite(bad):
    stats = numeric_stats(np.arange(6.0).reshape(3, 2))
    stats["mean"] = stats["mean"].copy()
    stats["mean"][1] = bad
    with pytest.raises(ValueError, match=r"'action\.joints'.*'mean'.*NaN or inf"):
        stats_to_json({"action.joints": stats})


def test_stats_from_json_reads_lerobot_count_and_nan():
    got = stats_from_json({"x": {"count": [5], "mean": [1, 2.5], "std": [float("nan")]}})
    assert got["x"]["count"].dtype == np.int64 and got["x"]["count"].tolist() == [5]
    assert got["x"]["mean"].dtype == np.float64 and got["x"]["mean"].tolist() == [1.0, 2.5]
    assert np.isnan(got["x"]["std"][0])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([1, 2], "object of features"),
        ({"action": [1.0]}, "'action'.*object of stats"),
        ({"action": {"mean": 1.0}}, "'action'.*'mean'.*list"),
        ({"action": {"mean": "1.0"}}, "'action'.*'mean'.*list"),
        ({"action": {"mean": ["a"]}}, "'action'.*'mean'"),
        ({"action": {"mean": [None]}}, "'action'.*'mean'"),
        ({"action": {"mean": [True]}}, "'action'.*'mean'"),
        ({"action": {"mean": []}}, "'action'.*'mean'"),
        ({"action": {"mean": [[1.0], [2.0, 3.0]]}}, "'action'.*'mean'.*rectangular"),
        ({"action": {"min": [{"a": 1}]}}, "'action'.*'min'"),
        ({"action": {"count": [1.5]}}, "'action'.*'count'"),
        ({"action": {"count": [-1]}}, "'action'.*'count'"),
    ],
)
def test_stats_from_json_rejects_malformed(data, match):
    with pytest.raises(LeRobotFormatError, match=match):
        stats_from_json(data)


@settings(max_examples=50, deadline=None)
@given(lengths=episode_lengths, seed=st.integers(0, 2**32 - 1), offset=st.sampled_from([0.0, 1e4]))
def test_running_stats_equal_aggregating_all_episodes(lengths, seed, offset):
    rng = np.random.default_rng(seed)
    episodes = [
        {
            "state": numeric_stats(rng.standard_normal((n, 2, 3)) + offset),
            "grip": numeric_stats(rng.random((n, 1)) < 0.5),
        }
        for n in lengths
    ]
    running = RunningStats()
    for episode in episodes:
        before = running.result()
        after = running.plus(episode)
        assert running.result().keys() == before.keys()  # plus() leaves the original as it was
        running = after
    got, want = running.result(), aggregate_features(episodes)
    for feature in want:
        assert list(got[feature]) == list(want[feature])
        for name in STAT_NAMES:
            assert got[feature][name].dtype == want[feature][name].dtype, (feature, name)
            np.testing.assert_allclose(
                got[feature][name].astype(float),
                want[feature][name].astype(float),
                rtol=1e-9,
                atol=1e-9 * max(1.0, offset),
                err_msg=f"{feature}/{name}",
            )


def test_running_stats_refuse_episodes_of_another_shape():
    running = RunningStats().plus({"x": numeric_stats(np.ones((3, 4)))})
    with pytest.raises(LeRobotFormatError, match="feature 'x'.*shape"):
        running.plus({"x": numeric_stats(np.ones((3, 2)))})


def test_writer_stats_follow_lerobot_shapes_and_types(tmp_path):
    from torchstore.lerobot import LeRobotWriter

    features = {
        "grid": {"dtype": "float32", "shape": [2, 3], "names": None},
        "grip": {"dtype": "bool", "shape": [1], "names": None},
    }
    rng = np.random.default_rng(0)
    with LeRobotWriter(tmp_path / "ds", fps=10, features=features) as w:
        for n in (4, 6):
            w.add_episode(
                {
                    "grid": rng.standard_normal((n, 2, 3)).astype(np.float32),
                    "grip": rng.random(n) < 0.5,
                },
                task="t",
            )
    data = json.loads((tmp_path / "ds/meta/stats.json").read_text())
    assert np.asarray(data["grid"]["mean"]).shape == (3,) and data["grid"]["count"] == [10]
    assert all(type(v) is float for v in data["grip"]["min"] + data["grip"]["max"])
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(next((tmp_path / "ds/meta/episodes").rglob("*.parquet")))
    assert table.schema.field("stats/grip/min").type.value_type == pa.float64()
    assert [len(v) for v in table.column("stats/grid/q50").to_pylist()] == [3, 3]


def test_a_save_whose_stats_fail_leaves_no_episode_behind(tmp_path):
    """Stats are computed before the commit point: a NaN (which stats.json cannot hold)
    fails the save and the folder still holds only the episodes saved before."""
    from torchstore.lerobot import LeRobotSource, LeRobotWriter

    features = {"x": {"dtype": "float32", "shape": [2], "names": None}}
    root = tmp_path / "ds"
    with LeRobotWriter(root, fps=10, features=features) as w:
        w.add_episode({"x": np.zeros((3, 2), np.float32)}, task="t")
        bad = np.zeros((3, 2), np.float32)
        bad[1, 0] = np.nan
        with pytest.raises(ValueError, match="feature 'x'.*NaN"):
            w.add_episode({"x": bad}, task="t")
        with LeRobotSource(root) as src:
            assert len(src.episodes) == 1
        assert w.add_episode({"x": np.ones((2, 2), np.float32)}, task="t") == 1
    with LeRobotSource(root) as src:
        assert [e.length for e in src.episodes] == [3, 2]


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(2, 300),
    seed=st.integers(0, 2**32 - 1),
    levels=st.sampled_from([2, 5, 50, None]),
    scale=st.sampled_from([1e-6, 1.0, 1e6]),
)
def test_quantiles_from_sorted_columns_equal_reading_the_histogram(rows, seed, levels, scale):
    """The fast path (positions in sorted columns) gives lerobot's histogram reading exactly,
    ties and bin edges included."""
    from torchstore.lerobot.stats import _column_quantiles, _columns_quantiles

    rng = np.random.default_rng(seed)
    x = (
        rng.integers(0, levels, (rows, 4)) * scale
        if levels
        else rng.standard_normal((rows, 4)) * scale
    )
    for data in (x, x.astype(np.float32)):  # float32 features get float32 edges, as in lerobot
        got = _columns_quantiles(data.astype(np.float64), data.min(0), data.max(0))
        for c in range(4):
            col = data[:, c]
            np.testing.assert_array_equal(got[:, c], _column_quantiles(col, col.min(), col.max()))


def _booleans_in_table(root) -> None:
    """Rewrite a dataset's bool min/max stats as lerobot 0.4 (and older torchstore) wrote
    them: list<bool> columns in the episodes table, booleans in stats.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in (root / "meta/episodes").rglob("*.parquet"):
        table = pq.read_table(path)
        for stat in ("min", "max"):
            i = table.schema.get_field_index(f"stats/grip/{stat}")
            column = table.column(i).cast(pa.list_(pa.bool_()))
            table = table.set_column(i, table.schema.field(i).with_type(column.type), column)
        pq.write_table(table, path)
    data = json.loads((root / "meta/stats.json").read_text())
    data["grip"] = _as_booleans(data["grip"])
    (root / "meta/stats.json").write_text(json.dumps(data))


def test_resuming_a_dataset_with_boolean_stats_aggregates_as_a_new_one(tmp_path):
    """Episodes whose bool stats are booleans (lerobot 0.4) and new ones (0.0/1.0, lerobot
    0.6) share one dataset: resume concatenates both, stats.json matches a fresh dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torchstore.lerobot import LeRobotWriter, import_lerobot

    features = {
        "grip": {"dtype": "bool", "shape": [2], "names": None},
        "x": {"dtype": "float32", "shape": [1], "names": None},
    }
    rng = np.random.default_rng(5)
    episodes = [
        {"grip": rng.random((n, 2)) < 0.4, "x": rng.standard_normal((n, 1)).astype(np.float32)}
        for n in (5, 3, 8, 4)
    ]
    with LeRobotWriter(tmp_path / "fresh", fps=10, features=features) as w:
        for e in episodes:
            w.add_episode(e, task="t")
    old = tmp_path / "old"
    with LeRobotWriter(old, fps=10, features=features) as w:
        for e in episodes[:2]:
            w.add_episode(e, task="t")
    _booleans_in_table(old)
    with LeRobotWriter.resume(old) as w:
        assert w.num_episodes == 2
        for e in episodes[2:]:
            w.add_episode(e, task="t")
    fresh = json.loads((tmp_path / "fresh/meta/stats.json").read_text())
    got = json.loads((old / "meta/stats.json").read_text())
    assert got == fresh
    assert all(type(v) is float for v in got["grip"]["min"] + got["grip"]["max"])
    types = {
        pq.read_schema(p).field("stats/grip/min").type.value_type
        for p in (old / "meta/episodes").rglob("*.parquet")
    }
    assert types == {pa.bool_(), pa.float64()}  # the old file is left as it was written
    summary = import_lerobot(old, tmp_path / "store.h5")
    assert (summary.episodes, summary.frames) == (4, 20)
