"""What ``torchstore info PATH`` prints: a store, or a LeRobot dataset folder (read-only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchstore.errors import StoreFormatError

__all__ = ["print_info", "summarize_path", "summarize_lerobot"]


def _is_minari(path: Path) -> bool:
    # Minari keeps one dataset per folder: data/main_data.hdf5 (or .arrow files) and
    # data/metadata.json.
    return (path / "data" / "metadata.json").is_file()


def _folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def summarize_lerobot(root: str | os.PathLike) -> dict:
    """A LeRobot v3.0/v2.1 folder's facts with the keys of a store's summary (read-only)."""
    from torchstore.data.summary import length_stats
    from torchstore.lerobot import LeRobotSource

    root = Path(root)
    with LeRobotSource(root) as source:
        lengths = [e.length for e in source.episodes]
        return {
            "path": str(root),
            "format": f"LeRobot dataset {source.version} (a folder; import-lerobot makes a store)",
            "created": None,
            "env_id": source.info.get("robot_type"),
            "seed": None,
            "rows": int(sum(lengths)),
            "episodes": len(lengths),
            "episode_length": length_stats(lengths),
            "size_on_disk": _folder_size(root),
            "columns": [
                {"name": f.name, "dtype": f.dtype, "shape": list(f.shape), "quantize": None}
                for f in source.features.values()
            ],
            "metadata": {
                "fps": source.fps,
                "tasks": len(source.tasks),
                "rejected_episodes": len(source.rejected),
            },
        }


def summarize_path(path: str | os.PathLike) -> dict:
    """The summary of a store file or a LeRobot folder at ``path``."""
    path = Path(path)
    if path.is_dir():
        if (path / "meta" / "info.json").is_file():
            return summarize_lerobot(path)
        if _is_minari(path):
            raise StoreFormatError(
                f"{path} is a Minari dataset folder; Minari folders are not supported by info yet"
            )
        raise StoreFormatError(
            f"{path} is a folder but not a LeRobot dataset (no meta/info.json) and not a store file"
        )
    from torchstore.data.store import TrajectoryStore
    from torchstore.data.summary import summarize

    with TrajectoryStore(path) as store:
        return summarize(store)


def print_info(path: str | os.PathLike, *, as_json: bool = False) -> None:
    """Print the summary of ``path`` as a table, or as JSON."""
    from torchstore.data.summary import format_summary

    info = summarize_path(path)
    print(json.dumps(info, indent=2) if as_json else format_summary(info))
