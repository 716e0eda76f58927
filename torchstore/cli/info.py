"""What ``torchstore info PATH`` prints: a store, a LeRobot or a Minari dataset folder.

Folders are read, never written: ``info`` on a LeRobot or Minari dataset summarises it
with the same keys as a store's summary, without importing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchstore.errors import StoreFormatError

__all__ = ["print_info", "summarize_path", "summarize_lerobot", "summarize_minari"]


def _minari_data(path: Path) -> Path | None:
    """The ``data`` folder of a Minari dataset at ``path`` (the dataset or its data folder).

    Minari (0.4-0.5) keeps ``<dataset_id>/data/metadata.json`` next to either one
    ``main_data.hdf5`` (a group ``episode_<id>`` per episode, with a ``total_steps``
    attribute) or one folder per episode id holding Arrow files and a ``metadata.json``
    with ``total_steps``.
    """
    for data in (path / "data", path):
        if (data / "metadata.json").is_file() and (
            (data / "main_data.hdf5").is_file() or (data / "0" / "metadata.json").is_file()
        ):
            return data
    return None


def _json_inside_json(value: object) -> object:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def summarize_minari(data: Path) -> dict:
    """A Minari dataset's facts with the keys of a store's summary (read-only, no minari)."""
    from torchstore.data.store.summary import length_stats

    meta = json.loads((data / "metadata.json").read_text())
    if not isinstance(meta, dict):
        raise StoreFormatError(f"{data / 'metadata.json'} must hold a JSON object")
    columns: list[dict] = []
    if (data / "main_data.hdf5").is_file():
        import h5py

        with h5py.File(data / "main_data.hdf5", "r") as f:
            groups = sorted(
                (k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_")[1])
            )
            lengths = [int(f[k].attrs["total_steps"]) for k in groups]
            if groups:
                f[groups[0]].visititems(
                    lambda name, obj: (
                        columns.append(
                            {
                                "name": name,
                                "dtype": str(obj.dtype),
                                "shape": list(obj.shape[1:]),
                                "quantize": None,
                            }
                        )
                        if isinstance(obj, h5py.Dataset)
                        else None
                    )
                )
    else:
        episodes = sorted(
            (p for p in data.iterdir() if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        lengths = [
            int(json.loads((p / "metadata.json").read_text())["total_steps"]) for p in episodes
        ]
    env = _json_inside_json(meta.get("env_spec"))
    return {
        "path": str(data.parent if data.name == "data" else data),
        "format": f"Minari dataset ({meta.get('data_format', '?')}, minari "
        f"{meta.get('minari_version', '?')}; a folder, not a store)",
        "created": None,
        "env_id": env.get("id") if isinstance(env, dict) else None,
        "seed": None,
        "rows": int(sum(lengths)),
        "episodes": len(lengths),
        "episode_length": length_stats(lengths),
        "size_on_disk": _folder_size(data),
        "columns": columns,
        "metadata": {
            k: _json_inside_json(meta[k])
            for k in (
                "dataset_id",
                "observation_space",
                "action_space",
                "algorithm_name",
                "description",
            )
            if meta.get(k) is not None
        },
    }


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
    from torchstore.data.store.summary import length_stats
    from torchstore.lerobot import LeRobotSource

    root = Path(root)
    with LeRobotSource(root) as source:
        lengths = [e.length for e in source.episodes]
        return {
            "path": str(root),
            "format": f"LeRobot dataset {source.version} (a folder; `torchstore import` reads it)",
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
        data = _minari_data(path)
        if data is not None:
            try:
                return summarize_minari(data)
            except (KeyError, ValueError, TypeError, OSError) as exc:
                raise StoreFormatError(f"{path} looks like a Minari dataset but {exc!r}") from None
        from torchstore.data.store.store_set import StoreSet, find_shards

        if find_shards(path):
            from torchstore.data.store.summary import summarize

            with StoreSet(path) as shards:
                return summarize(shards)
        raise StoreFormatError(
            f"{path} is a folder but not a LeRobot dataset (no meta/info.json), not a Minari "
            "dataset (no data/metadata.json) and not a store file"
        )
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.data.store.summary import summarize

    with TrajectoryStore(path) as store:
        return summarize(store)


def print_info(path: str | os.PathLike, *, as_json: bool = False) -> None:
    """Print the summary of ``path`` as a table, or as JSON."""
    from torchstore.data.store.summary import format_summary

    info = summarize_path(path)
    print(json.dumps(info, indent=2) if as_json else format_summary(info))
