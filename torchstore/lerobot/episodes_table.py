"""Rows of ``meta/episodes``, built column by column.

One :class:`EpisodeRow` per saved episode; :func:`episodes_table` turns any number of them
into the Arrow table LeRobot 0.6 writes, with one Arrow array per column (building row by
row from Python objects costs more than the rest of a save).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchstore.io.records.parquet import require_pyarrow
from torchstore.lerobot.stats import STAT_NAMES

__all__ = ["EpisodeRow", "concat_episode_tables", "episodes_table"]


@dataclass
class EpisodeRow:
    """What the episodes table says about one episode."""

    index: int
    length: int
    tasks: list[str]
    data: tuple[int, int]
    from_index: int
    stats: Mapping[str, Mapping[str, np.ndarray]]
    videos: dict[str, tuple[tuple[int, int], float, float]] = field(
        default_factory=dict
    )  # pos, from, to


def _nested(values: np.ndarray, element) -> Any:
    """``values`` ``[E, *shape]`` as an Arrow array of (nested) variable lists of ``element``."""
    pa = require_pyarrow()
    shape = values.shape[1:] or (1,)
    nested = pa.array(values.reshape(-1), type=element)
    for size in reversed(shape):
        count = len(nested) // size
        nested = pa.ListArray.from_arrays(
            pa.array(np.arange(count + 1, dtype=np.int32) * size), nested
        )
    return nested


def episodes_table(rows: Sequence[EpisodeRow], meta: tuple[int, int]):
    """The episodes table of ``rows`` (in order), all stored in the episodes file ``meta``."""
    pa = require_pyarrow()
    ints = pa.int64()
    columns: list[tuple[str, Any]] = [
        ("episode_index", pa.array([r.index for r in rows], ints)),
        ("tasks", pa.array([r.tasks for r in rows], pa.list_(pa.string()))),
        ("length", pa.array([r.length for r in rows], ints)),
        ("data/chunk_index", pa.array([r.data[0] for r in rows], ints)),
        ("data/file_index", pa.array([r.data[1] for r in rows], ints)),
        ("dataset_from_index", pa.array([r.from_index for r in rows], ints)),
        ("dataset_to_index", pa.array([r.from_index + r.length for r in rows], ints)),
    ]
    for key in rows[0].videos:
        columns += [
            (f"videos/{key}/chunk_index", pa.array([r.videos[key][0][0] for r in rows], ints)),
            (f"videos/{key}/file_index", pa.array([r.videos[key][0][1] for r in rows], ints)),
            (
                f"videos/{key}/from_timestamp",
                pa.array([r.videos[key][1] for r in rows], pa.float64()),
            ),
            (
                f"videos/{key}/to_timestamp",
                pa.array([r.videos[key][2] for r in rows], pa.float64()),
            ),
        ]
    for name in rows[0].stats:
        for stat in STAT_NAMES:
            values = np.stack([np.asarray(r.stats[name][stat]) for r in rows])
            if stat == "count":
                element = ints
            else:  # every other stat is a double (a bool feature's min/max too, as lerobot 0.6)
                element, values = pa.float64(), values.astype(np.float64)
            columns.append((f"stats/{name}/{stat}", _nested(values, element)))
    columns += [
        ("meta/episodes/chunk_index", pa.array([meta[0]] * len(rows), ints)),
        ("meta/episodes/file_index", pa.array([meta[1]] * len(rows), ints)),
    ]
    return pa.Table.from_arrays([a for _, a in columns], names=[n for n, _ in columns])


def _as_doubles(type_):
    """``type_`` with a bool leaf replaced by float64 (lists nest), or None if it has none."""
    pa = require_pyarrow()
    if pa.types.is_boolean(type_):
        return pa.float64()
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        inner = _as_doubles(type_.value_type)
        if inner is None:
            return None
        return pa.large_list(inner) if pa.types.is_large_list(type_) else pa.list_(inner)
    return None


def concat_episode_tables(tables: Sequence[Any]):
    """Episodes tables of one dataset as one table, their stats columns in lerobot 0.6's types.

    lerobot 0.4 (and torchstore before it followed lerobot 0.6) wrote a bool feature's
    ``stats/<feature>/min`` and ``max`` as lists of booleans, lerobot 0.6 as doubles: a
    dataset extended by another version holds both, which Arrow will not concatenate. Such
    columns are cast to doubles (True is 1.0) first.
    """
    pa = require_pyarrow()
    cast = []
    for table in tables:
        schema = table.schema
        for i, column_field in enumerate(schema):
            name, type_ = column_field.name, column_field.type
            doubles = _as_doubles(type_) if name.startswith("stats/") else None
            if doubles is not None:
                table = table.set_column(
                    i, column_field.with_type(doubles), table.column(i).cast(doubles)
                )
        cast.append(table)
    return pa.concat_tables(cast, promote_options="default")
