"""What a recorder is given, checked and shaped: feature specs, camera frames, numbers, and
an episode's rows as the Arrow table of its data file.

LeRobot's ``add_frame`` rules: every user feature,
exact dtype family and shape; camera frames as HWC or CHW, uint8 or floats in ``[0, 1]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchstore.errors import LeRobotFormatError
from torchstore.io.records.parquet import require_pyarrow
from torchstore.lerobot.features import DEFAULT_FEATURES, Feature, hf_features_metadata

__all__ = ["features_from_user", "camera_frames", "numeric_values", "data_table"]


def features_from_user(features: Mapping[str, Any]) -> dict[str, Feature]:
    if not isinstance(features, Mapping) or not features:
        raise LeRobotFormatError("features must be a non-empty mapping of name -> feature spec")
    out = {}
    for name, spec in features.items():
        if name in DEFAULT_FEATURES:
            raise LeRobotFormatError(
                f"feature {name!r} is one of LeRobot's default features; "
                "it is filled in automatically"
            )
        feature = (
            spec if isinstance(spec, Feature) else Feature.from_json(name, spec, source="features")
        )
        if feature.dtype == "language":
            raise LeRobotFormatError(
                f"feature {name!r}: 'language' features are written by annotation tools"
            )
        out[name] = feature
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def camera_frames(feature: Feature, value: Any, *, batched: bool) -> np.ndarray:
    """Camera input as uint8 ``[..., H, W, C]``: CHW is transposed, floats in [0, 1] scaled
    (like LeRobot)."""
    arr = _to_numpy(value)
    hwc = feature.hwc
    body = arr.shape[1:] if batched else arr.shape
    if body == (hwc[2], hwc[0], hwc[1]) and body != hwc:
        arr = np.moveaxis(arr, -3, -1)
    elif body != hwc:
        raise LeRobotFormatError(
            f"feature {feature.name!r} expects frames of shape {list(hwc)} (H, W, C) or "
            f"{[hwc[2], hwc[0], hwc[1]]} (C, H, W), got {list(body)}"
        )
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if np.issubdtype(arr.dtype, np.floating):
        if arr.size and (np.nanmin(arr) < 0 or np.nanmax(arr) > 1 or np.isnan(arr).any()):
            raise LeRobotFormatError(
                f"feature {feature.name!r}: float frames must lie in [0, 1]; pass uint8 for 0..255"
            )
        return np.ascontiguousarray((arr * 255).round().astype(np.uint8))
    raise LeRobotFormatError(
        f"feature {feature.name!r} expects uint8 (or float in [0, 1]) frames, got {arr.dtype}"
    )


def numeric_values(feature: Feature, value: Any, *, rows: int | None) -> np.ndarray:
    """Numeric input checked against the feature: ``[rows, *shape]`` (or one frame if
    ``rows`` is None)."""
    arr = _to_numpy(value)
    want = np.dtype(feature.dtype)
    body = arr.shape if rows is None else arr.shape[1:]
    if rows is not None and (arr.ndim == 0 or arr.shape[0] != rows):
        raise LeRobotFormatError(
            f"feature {feature.name!r} has {arr.shape[0] if arr.ndim else 'no'} rows, "
            f"expected {rows}"
        )
    if body not in (feature.shape, feature.value_shape):
        raise LeRobotFormatError(
            f"feature {feature.name!r} expects shape {list(feature.shape)}, got {list(body)}"
        )
    if arr.dtype != want:
        # same family only (Python floats for float32 are fine; ints for floats are not)
        family = {"b": "b", "i": "int", "u": "int", "f": "f"}
        same_kind = family.get(arr.dtype.kind) == family.get(want.kind) and np.can_cast(
            arr.dtype, want, casting="same_kind"
        )
        if arr.dtype == object or not same_kind:
            raise LeRobotFormatError(
                f"feature {feature.name!r} expects {feature.dtype}, got {arr.dtype}; "
                "convert it explicitly"
            )
        arr = arr.astype(want)
    n = 1 if rows is None else rows
    return (
        arr.reshape(n, *feature.value_shape)
        if rows is not None
        else arr.reshape(feature.value_shape)
    )


def data_table(
    features: Mapping[str, Feature],
    columns: Mapping[str, Any],
    images: Mapping[str, Sequence[bytes]],
):
    """One episode's rows as LeRobot's data file holds them: every user feature but the
    video cameras, then the default features, with the Hugging Face features metadata.

    ``columns``: ``{name: [n, ...] array or n strings}`` for the numeric and string
    features (the default ones included); ``images``: each image camera's PNG bytes.
    """
    pa = require_pyarrow()
    all_features = {**features, **DEFAULT_FEATURES}
    fields, arrays = [], []
    for name, feature in all_features.items():
        if feature.is_video:
            continue
        fields.append(feature.arrow_field())
        if feature.dtype == "image":
            files = [f"frame-{k:06d}.png" for k in range(len(images[name]))]
            arrays.append(
                pa.StructArray.from_arrays(
                    [pa.array(images[name], pa.binary()), pa.array(files)],
                    names=["bytes", "path"],
                )
            )
        elif feature.dtype == "string":
            arrays.append(pa.array(columns[name], pa.string()))
        else:
            arrays.append(feature.to_arrow(columns[name]))
    schema = pa.schema(fields, metadata={b"huggingface": hf_features_metadata(all_features)})
    return pa.Table.from_arrays(arrays, schema=schema)
