"""Motion datasets as trajectory stores: LAFAN1 retargeted to the Unitree G1.

Examples:
    >>> from torchstore.motion import import_lafan
    >>> import_lafan("lafan1/g1", "lafan_g1.h5", fps=50)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.motion.kinematics import (
        angular_velocity,
        linear_velocity,
        normalize_quat,
        quat_mul,
        slerp,
        wxyz_to_xyzw,
        xyzw_to_wxyz,
    )
    from torchstore.motion.lafan import (
        G1_JOINT_NAMES,
        LAFAN_ENV_ID,
        LAFAN_SOURCE_FPS,
        import_lafan,
        lafan_columns,
        lafan_rows,
        read_lafan_csv,
    )

_EXPORTS = {
    "angular_velocity": "torchstore.motion.kinematics",
    "linear_velocity": "torchstore.motion.kinematics",
    "normalize_quat": "torchstore.motion.kinematics",
    "quat_mul": "torchstore.motion.kinematics",
    "slerp": "torchstore.motion.kinematics",
    "wxyz_to_xyzw": "torchstore.motion.kinematics",
    "xyzw_to_wxyz": "torchstore.motion.kinematics",
    "G1_JOINT_NAMES": "torchstore.motion.lafan",
    "LAFAN_ENV_ID": "torchstore.motion.lafan",
    "LAFAN_SOURCE_FPS": "torchstore.motion.lafan",
    "import_lafan": "torchstore.motion.lafan",
    "lafan_columns": "torchstore.motion.lafan",
    "lafan_rows": "torchstore.motion.lafan",
    "read_lafan_csv": "torchstore.motion.lafan",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "import_lafan",
    "read_lafan_csv",
    "lafan_rows",
    "lafan_columns",
    "G1_JOINT_NAMES",
    "LAFAN_ENV_ID",
    "LAFAN_SOURCE_FPS",
    "angular_velocity",
    "linear_velocity",
    "normalize_quat",
    "quat_mul",
    "slerp",
    "xyzw_to_wxyz",
    "wxyz_to_xyzw",
]
