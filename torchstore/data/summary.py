"""A store's summary as rows of text: what ``torchstore info`` prints."""

from __future__ import annotations

import json

import torch

from torchstore.data.store import TrajectoryStore

__all__ = ["summarize", "format_summary"]


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def summarize(store: TrajectoryStore) -> dict:
    """The facts ``torchstore info`` shows, as a JSON-friendly dict."""
    m = store.manifest
    lengths = store.episodes.lengths.to(torch.float64)
    stats = (
        {"min": int(lengths.min()), "median": float(lengths.median()), "max": int(lengths.max())}
        if len(lengths)
        else {"min": 0, "median": 0, "max": 0}
    )
    return {
        "path": str(store.path),
        "format": f"{m.format} v{m.format_version} (torchstore {m.torchstore_version})",
        "created": m.created,
        "env_id": m.env_id,
        "seed": m.seed,
        "rows": m.num_rows,
        "episodes": m.num_episodes,
        "episode_length": stats,
        "size_on_disk": store.size_on_disk(),
        "columns": [
            {"name": c.name, "dtype": str(c.dtype).removeprefix("torch."), "shape": list(c.shape),
             "quantize": None if c.quantize is None else c.quantize.to_dict()}
            for c in m.columns
        ],
        "metadata": m.metadata,
    }


def format_summary(info: dict) -> str:
    """A readable table of :func:`summarize`'s dict."""
    ep = info["episode_length"]
    lines = [
        f"store      {info['path']}",
        f"format     {info['format']}, created {info['created']}",
        f"env id     {info['env_id'] or '-'}",
        f"seed       {info['seed'] if info['seed'] is not None else '-'}",
        f"rows       {info['rows']:,}",
        f"episodes   {info['episodes']:,}  (length min {ep['min']}, median {ep['median']:g}, max {ep['max']})",
        f"on disk    {_size(info['size_on_disk'])}",
        "",
    ]
    header = ("column", "dtype", "shape", "quantisation")
    rows = [
        (
            c["name"],
            c["dtype"],
            "x".join(str(s) for s in c["shape"]) or "scalar",
            "-" if c["quantize"] is None else f"uint8 [{c['quantize']['low']:g}, {c['quantize']['high']:g}]",
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
