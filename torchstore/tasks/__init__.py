"""Small tasks implemented in numpy, with scripted experts and demonstration stores.

The default task is :class:`ReachTask` (2-D reach-and-stop); ``write_demo_data`` records
its expert into the store the recipes train on (``data/reach_demo.h5``).
"""

from __future__ import annotations

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
from torchstore.tasks.rollout import RandomPolicy, Task, evaluate

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
