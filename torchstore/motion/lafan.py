"""LAFAN1 motions retargeted to the Unitree G1: CSV parsing, validation and store import.

The public retargeted set holds one CSV per motion: no header, comma-separated, 30 frames
per second, 36 columns per row (root position x, y, z; root quaternion qx, qy, qz, qw,
scalar last; the 29 G1 joint positions in radians, in :data:`G1_JOINT_NAMES` order).
:func:`import_lafan` turns one file or a folder of them into one trajectory store, one
episode per file, with derived velocities.

Conventions (also written into the store's manifest under ``metadata["motion"]``):

- ``root_quat`` is normalised and stored in the chosen order (``"wxyz"`` scalar-first by
  default, or ``"xyzw"`` as in the files); its sign is left as the file has it.
- ``root_lin_vel`` and ``root_ang_vel`` are in the **world frame**. ``root_ang_vel`` comes
  from ``q[t+1] * conj(q[t])`` as axis * angle / dt, the short way round, so a file that
  flips ``q`` to ``-q`` between frames is harmless.
- Velocities are per frame: central differences inside (the mean of the two neighbouring
  intervals), the forward interval at the first frame and the backward interval at the
  last frame. Constant velocities come out exact at every frame.
- With ``fps`` set, positions and joint positions are resampled linearly and the
  orientation by slerp onto ``t = k / fps`` within the source duration (no
  extrapolation); velocities are computed after resampling, at the new rate.

The data's licence (CC BY-NC-ND) forbids shipping it: bring your own copy.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchstore.data import ColumnSpec, TrajectoryStoreWriter
from torchstore.errors import ColumnError, StoreFormatError
from torchstore.motion import kinematics as km
from torchstore.validation import positive_number

__all__ = [
    "G1_JOINT_NAMES",
    "LAFAN_SOURCE_FPS",
    "LAFAN_ENV_ID",
    "QUAT_ORDERS",
    "QUAT_NORM_TOLERANCE",
    "lafan_columns",
    "read_lafan_csv",
    "lafan_rows",
    "import_lafan",
]

#: The 29 G1 joints, in the order of the CSV columns 8..36.
G1_JOINT_NAMES: tuple[str, ...] = tuple(
    f"{name}_joint"
    for name in (
        "left_hip_pitch", "left_hip_roll", "left_hip_yaw", "left_knee",
        "left_ankle_pitch", "left_ankle_roll",
        "right_hip_pitch", "right_hip_roll", "right_hip_yaw", "right_knee",
        "right_ankle_pitch", "right_ankle_roll",
        "waist_yaw", "waist_roll", "waist_pitch",
        "left_shoulder_pitch", "left_shoulder_roll", "left_shoulder_yaw", "left_elbow",
        "left_wrist_roll", "left_wrist_pitch", "left_wrist_yaw",
        "right_shoulder_pitch", "right_shoulder_roll", "right_shoulder_yaw", "right_elbow",
        "right_wrist_roll", "right_wrist_pitch", "right_wrist_yaw",
    )
)  # fmt: skip
#: Frame rate of the retargeted CSVs.
LAFAN_SOURCE_FPS = 30
#: ``env_id`` of stores written by :func:`import_lafan`.
LAFAN_ENV_ID = "lafan1/g1"
#: Accepted orders of ``root_quat`` in the store.
QUAT_ORDERS = ("wxyz", "xyzw")
#: A file quaternion whose norm is further than this from 1 is an error, not noise.
QUAT_NORM_TOLERANCE = 0.1

_NUM_JOINTS = len(G1_JOINT_NAMES)
_NUM_COLUMNS = 3 + 4 + _NUM_JOINTS  # 36
_FILE_COLUMNS: tuple[str, ...] = (
    "root x", "root y", "root z", "qx", "qy", "qz", "qw", *G1_JOINT_NAMES
)  # fmt: skip


def lafan_columns() -> list[ColumnSpec]:
    """The columns of a LAFAN1 G1 store: root pose, joint positions and their velocities."""
    f32 = torch.float32
    return [
        ColumnSpec("root_pos", f32, (3,)),
        ColumnSpec("root_quat", f32, (4,)),
        ColumnSpec("joint_pos", f32, (_NUM_JOINTS,)),
        ColumnSpec("root_lin_vel", f32, (3,)),
        ColumnSpec("root_ang_vel", f32, (3,)),
        ColumnSpec("joint_vel", f32, (_NUM_JOINTS,)),
    ]


# ----------------------------------------------------------------------------- validation


def _check_fps(fps: Any) -> float | None:
    if fps is None:
        return None
    return float(positive_number("fps", fps, hint=" (frames per second) or None"))


def _check_quat_order(quat_order: Any) -> str:
    if quat_order not in QUAT_ORDERS:
        raise ValueError(
            f"quat_order ({quat_order!r}) must be 'wxyz' (scalar first) or 'xyzw' (scalar last)"
        )
    return quat_order


def _column_count_error(name: str, line: int, got: int) -> ColumnError:
    return ColumnError(
        f"{name} line {line}: expected {_NUM_COLUMNS} comma-separated columns for the "
        f"Unitree G1 (3 root position + 4 root quaternion xyzw + {_NUM_JOINTS} joint "
        f"positions), got {got}; H1 and H1_2 files have other layouts and are not "
        "supported by this G1 column map"
    )


def _data_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every non-empty line, the rows np.loadtxt reads."""
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for number, line in enumerate(fh, start=1):
            text = line.rstrip("\r\n")
            if text:
                yield number, text


