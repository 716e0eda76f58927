"""Small tasks implemented in numpy, with scripted experts and demonstration stores.

The default task is :class:`ReachTask` (2-D reach-and-stop); ``write_demo_data`` records
its expert into the store the recipes train on (``data/reach_demo.h5``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.tasks.reach import (
        ACTION_DIM,
        STATE_DIM,
        TASK_ID,
        ReachExpert,
        ReachTask,
        expert_baselines,
        reach_columns,
        render_frame,
        write_demo_data,
    )
    from torchstore.tasks.rollout import (
        RandomPolicy,
        Task,
        evaluate,
    )

_EXPORTS = {
    "ACTION_DIM": "torchstore.tasks.reach",
    "STATE_DIM": "torchstore.tasks.reach",
    "TASK_ID": "torchstore.tasks.reach",
    "ReachExpert": "torchstore.tasks.reach",
    "ReachTask": "torchstore.tasks.reach",
    "expert_baselines": "torchstore.tasks.reach",
    "reach_columns": "torchstore.tasks.reach",
    "render_frame": "torchstore.tasks.reach",
    "write_demo_data": "torchstore.tasks.reach",
    "RandomPolicy": "torchstore.tasks.rollout",
    "Task": "torchstore.tasks.rollout",
    "evaluate": "torchstore.tasks.rollout",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ACTION_DIM",
    "STATE_DIM",
    "TASK_ID",
    "RandomPolicy",
    "ReachExpert",
    "ReachTask",
    "Task",
    "evaluate",
    "expert_baselines",
    "reach_columns",
    "render_frame",
    "write_demo_data",
]
