"""Replay checkpoints and prefills: a ring to and from a trajectory store file.

``rb.dumps(dir)`` writes ``dir/storage/replay.h5``, an ordinary trajectory store (rows
oldest first, one store episode per surviving episode) whose manifest metadata holds what
an exact restore needs; ``StoreReplay.from_store`` prefills a ring from any store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.reader import StoreReader
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.data.replay.ring_episodes import age_rows
from torchstore.data.rows.packed import PackedColumns
from torchstore.errors import DestinationError, StoreFormatError, UnsupportedError
from torchstore.validation import positive_int

__all__ = [
    "REPLAY_FILE",
    "Ring",
    "dump_replay",
    "load_replay",
    "fill_from_store",
    "replay_from_store",
]

#: File a replay checkpoint writes inside the folder given to ``dumps``.
REPLAY_FILE = "replay.h5"
#: Manifest metadata key holding what a restore needs beyond rows and episodes.
META_KEY = "torchstore.replay"
_META_VERSION = 1
_SLAB_ROWS = 65536
#: What a restore takes when a checkpoint written before these keys were kept lacks them.
_LAYOUT_DEFAULTS = {
    "tensor_mode": False,
    "returns_index": False,
    "treespec": None,
    "row_batch": [],
    "stacked": None,
}


class Ring(Protocol):
    """What checkpoints and prefills read and set of a replay ring (``StoreReplay`` has it)."""

    max_size: int
    ndim: int
    initialized: bool
    device: Any

    @property
    def packed(self) -> PackedColumns: ...

    def episode_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def ring_state(self) -> dict[str, Any]: ...

    def restore_ring(self, lengths: torch.Tensor, state: Mapping[str, Any]) -> None: ...

    def adopt_columns(self, columns: Sequence[ColumnSpec]) -> None: ...


def _refuse_multi_env(replay: Ring, what: str) -> None:
    if replay.ndim != 1:
        raise UnsupportedError(
            f"StoreReplay(ndim={replay.ndim}).{what} is not supported: the checkpoint file "
            "holds one episode stream; checkpoint a multi-env ring with state_dict() and "
            "torch.save"
        )


def dump_replay(replay: Ring, path: Path) -> None:
    """Write the ring to ``path/replay.h5`` as a trajectory store, oldest rows first.

    The previous checkpoint is never destroyed: the new one is written aside and renamed
    over it only once complete (a kill or an error before that leaves the old one
    loadable). A ``replay.h5`` that is not a torchstore store, or that another live process
    is writing, is refused.
    """
    if not replay.initialized:
        raise RuntimeError("Cannot save a non-initialized storage.")
    _refuse_multi_env(replay, "dumps")
    if path.exists() and not path.is_dir():
        raise DestinationError(f"{path} is a file; a replay checkpoint is written into a folder")
    path.mkdir(parents=True, exist_ok=True)
    start, length, _ = replay.episode_segments()
    meta = {"version": _META_VERSION, "capacity": replay.max_size, **replay.ring_state()}
    cap = replay.max_size
    packed = replay.packed
    with TrajectoryStoreWriter(
        path / REPLAY_FILE, packed.columns, metadata={META_KEY: meta}, overwrite=True
    ) as writer:
        # A segment is at most two physical runs (it may wrap past row capacity-1);
        # each run is written as views of the blocks, in slabs, with no gather.
        for first, seg_len in zip(start.tolist(), length.tolist(), strict=True):
            head = min(seg_len, cap - first)
            for lo, hi in ((first, first + head), (0, seg_len - head)):
                for a in range(lo, hi, _SLAB_ROWS):
                    writer.append(packed.slice(a, min(hi, a + _SLAB_ROWS), raw=True), raw=True)
            writer.end_episode()


def load_replay(replay: Ring, path: Path) -> None:
    """Restore the exact ring (rows, cursor, episode ids) from :func:`dump_replay` output."""
    _refuse_multi_env(replay, "loads")
    file = path / REPLAY_FILE if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no replay checkpoint at {file}")
    with StoreReader(file) as store:
        meta = store.manifest.metadata.get(META_KEY)
        if meta is None:
            raise StoreFormatError(f"{file} is a trajectory store but not a replay checkpoint")
        if int(meta["capacity"]) != replay.max_size:
            raise ValueError(
                f"checkpoint {file} holds a ring of capacity {meta['capacity']}, "
                f"this one has {replay.max_size}"
            )
        replay.adopt_columns(store.columns)
        rows, cursor = int(meta["rows"]), int(meta["cursor"])
        if store.num_rows != rows:
            raise StoreFormatError(
                f"{file}: manifest says {rows} rows, the store holds {store.num_rows}"
            )
        if not (0 <= rows <= replay.max_size and 0 <= cursor < replay.max_size):
            raise StoreFormatError(f"{file}: ring position rows={rows}, cursor={cursor} is invalid")
        fill_from_store(replay, store, age_rows(rows, cursor, replay.max_size), 0)
        replay.restore_ring(store.episodes.lengths, {**_LAYOUT_DEFAULTS, **meta})


def fill_from_store(replay: Ring, store: StoreReader, physical: torch.Tensor, first: int) -> None:
    """Copy store rows ``first ..`` (raw codes) to physical rows ``physical``."""
    done = 0
    total = physical.numel()
    while done < total:
        n = min(_SLAB_ROWS, total - done)
        slab = store.read_slab(first + done, first + done + n, raw=True)
        rows = physical[done : done + n]
        packed = replay.packed
        values = {spec.name: slab.get(spec.key) for spec in packed.columns}
        if n and int(rows[-1]) - int(rows[0]) == n - 1:
            packed.write(slice(int(rows[0]), int(rows[0]) + n), values)
        else:
            packed.write(rows.to(replay.device), values)
        done += n


def replay_from_store(
    cls: Callable[..., Ring],
    store: Any,
    capacity: int | None = None,
    *,
    device: torch.device | str = "cpu",
    compilable: bool = False,
    columns: Any = None,
) -> Ring:
    """``StoreReplay.from_store``: see there (``cls`` builds the empty ring)."""
    owned = not isinstance(store, StoreReader)  # a path: open it here, close it after
    if owned:
        path = Path(store)
        if path.is_dir():
            path = path / REPLAY_FILE
        if not path.exists():
            raise FileNotFoundError(f"no trajectory store at {path}")
        store = StoreReader(path)
    try:
        total = store.num_rows
        if capacity is None:
            capacity = total
        empty_hint = " (the store is empty; pass capacity)" if total == 0 else ""
        capacity = positive_int("capacity", capacity, hint=empty_hint)
        specs = store.select_columns(columns)
        replay = cls(int(capacity), columns=specs, device=device, compilable=compilable)
        keep = min(total, replay.max_size)
        first = total - keep
        physical = torch.arange(keep, dtype=torch.int64)
        fill_from_store(replay, store, physical, first)
        lengths, offsets = store.episodes.lengths, store.episodes.offsets
        ends = offsets + lengths
        alive = ends > first
        kept_lengths = (ends[alive] - torch.clamp(offsets[alive], min=first)).to(torch.int64)
        ids = torch.nonzero(alive).reshape(-1).to(torch.int64)
        meta = store.manifest.metadata.get(META_KEY, {})
        if meta and len(meta.get("episode_ids", [])) == store.num_episodes:
            ids = torch.as_tensor(meta["episode_ids"], dtype=torch.int64)[alive]
            next_id = int(meta["next_episode_id"])
            is_open = bool(meta["open"])
        else:
            next_id = store.num_episodes
            is_open = False
        replay.restore_ring(
            kept_lengths,
            {
                "rows": keep,
                "cursor": keep % replay.max_size,
                "open": is_open and keep > 0,
                "next_episode_id": next_id,
                "episode_ids": ids.tolist(),
                "last_cursor_index": keep - 1 if keep else None,
            },
        )
        return replay
    finally:
        if owned:
            store.close()