def _line_of_row(path: Path, row: int) -> int:
    for i, (number, _) in enumerate(_data_lines(path)):
        if i == row:
            return number
    return row + 1  # unreachable for rows np.loadtxt returned


def _diagnose(path: Path) -> None:
    """Re-read a file np.loadtxt refused, line by line, and raise the precise error."""
    name = path.name
    for number, text in _data_lines(path):
        cells = text.split(",")
        if len(cells) != _NUM_COLUMNS:
            raise _column_count_error(name, number, len(cells))
        for col, cell in enumerate(cells):
            try:
                float(cell)
            except ValueError:
                hint = " (the G1 CSVs have no header row)" if number == 1 else ""
                raise StoreFormatError(
                    f"{name} line {number}, column {col + 1} ({_FILE_COLUMNS[col]}): "
                    f"expected a number, got {cell.strip()!r}{hint}"
                ) from None


def read_lafan_csv(path: str | os.PathLike[str]) -> np.ndarray:
    """Read and validate one retargeted G1 CSV.

    Returns:
        float64 ``[frames, 36]`` exactly as in the file (quaternion still xyzw, not yet
        normalised).

    Raises:
        ColumnError: a line does not have 36 columns (e.g. an H1 or H1_2 file).
        StoreFormatError: a cell is not a number or not finite, a root quaternion's norm
            is further than :data:`QUAT_NORM_TOLERANCE` from 1, the file has fewer than 2
            frames, or it is not UTF-8 text.

    Examples:
        >>> frames = read_lafan_csv("g1/walk1_subject1.csv")  # doctest: +SKIP
        >>> frames.shape  # doctest: +SKIP
        (7840, 36)
    """
    path = Path(path)
    name = path.name
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            frames = np.loadtxt(
                path, delimiter=",", dtype=np.float64, ndmin=2, comments=None, encoding="utf-8-sig"
            )
    except UnicodeDecodeError as exc:
        raise StoreFormatError(
            f"{name}: expected UTF-8 CSV text, got undecodable bytes ({exc})"
        ) from None
    except ValueError as exc:
        _diagnose(path)
        raise StoreFormatError(f"{name}: not a readable G1 CSV ({exc})") from exc
    if frames.shape[0] and frames.shape[1] != _NUM_COLUMNS:
        raise _column_count_error(name, _line_of_row(path, 0), frames.shape[1])
    if frames.shape[0] < 2:
        raise StoreFormatError(
            f"{name}: expected at least 2 frames to compute velocities, got {frames.shape[0]}"
        )
    finite = np.isfinite(frames)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise StoreFormatError(
            f"{name} line {_line_of_row(path, row)}, column {col + 1} ({_FILE_COLUMNS[col]}): "
            f"expected a finite number, got {frames[row, col]}"
        )
    norm = np.linalg.norm(frames[:, 3:7], axis=1)
    off = np.abs(norm - 1.0) > QUAT_NORM_TOLERANCE
    if off.any():
        row = int(np.argmax(off))
        raise StoreFormatError(
            f"{name} line {_line_of_row(path, row)}: root quaternion (qx, qy, qz, qw) = "
            f"{tuple(float(v) for v in frames[row, 3:7])} has norm {norm[row]:.6g}; expected "
            f"unit norm within {QUAT_NORM_TOLERANCE} (closer ones are normalised)"
        )
    return frames


