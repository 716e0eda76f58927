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
        (dict(name="next/truncated", dtype=torch.int64), "reserved column 'next/truncated' must be bool"),
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
    assert q.encode(torch.tensor([-10.0, 10.0])).tolist() == [0, 255]  # clipped
    assert np.array_equal(q.encode(x.numpy()), q.encode(x).numpy())
    with pytest.raises(ColumnError, match="must be greater than low"):
        Quantize(1.0, 1.0)
    with pytest.raises(ColumnError, match="finite"):
        Quantize(0.0, float("inf"))
