"""The trajectory store as a reader opens it: :class:`TrajectoryStore`, sets of shards, checks.

:class:`~torchstore.data.store.store.TrajectoryStore` is a store file opened for reading, as a
sequence of rows with its episodes, and the door to residency (``resident()``, ``window()``);
:class:`~torchstore.data.store.store_set.StoreSet` reads a folder of shards as one store;
:func:`~torchstore.data.store.verify.verify_store` checks every byte against its checksum, and
:mod:`~torchstore.data.store.summary` describes a store for ``torchstore info``. The top of the
data layer: imports :mod:`torchstore.data.file` and :mod:`torchstore.data.residency`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.data.store.store_set import StoreSet, open_store
    from torchstore.data.store.verify import verify_store

_EXPORTS = {
    "TrajectoryStore": "torchstore.data.store.store",
    "StoreSet": "torchstore.data.store.store_set",
    "open_store": "torchstore.data.store.store_set",
    "verify_store": "torchstore.data.store.verify",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["StoreSet", "TrajectoryStore", "open_store", "verify_store"]