# ----------------------------------------------------------------------------- conversion


def lafan_rows(
    frames: np.ndarray,
    *,
    fps: float | None = None,
    quat_order: str = "wxyz",
    source: str = "frames",
) -> dict[str, np.ndarray]:
    """Validated ``[n, 36]`` CSV frames -> the float32 columns of one episode.

    Args:
        frames: rows as :func:`read_lafan_csv` returns them (30 fps, quaternion xyzw).
        fps: resample to this rate first (linear / slerp); ``None`` keeps 30 fps.
        quat_order: order of the stored ``root_quat``, ``"wxyz"`` or ``"xyzw"``.
        source: name used in error messages.

    Returns:
        ``root_pos``, ``root_quat``, ``joint_pos``, ``root_lin_vel``, ``root_ang_vel``,
        ``joint_vel``, each ``[m, ...]`` float32 (``m = n`` unless resampled).
    """
    fps = _check_fps(fps)
    quat_order = _check_quat_order(quat_order)
    frames = np.asarray(frames, dtype=np.float64)
    if frames.ndim != 2 or frames.shape[1] != _NUM_COLUMNS:
        raise ColumnError(
            f"{source}: expected frames shaped [n, {_NUM_COLUMNS}], got {frames.shape}"
        )
    pos = frames[:, 0:3]
    quat = km.normalize_quat(km.xyzw_to_wxyz(frames[:, 3:7]))
    joints = frames[:, 7:]
    rate = float(LAFAN_SOURCE_FPS)
    if fps is not None and fps != rate:
        if km.resample_grid(len(frames), rate, fps)[0].shape[0] < 2:
            raise StoreFormatError(
                f"{source}: {len(frames)} frames at {LAFAN_SOURCE_FPS} fps give fewer than 2 "
                f"frames at {fps:g} fps; expected at least 2 to compute velocities"
            )
        pos = km.resample_linear(pos, rate, fps)
        quat = km.resample_slerp(quat, rate, fps)
        joints = km.resample_linear(joints, rate, fps)
        rate = fps
    dt = 1.0 / rate
    rows = {
        "root_pos": pos,
        "root_quat": quat if quat_order == "wxyz" else km.wxyz_to_xyzw(quat),
        "joint_pos": joints,
        "root_lin_vel": km.linear_velocity(pos, dt),
        "root_ang_vel": km.angular_velocity(quat, dt),
        "joint_vel": km.linear_velocity(joints, dt),
    }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in rows.items()}


# ----------------------------------------------------------------------------- import


def _source_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if not source.exists():
        raise FileNotFoundError(f"LAFAN1 source ({source}) does not exist")
    files = sorted(
        (p for p in source.iterdir() if p.suffix.lower() == ".csv" and p.is_file()),
        key=lambda p: p.name,
    )
    if not files:
        raise FileNotFoundError(
            f"LAFAN1 source folder ({source}) holds no *.csv files; expected the retargeted "
            "G1 CSVs (e.g. g1/walk1_subject1.csv)"
        )
    return files


def _manifest_metadata(files: Sequence[Path], fps: float | None, quat_order: str) -> dict:
    return {
        "motion": {
            "dataset": "LAFAN1 retargeted",
            "robot": "unitree_g1",
            "joint_names": list(G1_JOINT_NAMES),
            "source_fps": LAFAN_SOURCE_FPS,
            "fps": LAFAN_SOURCE_FPS if fps is None else fps,
            "quat_order": quat_order,
            "velocity_frame": "world",
            "velocity_scheme": "central inside; forward at the first frame, backward at the last",
            "resampling": (
                None if fps in (None, LAFAN_SOURCE_FPS) else "linear positions, slerp orientation"
            ),
            "files": len(files),
        }
    }


