from __future__ import annotations

import numpy as np
import pytest
import torch

from torchstore.data import ColumnSpec, Quantize
from torchstore.data.columns import validate_columns
from torchstore.errors import ColumnError


def test_spec_normalises_dtype_and_shape():
    spec = ColumnSpec("next/obs", "float32", [3, 2])
    assert spec.dtype is torch.float32
    assert spec.shape == (3, 2)
    assert spec.key == ("next", "obs")
    assert ColumnSpec("obs", np.float64).dtype is torch.float64
    assert ColumnSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="done", dtype=torch.float32), "reserved column 'done' must be bool"),
        (
            dict(name="next/truncated", dtype=torch.int64),
            "reserved column 'next/truncated' must be bool",
        ),
        (dict(name="reward", dtype=torch.int32), "reserved column 'reward' must be floating"),
        (dict(name="", dtype=torch.float32), "non-empty string"),
        (dict(name="a//b", dtype=torch.float32), "'/'-separated parts"),
        (dict(name="../x", dtype=torch.float32), "'/'-separated parts"),
        (dict(name="obs", dtype=torch.complex64), "dtype .* is not supported"),
        (dict(name="obs", dtype=torch.float32, shape=(0,)), "positive sizes"),
        (dict(name="obs", dtype=torch.int64, quantize=Quantize(0, 1)), "must be floating"),
    ],
)
def test_bad_specs_are_rejected(kwargs, match):
    with pytest.raises(ColumnError, match=match):
        ColumnSpec(**kwargs)


def test_column_set_rules():
    with pytest.raises(ColumnError, match="declared twice"):
        validate_columns([ColumnSpec("a", torch.float32), ColumnSpec("a", torch.float32)])
    with pytest.raises(ColumnError, match="also the group"):
        validate_columns([ColumnSpec("next", torch.float32), ColumnSpec("next/obs", torch.float32)])
    with pytest.raises(ColumnError, match="at least one column"):
        validate_columns([])


def test_check_rows_casts_safely_and_refuses_lossy_casts():
    spec = ColumnSpec("obs", torch.float64, (2,))
    assert spec.check_rows(np.ones((3, 2), np.float32)).dtype == np.float64
    narrow = ColumnSpec("obs", torch.float32, (2,))
    with pytest.raises(ColumnError, match=r"column 'obs' expects float32\[2\], got float64\[2\]"):
        narrow.check_rows(np.ones((3, 2)))
    with pytest.raises(ColumnError, match="expects rows of shape"):
        narrow.check_rows(np.ones((3, 3), np.float32))
    with pytest.raises(ColumnError, match="has 4 rows, other columns have 3"):
        narrow.check_rows(torch.ones(4, 2), rows=3)
    with pytest.raises(ColumnError, match="quantised and takes floating"):
        ColumnSpec("p", torch.float32, quantize=Quantize(0, 1)).check_rows(np.ones(3, np.uint8))


def test_quantize_round_trip_within_half_a_step():
    q = Quantize(-2.0, 3.0)
    x = torch.linspace(-2.0, 3.0, 10_001)
    err = (q.decode(q.encode(x)) - x).abs().max().item()
    assert err <= q.step / 2 + 1e-6
    # half a step beyond either end still rounds onto the end codes
    assert q.encode(torch.tensor([-2.0 - q.step * 0.49, 3.0 + q.step * 0.49])).tolist() == [0, 255]
    assert np.array_equal(q.encode(x.numpy()), q.encode(x).numpy())
    with pytest.raises(ColumnError, match="must be greater than low"):
        Quantize(1.0, 1.0)
    with pytest.raises(ColumnError, match="finite"):
        Quantize(0.0, float("inf"))


@pytest.mark.parametrize("as_numpy", [False, True])
def test_quantize_refuses_nan_and_out_of_range_unless_clip(as_numpy):
    def values(*xs):
        return np.array(xs, np.float32) if as_numpy else torch.tensor(xs)

    q = Quantize(0.0, 1.0)
    with pytest.raises(ColumnError, match="holds NaN"):
        q.encode(values(0.5, float("nan")))
    with pytest.raises(
        ColumnError, match=r"holds 255, outside its quantisation range \[0, 1\].*clip=True"
    ):
        q.encode(values(0.0, 255.0))  # pixels in 0..255 fed to a [0, 1] column
    with pytest.raises(ColumnError, match="outside its quantisation range"):
        q.encode(values(-float("inf")))
    clipping = Quantize(0.0, 1.0, clip=True)
    assert list(clipping.encode(values(-10.0, 0.5, 10.0, float("inf")))) == [0, 128, 255, 255]
    with pytest.raises(ColumnError, match="holds NaN"):
        clipping.encode(values(float("nan")))
    # through a column spec the error names the column
    with pytest.raises(ColumnError, match="column 'pix' holds NaN"):
        ColumnSpec("pix", torch.float32, quantize=q).check_rows(values(float("nan")))


def test_quantize_clip_round_trips_through_the_spec_dict():
    spec = ColumnSpec("pix", torch.float32, quantize=Quantize(0, 1, clip=True))
    assert ColumnSpec.from_dict(spec.to_dict()) == spec
    plain = ColumnSpec("pix", torch.float32, quantize=Quantize(0, 1))
    assert "clip" not in plain.to_dict()["quantize"]  # older readers still parse it


@pytest.mark.parametrize(
    "dtype, low, high, match",
    [
        (torch.float64, -1e308, 1e308, "wider than a float64"),
        (torch.float16, 0.0, 1e6, "does not fit in float16"),
        (torch.float16, -60000.0, 60000.0, "does not fit in float16"),
        (torch.float16, 1000.0, 1000.5, "finer than float16 resolves"),
        (torch.float32, 1e6, 1e6 + 0.001, "finer than float32 resolves"),
    ],
)
def test_quantize_ranges_the_decode_dtype_cannot_hold_are_refused(dtype, low, high, match):
    with pytest.raises(ColumnError, match=match):
        ColumnSpec("pix", dtype, quantize=Quantize(low, high))


@pytest.mark.parametrize(
    "low, high, clip",
    [("abc", 1, False), (None, 1, False), (0, [1], False), (True, 2, False), (0, 1, "yes")],
)
def test_quantize_bad_arguments_are_column_errors(low, high, clip):
    with pytest.raises(ColumnError):
        Quantize(low, high, clip)


@pytest.mark.parametrize(
    "data",
    [
        "abc",
        {"name": "x"},
        {"name": "x", "dtype": "float32", "shape": "abc"},
        {"name": "x", "dtype": "float32", "shape": ["a"]},
        {"name": "x", "dtype": "float32", "shape": [True]},
        {"name": "x", "dtype": "float32", "quantize": "abc"},
        {"name": "x", "dtype": "float32", "quantize": {"lo": 1}},
        {"name": "x", "dtype": "float32", "quantize": {"low": "a", "high": 1}},
        {"name": "x", "dtype": [1, 2]},
        {"name": 5, "dtype": "float32"},
    ],
)
def test_malformed_spec_dicts_are_column_errors(data):
    with pytest.raises(ColumnError):
        ColumnSpec.from_dict(data)


def test_a_meta_device_tensor_is_refused_clearly():
    spec = ColumnSpec("obs", torch.float32, (2,))
    with pytest.raises(ColumnError, match="meta device"):
        spec.check_rows(torch.empty(3, 2, device="meta"))
