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


#: info.json's keys of a camera's encoding (lerobot >= 0.6 records the encoder's settings;
#: earlier releases only what the stream says), as the summary names them
_VIDEO_KEYS = {"video.codec": "codec", "video.g": "gop", "video.crf": "crf"}


def _lerobot_column(feature) -> dict:
    """A LeRobot feature as a column of the summary: a camera says how its frames are kept
    (``video``: the codec and GOP info.json records; ``image``: PNG in the Parquet files)."""
    column = {
        "name": feature.name,
        "dtype": feature.dtype,
        "shape": list(feature.shape),
        "quantize": None,
    }
    if feature.dtype == "video":
        info = feature.info or feature.extra.get("video_info") or {}  # v2.0: video_info
        column["video"] = {name: info[key] for key, name in _VIDEO_KEYS.items() if key in info}
    elif feature.dtype == "image":
        column["image"] = "png"
    return column


def summarize_lerobot(root: str | os.PathLike) -> dict:
    """A LeRobot v3.0/v2.1 folder's facts with the keys of a store's summary (read-only),
    and its ``robot_type`` (a LeRobot dataset records the robot, not an env)."""
    from torchstore.data.store.summary import length_stats
    from torchstore.lerobot import LeRobotSource

    root = Path(root)
    with LeRobotSource(root) as source:
        lengths = [e.length for e in source.episodes]
        return {
            "path": str(root),
            "format": f"LeRobot dataset {source.version} (a folder; `torchstore import` reads it)",
            "created": None,
            "env_id": None,
            "robot_type": source.info.get("robot_type"),
            "seed": None,
            "rows": int(sum(lengths)),
            "episodes": len(lengths),
            "episode_length": length_stats(lengths),
            "size_on_disk": _folder_size(root),
            "columns": [_lerobot_column(f) for f in source.features.values()],
            "metadata": {
                "fps": source.fps,
                "tasks": len(source.tasks),
                "rejected_episodes": len(source.rejected),
            },
        }


def summarize_path(path: str | os.PathLike) -> dict:
    """The summary of a store file (or its URL) or a LeRobot folder at ``path``."""
    from torchstore.io.remote.ranged import is_url

    path = path if is_url(path) else Path(path)
    if isinstance(path, Path) and path.is_dir():
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
        from torchstore.io.dataset_folders import not_a_store

        raise StoreFormatError(
            not_a_store(path)
            or f"{path} is a folder but not a LeRobot dataset (no meta/info.json), not a "
            "Minari dataset (no data/metadata.json) and holds no store shards (*.h5, *.hdf5)"
        )
    from torchstore.data.store.facts import StoreFacts  # (no torch: h5py, numpy, xxhash)
    from torchstore.data.store.summary import summarize

    with StoreFacts(path) as store:
        return summarize(store)


def print_info(path: str | os.PathLike, *, as_json: bool = False) -> None:
    """Print the summary of ``path`` as a table, or as JSON."""
    from torchstore.data.store.summary import format_summary

    info = summarize_path(path)
    print(json.dumps(info, indent=2) if as_json else format_summary(info))