def import_lafan(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    fps: float | None = None,
    quat_order: str = "wxyz",
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
) -> Path:
    """Import retargeted LAFAN1 G1 CSVs into one trajectory store, one episode per file.

    Every file is read and validated before the store is created, so a bad file leaves no
    partial store behind; memory holds one file at a time. Each file is committed as it
    is written: an interrupted import keeps the files it committed, and ``resume=True``
    appends the rest.

    Args:
        source: one CSV file, or a folder whose ``*.csv`` files are imported in name order.
        dest: path of the store to write; missing parent folders are created.
        fps: resample to this frame rate (linear positions, slerp orientation);
            ``None`` keeps the source 30 fps.
        quat_order: order of the stored ``root_quat``: ``"wxyz"`` or ``"xyzw"``.
        overwrite: replace an existing store at ``dest`` (never a file that is not a
            store, and never ``source`` itself).
        resume: continue an interrupted import of the same files with the same options
            into ``dest``.
        progress: show a progress bar over files (tqdm, if installed).

    Returns:
        ``dest`` as a ``Path``.

    Raises:
        FileNotFoundError: ``source`` is missing, or a folder without CSV files.
        DestinationExistsError: ``dest`` exists and neither ``overwrite`` nor ``resume``
            is set (also a ``FileExistsError``).
        DestinationError: ``dest`` is ``source``, a folder, or a file that is not a store.
        ValueError: ``fps`` is not positive, or ``quat_order`` is unknown.
        ColumnError: a file does not have 36 columns.
        StoreFormatError: a file's content is invalid (see :func:`read_lafan_csv`), or
            ``resume`` on a store that is not an earlier part of this import.

    Examples:
        >>> import_lafan("lafan1/g1", "lafan_g1.h5", fps=50)  # doctest: +SKIP
        >>> store = TrajectoryStore("lafan_g1.h5")  # doctest: +SKIP
        >>> store.episode_metadata(0)["file"]  # doctest: +SKIP
        'aiming1_subject1.csv'
    """
    from torchstore.io.destination import check_destination
    from torchstore.io.progress import progress_bar

    fps = _check_fps(fps)
    quat_order = _check_quat_order(quat_order)
    if overwrite and resume:
        raise ValueError("overwrite and resume exclude each other: start over, or continue")
    dest = Path(dest)
    resuming = resume and dest.exists()
    files = _source_files(Path(source))
    if not resuming:  # the files, not their folder: a store may sit next to its CSVs
        check_destination(dest, sources=files, overwrite=overwrite)
    metadata = _manifest_metadata(files, fps, quat_order)
    todo = _remaining(files, metadata, dest) if resuming else files
    bar = progress_bar(enabled=progress, total=2 * len(todo), unit="file", desc="import-lafan")
    try:
        for _ in _episodes(todo, fps, quat_order):  # validation pass: before the store exists
            if bar is not None:
                bar.update()
        if resuming:
            writer = TrajectoryStoreWriter.resume(dest)
        else:
            writer = TrajectoryStoreWriter(
                dest,
                lafan_columns(),
                env_id=LAFAN_ENV_ID,
                seed=None,
                metadata=metadata,
                overwrite=overwrite,
            )
        with writer:
            for rows, meta in _episodes(todo, fps, quat_order):
                writer.add_episode(rows, metadata=meta)
                if bar is not None:
                    bar.update()
    except BaseException:
        if bar is not None:
            bar.leave = False  # the error, not a stalled bar, is the last thing shown
        raise
    finally:
        if bar is not None:
            bar.close()
    return dest


def _episodes(
    todo: Sequence[Path], fps: float | None, quat_order: str
) -> Iterator[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """``(rows, episode metadata)`` of each file, read and checked one at a time."""
    for path in todo:
        frames = read_lafan_csv(path)
        rows = lafan_rows(frames, fps=fps, quat_order=quat_order, source=path.name)
        meta = {
            "file": path.name,
            "frames": int(rows["root_pos"].shape[0]),
            "source_frames": int(frames.shape[0]),
            "source_fps": LAFAN_SOURCE_FPS,
        }
        yield rows, meta


def _remaining(files: Sequence[Path], metadata: dict, dest: Path) -> list[Path]:
    """The files an interrupted import into ``dest`` has not committed yet."""
    from torchstore.data.store.store import TrajectoryStore

    with TrajectoryStore(dest) as store:
        done = [store.episode_metadata(i).get("file") for i in range(store.num_episodes)]
        same = store.manifest.metadata == metadata and store.manifest.env_id == LAFAN_ENV_ID
    if not same or done != [p.name for p in files[: len(done)]]:
        raise StoreFormatError(
            f"{dest} is not an interrupted import of these {len(files)} files with these "
            "options; import into another path, or pass overwrite=True to start over"
        )
    return list(files[len(done) :])
