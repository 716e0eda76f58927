"""Pure quaternion and finite-difference math for motion data (numpy, float64).

Every quaternion here is **scalar-first** ``(w, x, y, z)`` unless a name says otherwise
(:func:`xyzw_to_wxyz`, :func:`wxyz_to_xyzw` convert). Arrays carry any leading batch shape
and the 4 (or 3) components last. Nothing here touches files, torch or the store, so it can
be tested alone.

Conventions:

- A quaternion ``q`` rotates body-frame vectors into the world frame. ``q`` and ``-q`` are
  the same rotation (the double cover); every function below is indifferent to the sign.
- Angular velocity is in the **world frame**: the rotation from frame ``t`` to ``t+1`` is
  ``q_rel = q[t+1] * conj(q[t])`` (left-multiplied, i.e. expressed in world axes), taken
  the short way round (``q_rel`` flipped to ``w >= 0``) and turned into axis * angle / dt.
  The body-frame rate would be ``conj(q[t]) * q[t+1]``; it is not what we store.
- Per-frame velocities come from per-interval ones (:func:`frame_velocity`): interior
  frames average the two neighbouring intervals (a central difference, second-order
  accurate), the first frame uses the forward interval and the last frame the backward
  one (first-order). A motion with constant velocity is therefore reproduced exactly
  at every frame, endpoints included.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from torchstore.validation import positive_number

__all__ = [
    "normalize_quat",
    "xyzw_to_wxyz",
    "wxyz_to_xyzw",
    "quat_conj",
    "quat_mul",
    "quat_to_rotvec",
    "rotvec_to_quat",
    "frame_velocity",
    "linear_velocity",
    "angular_velocity",
    "lerp",
    "slerp",
    "resample_grid",
    "resample_linear",
    "resample_slerp",
]

# Below this sine of the half angle, rotvec/slerp use their series forms.
_SMALL = 1e-8


def _as_quat(q: ArrayLike) -> np.ndarray:
    arr = np.asarray(q, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[-1] != 4:
        raise ValueError(f"quaternions must have 4 components last, got shape {arr.shape}")
    return arr


def normalize_quat(q: ArrayLike) -> np.ndarray:
    """Scale quaternions to unit norm; a zero quaternion raises ``ValueError``.

    Examples:
        >>> normalize_quat([2.0, 0.0, 0.0, 0.0]).tolist()
        [1.0, 0.0, 0.0, 0.0]
    """
    q = _as_quat(q)
    norm = np.linalg.norm(q, axis=-1, keepdims=True)
    if np.any(norm == 0) or not np.all(np.isfinite(norm)):
        raise ValueError("quaternion norm must be finite and non-zero to normalise")
    return q / norm


def xyzw_to_wxyz(q: ArrayLike) -> np.ndarray:
    """Reorder scalar-last ``(x, y, z, w)`` quaternions to scalar-first ``(w, x, y, z)``."""
    q = _as_quat(q)
    return np.concatenate([q[..., 3:4], q[..., 0:3]], axis=-1)


def wxyz_to_xyzw(q: ArrayLike) -> np.ndarray:
    """Reorder scalar-first ``(w, x, y, z)`` quaternions to scalar-last ``(x, y, z, w)``."""
    q = _as_quat(q)
    return np.concatenate([q[..., 1:4], q[..., 0:1]], axis=-1)


def quat_conj(q: ArrayLike) -> np.ndarray:
    """Conjugate ``(w, -x, -y, -z)``: the inverse rotation of a unit quaternion."""
    q = _as_quat(q)
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def quat_mul(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """Hamilton product ``a * b`` (apply ``b`` first, then ``a``), broadcasting."""
    a, b = _as_quat(a), _as_quat(b)
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_to_rotvec(q: ArrayLike) -> np.ndarray:
    """Unit quaternion -> rotation vector (axis * angle), the short way: angle in [0, pi].

    ``q`` and ``-q`` give the same result.

    Examples:
        >>> np.round(quat_to_rotvec([0.0, 0.0, 0.0, 1.0]), 6).tolist()  # 180 deg about z
        [0.0, 0.0, 3.141593]
    """
    q = _as_quat(q)
    q = np.where(q[..., :1] < 0, -q, q)  # double cover: pick w >= 0, angle <= pi
    w = q[..., 0]
    v = q[..., 1:]
    s = np.linalg.norm(v, axis=-1)
    safe_s = np.where(s < _SMALL, 1.0, s)
    # angle = 2 atan2(|v|, w); scale = angle / |v|, with its series 2/w (1 - s^2/(3 w^2))
    # near the identity (w ~ 1 there, so no division by a small w).
    scale = np.where(
        s < _SMALL,
        2.0 / np.maximum(w, _SMALL) * (1.0 - s**2 / (3.0 * np.maximum(w, _SMALL) ** 2)),
        2.0 * np.arctan2(s, w) / safe_s,
    )
    return v * scale[..., None]


def rotvec_to_quat(rotvec: ArrayLike) -> np.ndarray:
    """Rotation vector (axis * angle) -> unit quaternion ``(w, x, y, z)``."""
    r = np.asarray(rotvec, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] != 3:
        raise ValueError(f"rotation vectors must have 3 components last, got shape {r.shape}")
    angle = np.linalg.norm(r, axis=-1)
    half = 0.5 * angle
    # sin(angle/2)/angle, with its series near zero
    safe = np.where(angle < _SMALL, 1.0, angle)
    k = np.where(angle < _SMALL, 0.5 - angle**2 / 48.0, np.sin(half) / safe)
    return np.concatenate([np.cos(half)[..., None], r * k[..., None]], axis=-1)


def frame_velocity(interval: ArrayLike) -> np.ndarray:
    """Per-interval velocities ``[n-1, ...]`` -> per-frame velocities ``[n, ...]``.

    Interior frames average their two intervals (central difference); frame 0 takes the
    forward interval and frame ``n-1`` the backward one.
    """
    iv = np.asarray(interval, dtype=np.float64)
    if iv.ndim == 0 or iv.shape[0] < 1:
        raise ValueError("need at least one interval (two frames) to form velocities")
    out = np.empty((iv.shape[0] + 1, *iv.shape[1:]), dtype=np.float64)
    out[0] = iv[0]
    out[-1] = iv[-1]
    out[1:-1] = 0.5 * (iv[:-1] + iv[1:])
    return out


def _check_dt(dt: float) -> float:
    return float(positive_number("dt", dt, hint=" (seconds)"))


def linear_velocity(x: ArrayLike, dt: float) -> np.ndarray:
    """Velocity of positions ``x[n, ...]`` sampled every ``dt`` seconds, per frame.

    Central differences inside, one-sided at both ends (see :func:`frame_velocity`).
    """
    x = np.asarray(x, dtype=np.float64)
    dt = _check_dt(dt)
    if x.ndim == 0 or x.shape[0] < 2:
        raise ValueError(f"need at least 2 frames to differentiate, got {x.shape[:1]}")
    return frame_velocity(np.diff(x, axis=0) / dt)


def angular_velocity(q: ArrayLike, dt: float) -> np.ndarray:
    """World-frame angular velocity ``[n, 3]`` (rad/s) of unit quaternions ``q[n, 4]`` (wxyz).

    Per interval: ``q_rel = q[t+1] * conj(q[t])``, flipped to ``w >= 0`` so sign flips of
    the stored quaternions (``q`` -> ``-q``) cost nothing, then axis * angle / dt. A
    rotation of more than pi radians between two frames cannot be told from the shorter
    one the other way round; at 30 fps that is a rate above 94 rad/s.

    Examples:
        >>> q = [[1.0, 0.0, 0.0, 0.0], rotvec_to_quat([0.0, 0.0, 0.1])]
        >>> np.round(angular_velocity(q, 0.1), 6)[0].tolist()
        [0.0, 0.0, 1.0]
    """
    q = _as_quat(q)
    dt = _check_dt(dt)
    if q.ndim != 2 or q.shape[0] < 2:
        raise ValueError(f"need quaternions shaped [n >= 2, 4], got {q.shape}")
    rel = quat_mul(q[1:], quat_conj(q[:-1]))
    return frame_velocity(quat_to_rotvec(rel) / dt)


def lerp(a: ArrayLike, b: ArrayLike, t: ArrayLike) -> np.ndarray:
    """Linear interpolation ``a + t (b - a)``; ``t`` broadcasts over trailing axes of ``a``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    t = t.reshape(t.shape + (1,) * (a.ndim - t.ndim)) if a.ndim > t.ndim else t
    return a + t * (b - a)


