"""The argument checks in torchstore.validation: what they accept, return and raise."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from torchstore.errors import ArgumentError, ArgumentTypeError, StoreFormatError, TorchstoreError
from torchstore.validation import (
    fraction,
    int_at_least,
    int_in_range,
    non_negative_int,
    non_negative_number,
    number_at_least,
    positive_int,
    positive_number,
)


def test_int_checks_accept_ints_and_numpy_ints():
    assert positive_int("episodes", 3) == 3
    value = positive_int("episodes", np.int64(7))
    assert value == 7 and type(value) is int
    assert non_negative_int("seed", 0) == 0
    assert int_at_least("image_size", 8, 8) == 8
    assert int_in_range("seed", 2**63 - 1, 0, 2**63) == 2**63 - 1
    assert positive_int("keep", None, allow_none=True) is None


@pytest.mark.parametrize("value", [True, False, 2.0, "3", None, np.float32(1)])
def test_int_checks_refuse_other_types_with_a_type_error(value):
    with pytest.raises(ArgumentTypeError) as info:
        positive_int("episodes", value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, TorchstoreError)
    assert str(info.value) == f"episodes ({value!r}) must be an int >= 1"


def test_int_checks_refuse_out_of_range_with_a_value_error():
    with pytest.raises(ArgumentError, match=r"^episodes \(0\) must be an int >= 1$") as info:
        positive_int("episodes", 0)
    assert not isinstance(info.value, TypeError)
    with pytest.raises(ArgumentError, match=r"^retries \(-1\) must be an int >= 0$"):
        non_negative_int("retries", -1)
    with pytest.raises(ArgumentError, match=r"^seed \(-1\) must be an int in \[0, 2\*\*63\)$"):
        int_in_range("seed", -1, 0, 2**63, high_text="2**63")
    with pytest.raises(ArgumentError, match=r"seed \(9223372036854775808\) must be an int in"):
        int_in_range("seed", 2**63, 0, 2**63, high_text="2**63")
    with pytest.raises(ArgumentError, match=r"^keep \(0\) must be an int >= 1 or None$"):
        positive_int("keep", 0, allow_none=True)


def test_a_callers_error_class_and_hint():
    with pytest.raises(StoreFormatError, match=r"^f.json: version \('1'\) must be an int >= 1$"):
        positive_int("f.json: version", "1", error=StoreFormatError)
    with pytest.raises(StoreFormatError, match=r"version \(0\) must be an int >= 1; re-export it"):
        positive_int("version", 0, error=StoreFormatError, hint="; re-export it")


def test_long_values_are_cut_in_the_message():
    with pytest.raises(ArgumentTypeError) as info:
        positive_int("episodes", "x" * 500)
    assert len(str(info.value)) < 150 and "..." in str(info.value)


def test_number_checks():
    assert positive_number("dt", 0.5) == 0.5
    assert positive_number("fps", 30) == 30 and isinstance(positive_number("fps", 30), int)
    assert non_negative_number("noise", 0.0) == 0.0
    assert number_at_least("alpha", 1.5, 1) == 1.5
    assert positive_number("timeout", math.inf, finite=False) == math.inf
    with pytest.raises(ArgumentError, match=r"^dt \(0\.0\) must be a finite number > 0$"):
        positive_number("dt", 0.0)
    with pytest.raises(ArgumentError, match=r"^dt \(nan\) must be a finite number > 0$"):
        positive_number("dt", math.nan)
    with pytest.raises(ArgumentError, match=r"^dt \(inf\) must be a finite number > 0$"):
        positive_number("dt", math.inf)
    with pytest.raises(ArgumentError, match=r"^noise \(-0\.1\) must be a finite number >= 0$"):
        non_negative_number("noise", -0.1)
    with pytest.raises(ArgumentTypeError, match=r"^dt \(True\) must be a finite number > 0$"):
        positive_number("dt", True)
    with pytest.raises(ArgumentTypeError, match=r"dt \('1'\)"):
        positive_number("dt", "1")


def test_fraction_bounds():
    assert fraction("frac", 0) == 0 and fraction("frac", 1) == 1
    assert fraction("eta", 1.0, low_open=True) == 1.0
    with pytest.raises(ArgumentError, match=r"^eta \(0\.0\) must be a number in \(0, 1\]$"):
        fraction("eta", 0.0, low_open=True)
    with pytest.raises(ArgumentError, match=r"^split \(1\.0\) must be a number in \[0, 1\)$"):
        fraction("split", 1.0, high_open=True)
    with pytest.raises(ArgumentError, match=r"frac \(nan\) must be a number in \[0, 1\]"):
        fraction("frac", math.nan)
    with pytest.raises(ArgumentError, match=r"frac \(1\.5\)"):
        fraction("frac", 1.5)
    with pytest.raises(ArgumentTypeError, match=r"frac \(None\)"):
        fraction("frac", None)


def test_zero_dimensional_arrays_and_tensors_count_as_their_value():
    torch = pytest.importorskip("torch")
    assert positive_number("dt", np.array(0.1)) == pytest.approx(0.1)
    assert type(positive_number("fps", torch.tensor(30.0))) is float
    assert fraction("eta", torch.tensor(0.5), low_open=True) == 0.5
    value = positive_int("episodes", torch.tensor(4))
    assert value == 4 and type(value) is int
    assert positive_int("episodes", np.array(2)) == 2
    with pytest.raises(ArgumentError, match=r"^dt \(0\.0\) must be a finite number > 0$"):
        positive_number("dt", torch.tensor(0.0))
    for wrong in (np.array([0.1, 0.2]), torch.tensor(True), np.array(True), torch.tensor(2.0)):
        with pytest.raises(ArgumentTypeError):
            positive_int("episodes", wrong)
    with pytest.raises(ArgumentTypeError):
        positive_number("dt", torch.tensor(True))


def test_a_huge_int_is_a_finite_number():
    assert positive_number("timeout", 10**400) == 10**400
    with pytest.raises(ArgumentError, match=r"must be a finite number > 0"):
        positive_number("timeout", -(10**400))


@pytest.mark.parametrize("version", [0, "1", True])
def test_a_manifest_format_version_is_checked_in_the_same_shape(version):
    from torchstore.data.file.manifest import Manifest

    text = json.dumps({"format": "torchstore.trajectory", "format_version": version})
    with pytest.raises(
        StoreFormatError, match=r"^f\.h5: manifest format_version \(.+\) must be an"
    ):
        Manifest.from_json(text, source="f.h5")


def test_replay_from_an_empty_store_says_to_pass_capacity(tmp_path):
    import torch

    from torchstore import ColumnSpec, StoreReplay, TrajectoryStoreWriter

    path = tmp_path / "empty.h5"
    TrajectoryStoreWriter(path, [ColumnSpec("obs", torch.float32, (2,))]).close()
    with pytest.raises(
        ArgumentError, match=r"capacity \(0\) .* \(the store is empty; pass capacity\)"
    ):
        StoreReplay.from_store(path)
    with pytest.raises(
        ArgumentTypeError, match=r"^capacity \(2\.5\) must be an int >= 1 \(the store is empty"
    ):
        StoreReplay.from_store(path, capacity=2.5)
