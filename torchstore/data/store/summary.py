"""A store's summary as rows of text: what ``torchstore info`` prints.

:func:`format_summary` also prints the summary of a LeRobot folder, which has the same keys.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchstore.data.file.manifest import FORMAT_NAME
from torchstore.io.frames.codec_types import FrameCodec

if TYPE_CHECKING:
    from torchstore.data.store.facts import StoreFacts
    from torchstore.data.store.store import TrajectoryStore

__all__ = ["summarize", "format_summary", "format_size", "length_stats"]


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


#: ``1.5 MiB`` style sizes (what ``info`` and ``verify`` print).
format_size = _size


def length_stats(lengths: Sequence[int]) -> dict | None:
    """``{"min", "median", "max"}`` of episode lengths, or None when there are none.

    The median of an even count is the mean of the middle two (20 and 30 give 25).
    """
    values = [int(n) for n in lengths]
    if not values:
        return None
    return {"min": min(values), "median": float(statistics.median(values)), "max": max(values)}


def summarize(store: TrajectoryStore | StoreFacts) -> dict:
    """The facts ``torchstore info`` shows, as a JSON-friendly dict.

    ``store``: an open store (or store set), or a file's
    :class:`~torchstore.data.store.facts.StoreFacts` (read without torch). Either way the
    columns are the manifest's own dicts. ``episode_length`` is None for a store with no
    episodes.
    """
    from torchstore.data.store.facts import StoreFacts

    if isinstance(store, StoreFacts):
        fields, lengths = store.manifest, store.episode_lengths
        rows, episodes = store.num_rows, store.num_episodes
    else:
        m = store.manifest
        fields, lengths = json.loads(m.to_json()), store.episodes.lengths
        rows, episodes = m.num_rows, m.num_episodes
    return {
        "path": str(store.path),
        "format": f"{FORMAT_NAME} v{fields['format_version']} "
        f"(torchstore {fields['torchstore_version']})",
        "created": fields["created"],
        "env_id": fields["env_id"],
        "seed": fields["seed"],
        "rows": rows,
        "episodes": episodes,
        "episode_length": length_stats(lengths.tolist()),
        "size_on_disk": store.size_on_disk(),
        "columns": [
            {
                "name": c["name"],
                "dtype": c["dtype"],
                "shape": list(c.get("shape", [])),
                "quantize": c.get("quantize"),
                **({"codec": c["codec"]} if c.get("codec") is not None else {}),
            }
            for c in fields["columns"]
        ],
        "metadata": fields["metadata"],
        "verified": False,
        **({"shards": [str(s.path) for s in store.shards]} if hasattr(store, "shards") else {}),
    }


def _lerobot_video(video: dict) -> str:
    """``av1 gop 2 crf 30 (MP4)``: a LeRobot camera's encoding, as far as info.json says."""
    parts = [str(video.get("codec", "video"))]
    parts += [f"{name} {video[name]}" for name in ("gop", "crf") if video.get(name) is not None]
    if "gop" not in video:
        parts.append("gop not recorded")
    return " ".join(parts) + " (MP4)"


def _stored_as(column: dict) -> str:
    """How a column's values are kept: as they are, quantised, or through a frame codec
    (a LeRobot camera: its MP4 video or the PNG files in its Parquet files)."""
    if column.get("codec"):
        return FrameCodec.from_json(column["codec"]).describe()
    if column.get("video") is not None:
        return _lerobot_video(column["video"])
    if column.get("image"):
        return f"{column['image']} (in Parquet)"
    if column.get("quantize"):
        q = column["quantize"]
        return f"uint8 [{q['low']:g}, {q['high']:g}]"
    return "-"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def format_summary(info: dict) -> str:
    """A readable table of :func:`summarize`'s dict."""
    ep = info["episode_length"]
    lengths = (
        "no episodes"
        if ep is None
        else f"length min {ep['min']}, median {ep['median']:g}, max {ep['max']}"
    )
    created = f", created {info['created']}" if info.get("created") else ""
    lines = [
        f"{'store' if info['format'].startswith('torchstore') else 'dataset':<11}{info['path']}",
        f"format     {info['format']}{created}",
        *(
            [f"robot type {_or_dash(info['robot_type'])}"]
            if "robot_type" in info
            else [f"env id     {_or_dash(info['env_id'])}"]
        ),
        *([] if "robot_type" in info else [f"seed       {_or_dash(info['seed'])}"]),
        f"rows       {info['rows']:,}",
        f"episodes   {info['episodes']:,}  ({lengths})",
        f"on disk    {_size(info['size_on_disk'])}",
    ]
    if info.get("shards"):
        lines.append(f"shards     {len(info['shards'])} (one writer each)")
    if info.get("verified") is False:
        # opening checks the manifest, commit record and episode index; column bytes are
        # checked only when read, so a summary says nothing about their health
        lines.append(
            "checksums  not verified (data is checked when read; run: torchstore verify "
            f"{info['path']})"
        )
    lines.append("")
    header = ("column", "dtype", "shape", "stored as")
    rows = [
        (
            c["name"],
            c["dtype"],
            "x".join(str(s) for s in c["shape"]) or "scalar",
            _stored_as(c),
        )
        for c in info["columns"]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    if info["metadata"]:
        lines += ["", "metadata"]
        for key, value in info["metadata"].items():
            text = json.dumps(value)
            if len(text) > 100:
                text = text[:97] + "..."
            lines.append(f"  {key}: {text}")
    return "\n".join(lines)
