"""``import_lerobot``: a LeRobot dataset (folder or Hub repo) into a trajectory store.

One store episode per LeRobot episode, in order, lengths preserved. Every feature becomes a
column (see :mod:`torchstore.lerobot.features`); video frames are decoded frame-accurately
by timestamp, file by file, one episode in memory at a time. The store is written under a
temporary name beside ``dest`` and renamed into place only when complete, so a failed
import leaves nothing half-written at ``dest``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.source import LeRobotSource, select_features

__all__ = ["import_lerobot", "ImportSummary", "locate_dataset"]

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import wrote."""

    path: Path
    source: str
    episodes: int
    frames: int
    skipped_rejected: tuple[int, ...]
    seconds: float

    def __str__(self) -> str:
        skipped = f", skipped {len(self.skipped_rejected)} rejected" if self.skipped_rejected else ""
        rate = self.frames / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"imported {self.episodes} episodes, {self.frames} frames from {self.source} to "
            f"{self.path}{skipped} in {self.seconds:.1f} s ({rate:,.0f} frames/s)"
        )


def locate_dataset(source: str | os.PathLike, *, revision: str | None = None, progress: bool = True) -> Path:
    """A local folder as is; a Hub repo id (``"user/name"``) downloaded into the Hub cache."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise LeRobotFormatError(f"{path} is a file; a LeRobot dataset is a folder")
        return path
    text = str(source)
    if _REPO_ID.fullmatch(text):
        from torchstore.lerobot.hub import download_lerobot

        return download_lerobot(text, revision=revision, progress=progress)
    raise FileNotFoundError(f"{source} is neither a local folder nor a Hub repo id like 'user/name'")


def _selected(source: LeRobotSource, episodes: Iterable[int] | None, include_rejected: bool):
    available = {e.index: e for e in source.episodes}
    if episodes is None:
        wanted = list(available)
    else:
        wanted = sorted(set(int(i) for i in episodes))
        missing = [i for i in wanted if i not in available]
        if missing:
            raise LeRobotFormatError(f"{source.root} has episodes 0..{len(available) - 1}; no {missing}")
    skipped = tuple(i for i in wanted if i in source.rejected and not include_rejected)
    return [available[i] for i in wanted if i not in skipped], skipped


def import_lerobot(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    episodes: Iterable[int] | None = None,
    columns: Iterable[str] | None = None,
    revision: str | None = None,
    include_rejected: bool = False,
    overwrite: bool = False,
    tolerance_s: float | None = None,
    progress: bool = True,
) -> ImportSummary:
    """Import a LeRobot v3.0 (or v2.1) dataset into a new trajectory store at ``dest``.

    Args:
        source: a local dataset folder, or a Hub repo id (downloaded with huggingface_hub
            into its cache; ``HF_HUB_OFFLINE=1`` answers from the cache only).
        dest: the store file to write.
        episodes: LeRobot episode indices to import (default: all).
        columns: feature names to import (default: all but annotation ``language`` ones).
        revision: Hub revision (default: the ``v3.0`` tag, resolved like LeRobot does).
        include_rejected: keep episodes listed in ``meta/rejected_episodes.json``.
        overwrite: replace an existing ``dest``.
        tolerance_s: allowed distance between a video frame's timestamp and where the
            episode table says it is (default: a quarter of a frame period).
        progress: show a progress bar over frames.
    """
    from torchstore.data.writer import TrajectoryStoreWriter

    started = time.perf_counter()
    dest = Path(dest)
    if dest.exists() and not overwrite:
        raise FileExistsError(f"{dest} exists; pass overwrite=True to replace it")
    root = locate_dataset(source, revision=revision, progress=progress)
    with LeRobotSource(root) as src:
        names = select_features(src, None if columns is None else list(columns))
        chosen, skipped = _selected(src, episodes, include_rejected)
        if skipped:
            log.warning("skipping %d rejected episodes of %s: %s", len(skipped), root, list(skipped))
        if not chosen:
            raise LeRobotFormatError(f"{root}: no episodes left to import ({len(skipped)} rejected, skipped)")
        strings = {n: _scan_strings(src, n) for n in names if src.features[n].dtype == "string"}
        for name, table in strings.items():
            src._string_tables[name] = {s: i for i, s in enumerate(table)}
        specs = [src.features[n].column_spec() for n in names]
        metadata = {
            "lerobot": {
                "source": str(source),
                "codebase_version": src.version,
                "fps": src.fps,
                "robot_type": src.info.get("robot_type"),
                "features": {n: src.features[n].to_json() for n in names},
                "tasks": src.tasks,
                "string_tables": strings,
                "stats": src.stats,
                "info": src.info,
                "rejected": {str(i): r.reason for i, r in src.rejected.items()},
            }
        }
        partial = dest.with_name(f".{dest.name}.importing")
        partial.unlink(missing_ok=True)
        frames = 0
        bar = _bar(sum(e.length for e in chosen), progress, f"import {root.name}")
        try:
            with TrajectoryStoreWriter(partial, specs, metadata=metadata, overwrite=True) as writer:
                for entry in chosen:
                    rows = src.read_episode(entry, names, tolerance_s=tolerance_s)
                    meta = {"lerobot_episode_index": entry.index, "tasks": list(entry.tasks)}
                    if entry.index in src.rejected:
                        meta["rejected"] = src.rejected[entry.index].reason
                    writer.add_episode(rows, metadata=meta)
                    frames += entry.length
                    if bar is not None:
                        bar.update(entry.length)
            os.replace(partial, dest)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
    return ImportSummary(dest, str(source), len(chosen), frames, skipped, time.perf_counter() - started)


def _scan_strings(src: LeRobotSource, name: str) -> list[str]:
    """Every distinct value of a string feature, in order of first appearance."""
    from torchstore.io.parquet import read_table

    seen: dict[str, None] = {}
    for rel in dict.fromkeys(e.data_file for e in src.episodes):
        table = read_table(src.root / rel, columns=[name], what=str(src.root / rel))
        seen.update(dict.fromkeys(v for v in table.column(name).to_pylist() if v is not None))
    return list(seen)


def _bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from torchstore.io.progress import progress_bar

    return progress_bar(total=total, unit="frame", desc=desc, leave=False)
