"""``torchstore verify`` of a LeRobot folder: what can be checked without checksums.

LeRobot keeps no checksums of its frames, so a folder cannot be verified byte by byte as
a store is. :func:`check_folder` checks what the format does let a reader check, without
decoding a frame: ``meta/info.json`` and the metadata :class:`LeRobotSource` reads at open
(tasks, the episode table and its Parquet footers, the totals), then every data file the
episode table names (present, a whole Parquet file whose footer parses, holding at least
the rows placed in it) and every video file it names (present and not empty). Its verdict
says so, and that importing the folder makes a store whose every byte ``verify`` checks.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from torchstore.errors import LeRobotFormatError, ParquetFormatError

__all__ = ["FolderCheck", "check_folder"]


@dataclass
class FolderCheck:
    """What :func:`check_folder` found; ``problems`` is empty for a folder that passed."""

    path: Path
    version: str = "?"
    episodes: int = 0
    frames: int = 0
    data_files: int = 0
    videos: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def verdict(self) -> str:
        """One line: ``PATH: OK as a LeRobot ... dataset (...)`` or ``PATH: DAMAGED: ...``."""
        if not self.ok:
            shown = "; ".join(self.problems[:3])
            more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
            return f"{self.path}: DAMAGED: {shown}{more}"
        return (
            f"{self.path}: OK as a LeRobot {self.version} dataset "
            f"({_count(self.episodes, 'episode')}, {_count(self.frames, 'frame')}; "
            "info.json, the episode table and "
            f"{_count(self.data_files, 'data file')} complete to their Parquet footers, "
            f"{_count(self.videos, 'video')} present). "
            "LeRobot keeps no checksums, so the frames themselves were not checked: "
            f"`torchstore import {self.path} {self.path.resolve().name}.h5` makes a store "
            "whose every byte verify checks"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _check_data_file(path: Path, rows: int) -> str | None:
    """Why the data file at ``path`` cannot hold the ``rows`` frames placed in it, or None."""
    import pyarrow.parquet as pq

    from torchstore.io.records.parquet import check_footer

    try:
        check_footer(path)
        held = pq.read_metadata(path).num_rows
    except ParquetFormatError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:  # pyarrow: a footer that does not parse
        return f"{path} has a Parquet footer that cannot be read ({exc})"
    if held < rows:
        return f"{path} holds {held} rows, the episode table places {rows} frames in it"
    return None


def _check_video(path: Path) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path} is missing"
    return None if size > 0 else f"{path} is empty"


def check_folder(root: str | os.PathLike) -> FolderCheck:
    """Check the LeRobot folder at ``root`` as far as its format allows; never raises for
    a damaged folder (each problem is a line of the result).

    Examples:
        >>> check_folder("so101_demo").verdict()  # doctest: +SKIP
        'so101_demo: OK as a LeRobot v3.0 dataset (3 episodes, 90 frames; ...'
    """
    from torchstore.lerobot.source import LeRobotSource

    report = FolderCheck(Path(root))
    try:
        source = LeRobotSource(root)
    except (LeRobotFormatError, OSError) as exc:
        report.problems.append(" ".join(str(exc).split()))
        return report
    with source:
        report.version = source.version
        report.episodes, report.frames = len(source.episodes), source.num_frames
        rows: Counter[str] = Counter()
        videos: set[str] = set()
        for entry in source.episodes:
            rows[entry.data_file] += entry.length
            videos.update(rel for rel, _ in entry.videos.values())
        checks = [(rel, lambda p, n=n: _check_data_file(p, n)) for rel, n in rows.items()]
        checks += [(rel, _check_video) for rel in sorted(videos)]
        for rel, check in checks:
            try:
                problem = check(source._path(rel))
            except LeRobotFormatError as exc:  # a path that leaves the folder
                problem = str(exc)
            if problem is not None:
                report.problems.append(problem)
        report.data_files, report.videos = len(rows), len(videos)
    return report
