"""Columns from gymnasium spaces, and space values as flat rows of those columns.

One leaf space is one column: ``Box`` keeps its dtype and shape (image observations stay
uint8), ``Discrete`` is an int64 scalar, ``MultiDiscrete`` int64 of its ``nvec`` shape,
``MultiBinary`` int8 of its shape. ``Dict`` and ``Tuple`` spaces nest: the observation
``Dict(pos=Box(2), tup=Tuple(Discrete(3), Box(1)))`` becomes the columns ``obs/pos``,
``obs/tup/0`` and ``obs/tup/1``.

Examples:
    >>> from gymnasium import spaces
    >>> [c.describe() for c in space_columns("obs", spaces.Dict(a=spaces.Discrete(3)))]
    ['int64']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchstore.data.columns import ColumnSpec
from torchstore.errors import ColumnError

__all__ = [
    "space_columns",
    "flatten_value",
    "unflatten_value",
    "take",
    "leaf_space",
    "space_to_json",
    "space_from_json",
]


def space_columns(prefix: str, space: Any) -> list[ColumnSpec]:
    """The columns holding values of ``space`` under the name ``prefix``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return [
            c for key, sub in space.spaces.items() for c in space_columns(_child(prefix, key), sub)
        ]
    if isinstance(space, spaces.Tuple):
        return [
            c for i, sub in enumerate(space.spaces) for c in space_columns(f"{prefix}/{i}", sub)
        ]
    if isinstance(space, spaces.Box):
        dtype, shape = space.dtype, space.shape
    elif isinstance(space, spaces.Discrete):
        dtype, shape = np.int64, ()
    elif isinstance(space, spaces.MultiDiscrete):
        dtype, shape = np.int64, space.nvec.shape
    elif isinstance(space, spaces.MultiBinary):
        dtype, shape = np.int8, space.shape
    else:
        raise ColumnError(
            f"'{prefix}' has a {type(space).__name__} space, which has no fixed-shape column; "
            "supported: Box, Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple of them"
        )
    try:
        return [ColumnSpec(prefix, dtype, tuple(shape))]
    except ColumnError as exc:
        raise ColumnError(f"'{prefix}' ({space}) cannot be a column: {exc}") from exc


def _child(prefix: str, key: Any) -> str:
    if not isinstance(key, str):
        raise ColumnError(
            f"'{prefix}' is a Dict space with a non-string key {key!r}; keys name columns"
        )
    return f"{prefix}/{key}"


def flatten_value(
    prefix: str, space: Any, value: Any, out: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``value`` of ``space`` as ``{column name: array}`` (a leading batch or time axis allowed)."""
    from gymnasium import spaces

    out = {} if out is None else out
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            raise ColumnError(f"'{prefix}' is a Dict space, got {type(value).__name__}")
        for key, sub in space.spaces.items():
            if key not in value:
                raise ColumnError(
                    f"'{prefix}' is missing the key {key!r} of its Dict space (got "
                    f"{sorted(map(str, value))})"
                )
            flatten_value(_child(prefix, key), sub, value[key], out)
    elif isinstance(space, spaces.Tuple):
        if (
            not isinstance(value, Sequence)
            or isinstance(value, str | bytes)
            or len(value) != len(space.spaces)
        ):
            raise ColumnError(
                f"'{prefix}' is a Tuple space of {len(space.spaces)}, got {type(value).__name__}"
            )
        for i, sub in enumerate(space.spaces):
            flatten_value(f"{prefix}/{i}", sub, value[i], out)
    else:
        out[prefix] = np.asarray(value)
    return out


def unflatten_value(prefix: str, space: Any, flat: Mapping[str, Any]) -> Any:
    """The inverse of :func:`flatten_value`: dicts and tuples of arrays."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {
            key: unflatten_value(f"{prefix}/{key}", sub, flat) for key, sub in space.spaces.items()
        }
    if isinstance(space, spaces.Tuple):
        return tuple(
            unflatten_value(f"{prefix}/{i}", sub, flat) for i, sub in enumerate(space.spaces)
        )
    if prefix not in flat:
        raise ColumnError(f"no column '{prefix}' for the space {space}")
    return flat[prefix]


def take(value: Any, index: Any) -> Any:
    """``value[index]`` through dicts and tuples (one sub-env of a batched observation)."""
    if isinstance(value, Mapping):
        return {k: take(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(take(v, index) for v in value)
    return np.asarray(value)[index]


def leaf_space(space: Any, path: Sequence[str]) -> Any:
    """The sub-space at ``path`` (Dict keys and Tuple positions, as column names spell them)."""
    from gymnasium import spaces

    for part in path:
        space = space.spaces[int(part)] if isinstance(space, spaces.Tuple) else space.spaces[part]
    return space


def _bound(values: np.ndarray) -> Any:
    """Box bounds as JSON: one number when uniform, else nested lists; infinities as strings."""

    def number(v: Any) -> Any:
        return v if np.isfinite(v) else str(v)  # "inf" / "-inf"

    listed = np.asarray(values).tolist()
    flat = np.asarray(values).ravel()
    if flat.size and (flat == flat[0]).all():
        return number(flat[0].item())

    def walk(x: Any) -> Any:
        return [walk(v) for v in x] if isinstance(x, list) else number(x)

    return walk(listed)


def space_to_json(space: Any) -> dict[str, Any]:
    """A space as plain JSON (no NaN or infinity tokens): what a recording's manifest keeps.

    Examples:
        >>> from gymnasium import spaces
        >>> space_to_json(spaces.Box(0.0, 1.0, (2,)))
        {'type': 'Box', 'dtype': 'float32', 'shape': [2], 'low': 0.0, 'high': 1.0}
    """
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(v) for v in space.spaces]}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "dtype": str(space.dtype),
            "shape": list(space.shape),
            "low": _bound(space.low),
            "high": _bound(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    raise ColumnError(f"a {type(space).__name__} space cannot be recorded")


def _unbound(value: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    to_float = np.vectorize(lambda v: float(v) if isinstance(v, str) else v, otypes=[np.float64])
    array = to_float(np.asarray(value, dtype=object))
    return np.broadcast_to(array, shape).astype(dtype)


def space_from_json(data: Mapping[str, Any]) -> Any:
    """The inverse of :func:`space_to_json`; anything malformed is a :class:`ColumnError`."""
    from gymnasium import spaces

    try:
        kind = data["type"]
        if kind == "Dict":
            return spaces.Dict({k: space_from_json(v) for k, v in data["spaces"].items()})
        if kind == "Tuple":
            return spaces.Tuple([space_from_json(v) for v in data["spaces"]])
        if kind == "Box":
            shape, dtype = tuple(data["shape"]), np.dtype(data["dtype"])
            return spaces.Box(
                _unbound(data["low"], shape, dtype),
                _unbound(data["high"], shape, dtype),
                shape,
                dtype,
            )
        if kind == "Discrete":
            return spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(
                np.asarray(data["nvec"]),
                dtype=data.get("dtype", "int64"),
                start=np.asarray(data["start"]),
            )
        if kind == "MultiBinary":
            return spaces.MultiBinary(data["n"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ColumnError(f"a recorded space is malformed ({exc!r:.200})") from exc
    raise ColumnError(f"a recorded space has an unknown type {data.get('type')!r:.80}")
