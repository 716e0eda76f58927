"""Quaternion math and finite differences against analytic answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.motion import kinematics as km

AXIS = np.array([1.0, 2.0, -2.0]) / 3.0  # a unit axis aligned with no coordinate axis


def _constant_rotation(rate: float, axis: np.ndarray, n: int, dt: float) -> np.ndarray:
    q0 = km.rotvec_to_quat([0.3, -0.2, 0.5])
    t = np.arange(n) * dt
    return km.quat_mul(km.rotvec_to_quat(np.outer(rate * t, axis)), q0)


def test_reorder_round_trip():
    q = np.array([[0.1, 0.2, 0.3, 0.9]])
    assert km.xyzw_to_wxyz(q).tolist() == [[0.9, 0.1, 0.2, 0.3]]
    np.testing.assert_array_equal(km.wxyz_to_xyzw(km.xyzw_to_wxyz(q)), q)


def test_normalize_quat():
    q = km.normalize_quat([[0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0)
    with pytest.raises(ValueError, match="non-zero"):
        km.normalize_quat([0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="4 components"):
        km.normalize_quat([1.0, 0.0, 0.0])


def test_quat_mul_matches_composed_rotations():
    a = km.rotvec_to_quat([0.0, 0.0, np.pi / 2])
    b = km.rotvec_to_quat([np.pi / 2, 0.0, 0.0])
    # b then a: x-axis rotation followed by z-axis rotation
    r = km.quat_to_rotvec(km.quat_mul(a, b))
    expected = km.quat_to_rotvec(km.quat_mul(a, km.quat_mul(b, [1.0, 0, 0, 0])))
    np.testing.assert_allclose(r, expected, atol=1e-12)
    np.testing.assert_allclose(km.quat_mul(a, km.quat_conj(a)), [1.0, 0, 0, 0], atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1.8, 1.8), min_size=3, max_size=3), st.booleans())
def test_rotvec_round_trip_either_sign(rotvec, flip):
    r = np.array(rotvec)  # |r| <= 1.8 * sqrt(3) < pi: the short way round is r itself
    q = km.rotvec_to_quat(r)
    np.testing.assert_allclose(np.linalg.norm(q), 1.0, atol=1e-12)
    back = km.quat_to_rotvec(-q if flip else q)
    np.testing.assert_allclose(back, r, atol=1e-9)


def test_rotvec_near_identity_is_finite():
    r = km.quat_to_rotvec([[1.0, 0.0, 0.0, 0.0], [1.0, 1e-12, 0.0, 0.0]])
    np.testing.assert_allclose(r, [[0, 0, 0], [2e-12, 0, 0]], atol=1e-20)


@pytest.mark.parametrize("rate", [0.7, 12.0, 60.0])
def test_angular_velocity_constant_rate_any_axis(rate):
    dt = 1.0 / 30.0
    q = _constant_rotation(rate, AXIS, 120, dt)  # 60 rad/s turns past q -> -q many times
    w = km.angular_velocity(q, dt)
    np.testing.assert_allclose(w, np.tile(rate * AXIS, (120, 1)), atol=1e-9)


def test_angular_velocity_ignores_sign_flips():
    dt = 1.0 / 30.0
    q = _constant_rotation(5.0, AXIS, 60, dt)
    signs = np.where(np.random.default_rng(0).random(60) < 0.5, -1.0, 1.0)
    np.testing.assert_allclose(
        km.angular_velocity(q * signs[:, None], dt), km.angular_velocity(q, dt), atol=1e-12
    )


def test_angular_velocity_is_world_frame():
    # A body spinning about its own x axis, after a fixed 90 deg yaw: the world-frame rate
    # points along world y, the body-frame rate would stay along x.
    dt = 0.01
    yaw = km.rotvec_to_quat([0.0, 0.0, np.pi / 2])
    spin = km.rotvec_to_quat(np.outer(np.arange(10) * dt * 2.0, [1.0, 0.0, 0.0]))
    w = km.angular_velocity(km.quat_mul(yaw, spin), dt)
    np.testing.assert_allclose(w, np.tile([0.0, 2.0, 0.0], (10, 1)), atol=1e-9)


def test_linear_velocity_central_inside_one_sided_at_ends():
    dt = 0.5
    x = np.array([0.0, 1.0, 4.0, 9.0])  # intervals 2, 6, 10 per second
    np.testing.assert_allclose(km.linear_velocity(x, dt), [2.0, 4.0, 8.0, 10.0])
    line = np.outer(np.arange(5) * dt, [1.0, -2.0, 0.5]) + [3.0, 0.0, 1.0]
    np.testing.assert_allclose(km.linear_velocity(line, dt), np.tile([1.0, -2.0, 0.5], (5, 1)))


def test_velocity_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 frames"):
        km.linear_velocity(np.zeros((1, 3)), 0.1)
    with pytest.raises(ValueError, match="dt"):
        km.linear_velocity(np.zeros((3, 3)), 0.0)
    with pytest.raises(ValueError, match=r"\[n >= 2, 4\]"):
        km.angular_velocity(np.array([[1.0, 0, 0, 0]]), 0.1)


def test_slerp_constant_rate_is_exact_and_short_way():
    q0 = km.rotvec_to_quat(0.2 * AXIS)
    q1 = km.rotvec_to_quat(1.0 * AXIS)
    for t in (0.0, 0.25, 0.5, 1.0):
        expected = km.rotvec_to_quat((0.2 + 0.8 * t) * AXIS)
        got = km.slerp(q0, -q1, t)  # the flipped end must not send it the long way
        assert abs(abs(np.dot(got, expected)) - 1.0) < 1e-12
    same = km.slerp(q0, q0, 0.3)
    np.testing.assert_allclose(same, q0, atol=1e-12)


def test_lerp_broadcasts_time():
    a = np.zeros((3, 2))
    b = np.ones((3, 2))
    np.testing.assert_allclose(km.lerp(a, b, np.array([0.0, 0.5, 1.0]))[:, 0], [0, 0.5, 1])


def test_resample_grid_covers_duration_without_extrapolating():
    index, frac = km.resample_grid(31, 30.0, 50.0)  # 1 s -> 51 frames
    assert len(index) == 51 and index.max() == 29 and frac[-1] == pytest.approx(1.0)
    index, frac = km.resample_grid(31, 30.0, 20.0)  # 1 s -> 21 frames
    assert len(index) == 21
    np.testing.assert_allclose(index + frac, np.arange(21) * 1.5)
    with pytest.raises(ValueError, match="dst_fps"):
        km.resample_grid(31, 30.0, 0.0)
    with pytest.raises(ValueError, match="at least 2 frames"):
        km.resample_grid(1, 30.0, 20.0)


def test_resample_linear_and_slerp_on_analytic_motion():
    src = np.arange(31) / 30.0
    x = np.sin(2.0 * src)
    got = km.resample_linear(x, 30.0, 50.0)
    new = np.arange(51) / 50.0
    # linear interpolation error <= dt^2 / 8 * max|x''| = (1/30)^2 / 8 * 4
    np.testing.assert_allclose(got, np.sin(2.0 * new), atol=(1 / 30) ** 2 / 2 + 1e-12)
    q = _constant_rotation(3.0, AXIS, 31, 1 / 30.0)
    qs = km.resample_slerp(q, 30.0, 50.0)
    expected = _constant_rotation(3.0, AXIS, 51, 1 / 50.0)
    np.testing.assert_allclose(np.abs(np.sum(qs * expected, axis=-1)), 1.0, atol=1e-12)