def slerp(q0: ArrayLike, q1: ArrayLike, t: ArrayLike) -> np.ndarray:
    """Spherical interpolation of unit quaternions, the short way round, elementwise.

    ``t`` has the batch shape of ``q0``/``q1`` (or broadcasts to it); the result is unit
    norm. Nearly equal rotations fall back to normalised linear interpolation.
    """
    q0, q1 = _as_quat(q0), _as_quat(q1)
    t = np.asarray(t, dtype=np.float64)[..., None]
    dot = np.sum(q0 * q1, axis=-1, keepdims=True)
    q1 = np.where(dot < 0, -q1, q1)  # double cover: interpolate along the shorter arc
    dot = np.clip(np.abs(dot), 0.0, 1.0)
    theta = np.arccos(dot)
    sin_theta = np.sin(theta)
    near = sin_theta < 1e-6
    safe = np.where(near, 1.0, sin_theta)
    w0 = np.where(near, 1.0 - t, np.sin((1.0 - t) * theta) / safe)
    w1 = np.where(near, t, np.sin(t * theta) / safe)
    out = w0 * q0 + w1 * q1
    return out / np.linalg.norm(out, axis=-1, keepdims=True)


def resample_grid(n: int, src_fps: float, dst_fps: float) -> tuple[np.ndarray, np.ndarray]:
    """Where the frames of a ``dst_fps`` grid fall on ``n`` frames sampled at ``src_fps``.

    The new grid starts at the first frame (t = 0) and steps by ``1 / dst_fps`` while it
    stays within the source duration ``(n - 1) / src_fps``; it never extrapolates.

    Returns:
        ``(index, frac)``: frame ``k`` lies ``frac[k]`` of the way from source frame
        ``index[k]`` to ``index[k] + 1`` (``index`` is at most ``n - 2``).
    """
    if n < 2:
        raise ValueError(f"need at least 2 frames to resample, got {n}")
    src_fps = float(positive_number("src_fps", src_fps))
    dst_fps = float(positive_number("dst_fps", dst_fps))
    duration = (n - 1) / src_fps
    m = int(np.floor(duration * dst_fps + 1e-9)) + 1
    pos = np.arange(m, dtype=np.float64) * (src_fps / dst_fps)  # in source frames
    index = np.minimum(np.floor(pos + 1e-9).astype(np.int64), n - 2)
    frac = np.clip(pos - index, 0.0, 1.0)
    return index, frac


def resample_linear(x: ArrayLike, src_fps: float, dst_fps: float) -> np.ndarray:
    """Resample ``x[n, ...]`` from ``src_fps`` to ``dst_fps`` by linear interpolation."""
    x = np.asarray(x, dtype=np.float64)
    index, frac = resample_grid(x.shape[0], src_fps, dst_fps)
    return lerp(x[index], x[index + 1], frac)


def resample_slerp(q: ArrayLike, src_fps: float, dst_fps: float) -> np.ndarray:
    """Resample unit quaternions ``q[n, 4]`` (wxyz) from ``src_fps`` to ``dst_fps`` by slerp."""
    q = _as_quat(q)
    index, frac = resample_grid(q.shape[0], src_fps, dst_fps)
    return slerp(q[index], q[index + 1], frac)
