"""Analytic G1 motions written in the LAFAN1 CSV layout (the real data may not be shipped).

Each motion is a set of functions of time with known derivatives, so tests compare the
importer against exact answers. Frames are ``[n, 36]``: root x y z, quaternion qx qy qz qw
(scalar last, as in the files), 29 joint positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torchstore.motion import kinematics as km

NUM_JOINTS = 29
#: A unit rotation axis aligned with none of x, y, z.
TILTED_AXIS = np.array([1.0, 2.0, -2.0]) / 3.0
_Q0 = km.rotvec_to_quat([0.3, -0.2, 0.5])  # initial orientation, wxyz


@dataclass
class LinearMotion:
    """Root moving on a straight line, spinning at a constant rate about a fixed world
    axis, joints at constant speeds: every velocity is constant and known exactly."""

    lin_vel: np.ndarray = field(default_factory=lambda: np.array([0.8, -0.3, 0.05]))
    ang_rate: float = 2.0
    axis: np.ndarray = field(default_factory=lambda: TILTED_AXIS.copy())
    joint_speed: np.ndarray = field(default_factory=lambda: np.linspace(-1.5, 1.5, NUM_JOINTS))

    def root_pos(self, t: np.ndarray) -> np.ndarray:
        return np.array([1.0, 2.0, 0.75]) + np.outer(t, self.lin_vel)

    def root_quat(self, t: np.ndarray) -> np.ndarray:  # wxyz
        return km.quat_mul(km.rotvec_to_quat(np.outer(self.ang_rate * t, self.axis)), _Q0)

    def joint_pos(self, t: np.ndarray) -> np.ndarray:
        return np.linspace(-0.5, 0.5, NUM_JOINTS) + np.outer(t, self.joint_speed)

    def root_lin_vel(self, t: np.ndarray) -> np.ndarray:
        return np.tile(self.lin_vel, (len(t), 1))

    def root_ang_vel(self, t: np.ndarray) -> np.ndarray:
        return np.tile(self.ang_rate * self.axis, (len(t), 1))

    def joint_vel(self, t: np.ndarray) -> np.ndarray:
        return np.tile(self.joint_speed, (len(t), 1))


@dataclass
class SmoothMotion:
    """Curved motion (sines, an accelerating rotation) to test interpolation error."""

    freq: np.ndarray = field(default_factory=lambda: np.linspace(0.5, 2.0, NUM_JOINTS))
    amp: float = 0.6

    def root_pos(self, t: np.ndarray) -> np.ndarray:
        return np.stack([np.sin(t), 0.5 * np.cos(2 * t), 0.7 + 0.1 * t], axis=-1)

    def _angle(self, t: np.ndarray) -> np.ndarray:
        return 1.5 * np.sin(1.5 * t) + 0.5 * t

    def root_quat(self, t: np.ndarray) -> np.ndarray:  # wxyz
        return km.quat_mul(km.rotvec_to_quat(np.outer(self._angle(t), TILTED_AXIS)), _Q0)

    def joint_pos(self, t: np.ndarray) -> np.ndarray:
        return self.amp * np.sin(np.outer(t, self.freq) + np.arange(NUM_JOINTS))

    def root_lin_vel(self, t: np.ndarray) -> np.ndarray:
        return np.stack([np.cos(t), -np.sin(2 * t), np.full_like(t, 0.1)], axis=-1)

    def root_ang_vel(self, t: np.ndarray) -> np.ndarray:
        rate = 2.25 * np.cos(1.5 * t) + 0.5
        return np.outer(rate, TILTED_AXIS)

    def joint_vel(self, t: np.ndarray) -> np.ndarray:
        return self.amp * self.freq * np.cos(np.outer(t, self.freq) + np.arange(NUM_JOINTS))


def frames_of(motion, n: int, fps: float = 30.0, *, canonical_sign: bool = False) -> np.ndarray:
    """``[n, 36]`` CSV frames of ``motion`` sampled at ``fps``.

    ``canonical_sign`` stores every quaternion with ``qw >= 0``, as many exporters do,
    which makes the stored sequence jump from ``q`` to ``-q`` as it turns.
    """
    t = np.arange(n) / fps
    q = motion.root_quat(t)
    if canonical_sign:
        q = np.where(q[:, :1] < 0, -q, q)
    return np.concatenate([motion.root_pos(t), km.wxyz_to_xyzw(q), motion.joint_pos(t)], axis=1)


def write_csv(path: Path, frames: np.ndarray) -> Path:
    """Write frames the way the dataset does: no header, comma-separated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, frames, delimiter=",", fmt="%.17g")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    """Write raw text lines (for malformed files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def csv_line(row: np.ndarray) -> str:
    return ",".join(f"{v:.17g}" for v in row)
