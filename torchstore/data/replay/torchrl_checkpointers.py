"""torchrl's own checkpointers on a ``StoreReplay``, through a ``LazyTensorStorage`` mirror.

torchrl's ``TensorStorageCheckpointer`` family (``TensorStorageCheckpointer``,
``FlatStorageCheckpointer``, ``NestedStorageCheckpointer``, ``H5StorageCheckpointer``) reads
and writes a storage's ``_storage`` TensorDict, which a ``StoreReplay`` does not have (its
rows are packed blocks). Such a checkpointer is run on a ``LazyTensorStorage`` holding a
copy of the ring (every slot, its physical layout, its length and last cursor), so the
folder it writes is exactly the folder torchrl writes for that storage: a
``LazyTensorStorage`` loads it, and a ``StoreReplay`` loads a folder written from a
``LazyTensorStorage``. The copy costs one ring's memory while a dump or load runs.

torchrl's folders hold no ring cursor and no episode index, so a dump also writes
:data:`RING_FILE` beside them (the columns, the episode index, the cursor, and a digest of
the valid rows it describes): a ``StoreReplay`` that loads the folder back is restored
exactly (rows, length, cursor, episode ids). Without that file, or when the rows loaded
are not the ones it describes (torchrl dumped another storage into the folder since), the
torchrl convention holds: a full ring is taken to have wrapped exactly and the episode
index is rebuilt from the end flags.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.data.replay_buffers.storages import LazyTensorStorage

from torchstore.errors import UnsupportedError

__all__ = ["RING_FILE", "dump_with_torchrl", "load_with_torchrl", "is_torchrl_checkpointer"]

#: What a torchrl checkpointer's folder cannot hold, written beside it by a dump.
RING_FILE = "torchstore_ring.pt"
_STATE_KEY = "torchstore_replay"
_TORCHRL_KEYS = ("_storage", "initialized", "_len")
_DIGEST_KEY = "rows_digest"


class TorchrlRing(Protocol):
    """What a dump or load through torchrl's checkpointers reads and sets of a replay ring
    (``StoreReplay`` has it)."""

    max_size: int
    ndim: int
    initialized: bool
    device: Any
    _treespec: Any
    _stacked: Any
    _last_cursor: Any
    _last_cursor_index: Any

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def is_torchrl_checkpointer(value: Any) -> bool:
    """Whether ``value`` is one of torchrl's ``TensorStorage`` checkpointers."""
    return isinstance(value, TensorStorageCheckpointer)


def _ring_file(path: Path) -> Path:
    # H5StorageCheckpointer takes a file path (``*.h5``) or a folder; the others a folder.
    if path.suffix == ".h5":
        return path.with_name(path.name + "." + RING_FILE)
    return path / RING_FILE


def _mirror(replay: TorchrlRing) -> LazyTensorStorage:
    device = "cpu" if replay.device == "auto" else replay.device
    return LazyTensorStorage(replay.max_size, ndim=replay.ndim, device=device)


def dump_with_torchrl(replay: TorchrlRing, checkpointer: Any, path: str | Path) -> None:
    """Run torchrl's ``checkpointer.dumps`` on a mirror of the ring; add :data:`RING_FILE`."""
    if not replay.initialized:
        raise RuntimeError("Cannot save a non-initialized storage.")
    if replay._treespec is not None:
        raise UnsupportedError(
            f"{type(checkpointer).__name__} cannot checkpoint a StoreReplay of pytrees; drop "
            "the checkpointer= argument (StoreReplay's own checkpoint file keeps pytrees)"
        )
    if replay._stacked is not None:
        raise UnsupportedError(
            f"{type(checkpointer).__name__} cannot checkpoint a StoreReplay of lazily stacked "
            "entries that differ; drop the checkpointer= argument (StoreReplay's own "
            "checkpoint file keeps them)"
        )
    state = replay.state_dict()
    mirror = _mirror(replay)
    mirror.load_state_dict({k: state[k] for k in _TORCHRL_KEYS})
    # the save hooks (FlatStorageCheckpointer's) read where the ring wraps from these
    mirror._last_cursor = replay._last_cursor
    mirror._set_last_cursor(replay._last_cursor_index)
    path = Path(path)
    checkpointer.dumps(mirror, path)
    own = {k: v for k, v in state[_STATE_KEY].items() if k != "blocks"}
    own["len"] = len(replay)
    own[_DIGEST_KEY] = _rows_digest(mirror)
    torch.save(own, _ring_file(path))


def load_with_torchrl(replay: TorchrlRing, checkpointer: Any, path: str | Path) -> None:
    """Run torchrl's ``checkpointer.loads`` into a mirror, then load its rows into the ring.

    With the :data:`RING_FILE` a dump wrote, describing the rows loaded (the same length
    and the same rows digest), the cursor and episode index are restored exactly;
    else the folder is read as a ``LazyTensorStorage``'s.
    """
    path = Path(path)
    mirror = _mirror(replay)
    checkpointer.loads(mirror, path)
    state = {k: v for k, v in mirror.state_dict().items() if k in _TORCHRL_KEYS}
    ring = _ring_file(path)
    if ring.exists():
        own = torch.load(ring, weights_only=True)
        length, digest = int(own.pop("len", -1)), own.pop(_DIGEST_KEY, None)
        if length == int(state["_len"]) and digest == _rows_digest(mirror):
            state[_STATE_KEY] = own
    replay.load_state_dict(state)


def _rows_digest(storage: LazyTensorStorage) -> str:
    """A SHA-256 digest of a ``LazyTensorStorage``'s valid rows: every leaf's name, dtype,
    shape and bytes (what a torchrl checkpointer writes and reads back bit for bit)."""
    data = storage._storage
    n = len(storage)
    h = hashlib.sha256()
    h.update(f"{n}/{storage.ndim}".encode())
    if isinstance(data, TensorDictBase):
        leaves = sorted(
            (k if isinstance(k, str) else "/".join(k), v)
            for k, v in data.items(include_nested=True, leaves_only=True)
        )
    else:
        leaves = [("", data)]
    for name, value in leaves:
        rows = value.flatten(0, storage.ndim - 1)[:n] if storage.ndim > 1 else value[:n]
        rows = rows.detach().to("cpu").contiguous()
        h.update(f"{name}:{rows.dtype}:{list(rows.shape)};".encode())
        if rows.numel():
            h.update(rows.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()
