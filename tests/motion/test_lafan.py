"""LAFAN1 G1 import against analytic motions with known velocities.

Tolerances: stored columns are float32, so "exact" answers are checked to 1e-5 (absolute,
values of order 1-40). Interpolation and finite-difference errors are bounded in each
test from h^2/8 max|x''| (linear interpolation) and h^2/6 max|x'''| (central differences),
h the frame spacing, with the bound written next to the assertion.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lafan_fixtures import (
    NUM_JOINTS,
    TILTED_AXIS,
    LinearMotion,
    SmoothMotion,
    csv_line,
    frames_of,
    write_csv,
    write_lines,
)

from torchstore.data import TrajectoryStore
from torchstore.errors import ColumnError, DestinationError, StoreFormatError
from torchstore.motion import (
    G1_JOINT_NAMES,
    LAFAN_SOURCE_FPS,
    import_lafan,
    lafan_columns,
    lafan_rows,
    read_lafan_csv,
)
from torchstore.motion import kinematics as km

EXACT = 1e-5
COLUMNS = ("root_pos", "root_quat", "joint_pos", "root_lin_vel", "root_ang_vel", "joint_vel")


def _episode(store: TrajectoryStore, i: int) -> dict[str, np.ndarray]:
    ep = store.episode(i)
    return {name: ep[name].numpy() for name in COLUMNS}


def _import_one(tmp_path: Path, frames: np.ndarray, **kwargs) -> dict[str, np.ndarray]:
    src = write_csv(tmp_path / "motion.csv", frames)
    store = TrajectoryStore(import_lafan(src, tmp_path / "store.h5", **kwargs))
    assert store.num_episodes == 1
    return _episode(store, 0)


def _same_rotation(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    np.testing.assert_allclose(np.abs(np.sum(a * b, axis=-1)), 1.0, atol=atol)


# --------------------------------------------------------------------------- known answers


def test_columns_and_joint_names():
    shapes = {c.name: c.shape for c in lafan_columns()}
    assert shapes == {
        "root_pos": (3,), "root_quat": (4,), "joint_pos": (29,),
        "root_lin_vel": (3,), "root_ang_vel": (3,), "joint_vel": (29,),
    }  # fmt: skip
    assert len(G1_JOINT_NAMES) == NUM_JOINTS == len(set(G1_JOINT_NAMES))
    assert G1_JOINT_NAMES[0] == "left_hip_pitch_joint"
    assert G1_JOINT_NAMES[12:15] == ("waist_yaw_joint", "waist_roll_joint", "waist_pitch_joint")
    assert G1_JOINT_NAMES[-1] == "right_wrist_yaw_joint"


def test_constant_velocities_are_exact_at_every_frame(tmp_path):
    motion = LinearMotion()
    n = 45
    t = np.arange(n) / LAFAN_SOURCE_FPS
    ep = _import_one(tmp_path, frames_of(motion, n))
    assert all(ep[name].dtype == np.float32 and len(ep[name]) == n for name in COLUMNS)
    np.testing.assert_allclose(ep["root_pos"], motion.root_pos(t), atol=EXACT)
    np.testing.assert_allclose(ep["joint_pos"], motion.joint_pos(t), atol=EXACT)
    np.testing.assert_allclose(ep["root_lin_vel"], motion.root_lin_vel(t), atol=EXACT)
    np.testing.assert_allclose(ep["joint_vel"], motion.joint_vel(t), atol=EXACT)
    np.testing.assert_allclose(ep["root_ang_vel"], motion.root_ang_vel(t), atol=EXACT)
    _same_rotation(ep["root_quat"], motion.root_quat(t), atol=EXACT)


@pytest.mark.parametrize("canonical_sign", [False, True], ids=["continuous", "qw>=0"])
@pytest.mark.parametrize("rate", [0.5, 9.0, 40.0])
def test_angular_velocity_about_tilted_axis_through_double_cover(tmp_path, rate, canonical_sign):
    # 40 rad/s over 3 s is 120 rad: q turns into -q and back many times; with qw >= 0 the
    # stored sequence also jumps q -> -q between frames. Neither may show in the rate.
    motion = LinearMotion(ang_rate=rate)
    frames = frames_of(motion, 91, canonical_sign=canonical_sign)
    if canonical_sign and rate > 1:
        assert (np.sum(frames[1:, 3:7] * frames[:-1, 3:7], axis=1) < 0).any()
    ep = _import_one(tmp_path, frames)
    expected = np.tile(rate * TILTED_AXIS, (91, 1))
    np.testing.assert_allclose(ep["root_ang_vel"], expected, atol=EXACT * rate)


def test_smooth_motion_velocities_within_difference_error(tmp_path):
    motion = SmoothMotion()
    n = 61
    t = np.arange(n) / LAFAN_SOURCE_FPS
    ep = _import_one(tmp_path, frames_of(motion, n))
    inner = slice(1, -1)  # central differences: h^2/6 max|x'''| = h^2/6 * 5.07 = 9.4e-4
    for name in ("root_lin_vel", "root_ang_vel", "joint_vel"):
        expected = getattr(motion, name)(t)
        np.testing.assert_allclose(ep[name][inner], expected[inner], atol=1e-3, err_msg=name)
        # one-sided at both ends: h/2 max|x''| = h/2 * 3.38 = 0.056
        np.testing.assert_allclose(ep[name][[0, -1]], expected[[0, -1]], atol=0.06, err_msg=name)


@pytest.mark.parametrize("fps", [50, 20])
def test_resampling_matches_analytic_motion(tmp_path, fps):
    motion = SmoothMotion()
    src = write_csv(tmp_path / "smooth.csv", frames_of(motion, 61))  # 2 s at 30 fps
    store = TrajectoryStore(import_lafan(src, tmp_path / "store.h5", fps=fps))
    ep = _episode(store, 0)
    m = 2 * fps + 1
    t = np.arange(m) / fps
    assert len(ep["root_pos"]) == m
    assert store.episode_metadata(0)["frames"] == m
    assert store.episode_metadata(0)["source_frames"] == 61
    assert store.manifest.metadata["motion"]["fps"] == fps
    # linear interpolation at 30 fps: h^2/8 max|x''| = (1/30)^2/8 * 2.4 = 3.3e-4
    np.testing.assert_allclose(ep["root_pos"], motion.root_pos(t), atol=4e-4)
    np.testing.assert_allclose(ep["joint_pos"], motion.joint_pos(t), atol=4e-4)
    # slerp: the same bound on the rotation angle, |d^2 angle/dt^2| <= 3.4 -> 4.7e-4 rad,
    # so |<q, q_true>| >= cos(angle/2) ~ 1 - 3e-8 (float32 rounding dominates)
    _same_rotation(ep["root_quat"], motion.root_quat(t), atol=1e-6)
    # velocities after resampling, inside: central-difference error plus the difference of
    # two interpolation errors over 2h' (h' = 1/fps): <= 2 * 3.4e-4 / 0.04 + 1e-3 ~ 1.8e-2
    # at 50 fps (observed 5.4e-3); at the one-sided ends h'/2 * 3.38 <= 0.085
    for name in ("root_lin_vel", "root_ang_vel", "joint_vel"):
        expected = getattr(motion, name)(t)
        np.testing.assert_allclose(ep[name][1:-1], expected[1:-1], atol=2e-2, err_msg=name)
        np.testing.assert_allclose(ep[name][[0, -1]], expected[[0, -1]], atol=0.09, err_msg=name)


def test_resampling_constant_motion_stays_exact(tmp_path):
    motion = LinearMotion(ang_rate=7.0)
    ep = _import_one(tmp_path, frames_of(motion, 31), fps=50)
    t = np.arange(51) / 50
    for name in ("root_pos", "joint_pos", "root_lin_vel", "joint_vel"):
        np.testing.assert_allclose(ep[name], getattr(motion, name)(t), atol=EXACT, err_msg=name)
    np.testing.assert_allclose(ep["root_ang_vel"], motion.root_ang_vel(t), atol=EXACT * 7)
    _same_rotation(ep["root_quat"], motion.root_quat(t), atol=EXACT)


def test_quat_order_and_normalisation(tmp_path):
    frames = frames_of(LinearMotion(), 10)
    frames[:, 3:7] *= 1.05  # slightly off unit norm: normalised, not rejected
    wxyz = lafan_rows(frames)
    xyzw = lafan_rows(frames, quat_order="xyzw")
    np.testing.assert_allclose(np.linalg.norm(wxyz["root_quat"], axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(xyzw["root_quat"], wxyz["root_quat"][:, [1, 2, 3, 0]])
    np.testing.assert_allclose(xyzw["root_quat"], frames[:, 3:7] / 1.05, atol=1e-6)
    np.testing.assert_array_equal(xyzw["root_ang_vel"], wxyz["root_ang_vel"])
    ep = _import_one(tmp_path, frames, quat_order="xyzw")
    np.testing.assert_array_equal(ep["root_quat"], xyzw["root_quat"])


def test_folder_becomes_sorted_episodes_with_metadata(tmp_path):
    src = tmp_path / "g1"
    lengths = {"walk1_subject1.csv": 12, "dance2_subject3.csv": 7, "run1_subject2.csv": 9}
    for name, n in lengths.items():
        write_csv(src / name, frames_of(LinearMotion(), n))
    (src / "README.txt").write_text("not a motion")
    dest = import_lafan(src, tmp_path / "lafan.h5", quat_order="xyzw")
    store = TrajectoryStore(dest)
    names = sorted(lengths)
    assert store.num_episodes == 3
    assert store.num_rows == sum(lengths.values())
    assert store.manifest.env_id == "lafan1/g1"
    for i, name in enumerate(names):
        assert store.episode_metadata(i) == {
            "file": name, "frames": lengths[name], "source_frames": lengths[name], "source_fps": 30,
        }  # fmt: skip
        assert len(store.episode(i)["root_pos"]) == lengths[name]
    motion = store.manifest.metadata["motion"]
    assert motion["joint_names"] == list(G1_JOINT_NAMES)
    assert motion["robot"] == "unitree_g1"
    assert motion["dataset"] == "LAFAN1 retargeted"
    assert (motion["source_fps"], motion["fps"], motion["quat_order"]) == (30, 30, "xyzw")
    assert motion["velocity_frame"] == "world"


def test_overwrite(tmp_path):
    src = write_csv(tmp_path / "a.csv", frames_of(LinearMotion(), 5))
    dest = import_lafan(src, tmp_path / "s.h5")
    with pytest.raises(FileExistsError, match="already exists"):
        import_lafan(src, dest)
    write_csv(src, frames_of(LinearMotion(), 8))
    assert TrajectoryStore(import_lafan(src, dest, overwrite=True)).num_rows == 8


def test_the_source_is_never_the_destination(tmp_path):
    src = write_csv(tmp_path / "a.csv", frames_of(LinearMotion(), 5))
    before = src.read_bytes()
    with pytest.raises(DestinationError, match="is the input"):
        import_lafan(src, src, overwrite=True)
    with pytest.raises(DestinationError, match="not a torchstore store"):
        import_lafan(
            src, write_csv(tmp_path / "b.csv", frames_of(LinearMotion(), 5)), overwrite=True
        )
    assert src.read_bytes() == before


def test_resume_appends_the_files_not_yet_committed(tmp_path, monkeypatch):
    import torchstore.motion.lafan as lafan_module

    folder = tmp_path / "g1"
    folder.mkdir()
    for i, n in enumerate((5, 7, 9)):
        write_csv(folder / f"m{i}.csv", frames_of(LinearMotion(), n))
    whole = TrajectoryStore(import_lafan(folder, tmp_path / "whole.h5"))
    part = tmp_path / "part" / "s.h5"
    read = lafan_module.read_lafan_csv
    calls = []

    def interrupted_read(path):
        calls.append(path)
        if len(calls) == 5:  # 3 validation reads, then the write pass's second file
            raise KeyboardInterrupt
        return read(path)

    monkeypatch.setattr(lafan_module, "read_lafan_csv", interrupted_read)
    with pytest.raises(KeyboardInterrupt):
        import_lafan(folder, part)
    monkeypatch.setattr(lafan_module, "read_lafan_csv", read)
    with TrajectoryStore(part) as store:
        assert store.num_episodes == 1
    with pytest.raises(FileExistsError):
        import_lafan(folder, part)
    with pytest.raises(ValueError, match="exclude each other"):
        import_lafan(folder, part, resume=True, overwrite=True)
    with pytest.raises(StoreFormatError, match="not an interrupted import"):
        import_lafan(folder, part, resume=True, fps=60)
    resumed = TrajectoryStore(import_lafan(folder, part, resume=True))
    assert [resumed.episode_metadata(i)["file"] for i in range(3)] == ["m0.csv", "m1.csv", "m2.csv"]
    for name in ("root_pos", "joint_pos"):
        assert (
            resumed.read_slab(0, resumed.num_rows, [name])
            .get(name)
            .equal(whole.read_slab(0, whole.num_rows, [name]).get(name))
        )


# --------------------------------------------------------------------------- bad input


def _good_lines(n: int = 4) -> list[str]:
    return [csv_line(row) for row in frames_of(LinearMotion(), n)]


def _import_lines(tmp_path: Path, lines: list[str], name: str = "bad.csv"):
    return import_lafan(write_lines(tmp_path / name, lines), tmp_path / "out.h5")


@pytest.mark.parametrize("ncols", [35, 37, 7 + 19])
def test_wrong_column_count(tmp_path, ncols):
    rows = frames_of(LinearMotion(), 4)
    rows = np.concatenate([rows, rows], axis=1)[:, :ncols]
    lines = [csv_line(r) for r in rows]
    match = (
        r"bad.csv line 1: expected 36 .*G1.*3 root position \+ 4 root quaternion.*29 joint"
        rf".*got {ncols}.*H1 and H1_2"
    )
    with pytest.raises(ColumnError, match=match):
        _import_lines(tmp_path, lines)


def test_ragged_row_names_its_line(tmp_path):
    lines = _good_lines(5)
    lines[3] = lines[3].rsplit(",", 1)[0]
    with pytest.raises(ColumnError, match="bad.csv line 4: expected 36 .* got 35"):
        _import_lines(tmp_path, lines)


def test_non_numeric_cell(tmp_path):
    lines = _good_lines()
    cells = lines[2].split(",")
    cells[8] = "abc"
    lines[2] = ",".join(cells)
    match = r"bad.csv line 3, column 9 \(left_hip_roll_joint\): expected a number, got 'abc'"
    with pytest.raises(StoreFormatError, match=match):
        _import_lines(tmp_path, lines)


def test_header_row_is_rejected_with_hint(tmp_path):
    header = ",".join(["x", "y", "z", "qx", "qy", "qz", "qw", *G1_JOINT_NAMES])
    with pytest.raises(StoreFormatError, match="line 1, column 1.*got 'x'.*no header row"):
        _import_lines(tmp_path, [header, *_good_lines()])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_value(tmp_path, value):
    lines = _good_lines()
    cells = lines[1].split(",")
    cells[4] = value
    lines[1:2] = ["", ",".join(cells)]  # a blank line before it: lines, not rows, are named
    match = r"bad.csv line 3, column 5 \(qy\): expected a finite number, got"
    with pytest.raises(StoreFormatError, match=match):
        _import_lines(tmp_path, lines)


def test_quaternion_far_from_unit_norm(tmp_path):
    frames = frames_of(LinearMotion(), 5)
    frames[2, 3:7] *= 1.2
    match = r"bad.csv line 3: root quaternion .* norm 1.2; expected unit norm within 0.1"
    with pytest.raises(StoreFormatError, match=match):
        _import_lines(tmp_path, [csv_line(r) for r in frames])
    frames[2, 3:7] = 0.0
    with pytest.raises(StoreFormatError, match="norm 0;"):
        _import_lines(tmp_path, [csv_line(r) for r in frames])


@pytest.mark.parametrize("n", [0, 1])
def test_too_short_to_differentiate(tmp_path, n):
    with pytest.raises(StoreFormatError, match=f"bad.csv: expected at least 2 frames .*got {n}"):
        _import_lines(tmp_path, _good_lines(n))


def test_too_short_after_resampling(tmp_path):
    src = write_csv(tmp_path / "short.csv", frames_of(LinearMotion(), 2))
    match = "short.csv: 2 frames at 30 fps give fewer than 2 frames at 20 fps"
    with pytest.raises(StoreFormatError, match=match):
        import_lafan(src, tmp_path / "s.h5", fps=20)


def test_not_utf8(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(StoreFormatError, match="bin.csv: expected UTF-8"):
        read_lafan_csv(path)


def test_bad_file_leaves_no_partial_store(tmp_path):
    src = tmp_path / "g1"
    write_csv(src / "a_good.csv", frames_of(LinearMotion(), 5))
    write_lines(src / "b_bad.csv", _good_lines(1))
    with pytest.raises(StoreFormatError, match="b_bad.csv"):
        import_lafan(src, tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()


def test_missing_source_and_empty_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_lafan(tmp_path / "nope", tmp_path / "s.h5")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"holds no \*\.csv files"):
        import_lafan(tmp_path / "empty", tmp_path / "s.h5")


@pytest.mark.parametrize("fps", [0, -30, float("nan"), float("inf")])
def test_bad_fps(tmp_path, fps):
    src = write_csv(tmp_path / "a.csv", frames_of(LinearMotion(), 5))
    with pytest.raises(
        ValueError, match=r"fps \(.*\) must be a finite number > 0 \(frames per second\) or None"
    ):
        import_lafan(src, tmp_path / "s.h5", fps=fps)


def test_fps_of_wrong_type(tmp_path):
    with pytest.raises(TypeError, match=r"fps \('50'\) must be a finite number > 0"):
        import_lafan(tmp_path, tmp_path / "s.h5", fps="50")


def test_bad_quat_order(tmp_path):
    with pytest.raises(ValueError, match=r"quat_order \('wzyx'\) must be 'wxyz' .* or 'xyzw'"):
        import_lafan(tmp_path, tmp_path / "s.h5", quat_order="wzyx")


def test_lafan_rows_rejects_wrong_shape():
    with pytest.raises(ColumnError, match=r"expected frames shaped \[n, 36\]"):
        lafan_rows(np.zeros((4, 30)))


def test_kinematics_agree_with_rows():
    frames = frames_of(SmoothMotion(), 20)
    rows = lafan_rows(frames)
    q = km.normalize_quat(km.xyzw_to_wxyz(frames[:, 3:7]))
    np.testing.assert_allclose(rows["root_ang_vel"], km.angular_velocity(q, 1 / 30), atol=1e-6)
