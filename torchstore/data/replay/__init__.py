"""The replay ring: :class:`StoreReplay`, torchrl's ``Storage`` over packed rows.

``ring`` is the ring's face; its writes, append plans, reads, row indexing, columns added
late, shared memory, state and compile guard are rooms of their own beside it
(``writes``, ``append_plan``, ``reads``, ``index``, ``ring_columns``, ``shared``, ``state``,
``compiled``, ``batches``), with the episode index a ring keeps (``ring_episodes``), its
checkpoints to a store file (``checkpoint``), torchrl's own checkpointers
(``torchrl_checkpointers``) and a whole torchrl buffer's checkpoint folder
(``buffer_dump``). Imports :mod:`torchstore.data.rows` for its rows and
:mod:`torchstore.data.file` for checkpoints; never the samplers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.data.replay.buffer_dump import dump_buffer, load_buffer
    from torchstore.data.replay.ring import (
        END_COLUMNS,
        REPLAY_FILE,
        StoreReplay,
        StoreReplayCheckpointer,
    )

_EXPORTS = {
    "StoreReplay": "torchstore.data.replay.ring",
    "StoreReplayCheckpointer": "torchstore.data.replay.ring",
    "REPLAY_FILE": "torchstore.data.replay.ring",
    "END_COLUMNS": "torchstore.data.replay.ring",
    "dump_buffer": "torchstore.data.replay.buffer_dump",
    "load_buffer": "torchstore.data.replay.buffer_dump",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "END_COLUMNS",
    "REPLAY_FILE",
    "StoreReplay",
    "StoreReplayCheckpointer",
    "dump_buffer",
    "load_buffer",
]
