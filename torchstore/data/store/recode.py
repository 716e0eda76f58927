"""A store copied with its camera columns stored another way: encoded, re-encoded or raw.

Importers keep what their source holds (robomimic and zarr images raw, since their sources
keep them raw or gzipped); :func:`recode_store` turns such a store into one whose camera
columns are AV1 / H.264 / JPEG / PNG (or back to raw), episode by episode, so memory stays
at one episode's frames. Everything else is copied as it is: the other columns' bytes
(quantised ones as their codes), the episode boundaries and metadata, the manifest's env
id, seed, creation time and user metadata.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.errors import ColumnError

__all__ = ["recode_store", "camera_columns"]


def camera_columns(columns: tuple[ColumnSpec, ...] | list[ColumnSpec]) -> list[str]:
    """The names of the columns that hold camera frames: ``uint8 [H, W, 3]``."""
    return [
        c.name
        for c in columns
        if c.dtype == torch.uint8 and c.quantize is None and len(c.shape) == 3 and c.shape[2] == 3
    ]


def recode_store(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    codecs: Mapping[str, Any],
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Copy the store ``source`` to ``dest`` with the columns named in ``codecs`` kept as
    each asks (``{"obs/agentview_image": "av1"}``: a kind name, a ``FrameCodec`` or None /
    ``"raw"`` for raw frames). Returns ``dest``.

    Every named column must be ``uint8 [H, W, C]``; a frame codec it cannot keep (AV1 with
    4 channels) is refused before anything is written. Reads and writes one episode at a
    time. Lossy codecs change the pixels (docs/cameras.md has what each costs); the other
    columns and the episodes are kept exactly.
    """
    from torchstore.data.store.store import TrajectoryStore
    from torchstore.io.progress import progress_bar

    dest = Path(dest)
    with TrajectoryStore(source) as store:
        names = {c.name for c in store.columns}
        unknown = sorted(set(codecs) - names)
        if unknown:
            raise ColumnError(
                f"{source} has no column {unknown[0]!r} to recode; its columns are {sorted(names)}"
            )
        specs = [
            ColumnSpec(c.name, c.dtype, c.shape, c.quantize, codec=codecs[c.name])
            if c.name in codecs
            else c
            for c in store.columns
        ]
        m = store.manifest
        bar = progress_bar(
            enabled=progress, total=store.num_rows, unit="row", desc=f"encode {Path(source).name}"
        )
        try:
            with TrajectoryStoreWriter(
                dest,
                specs,
                env_id=m.env_id,
                seed=m.seed,
                metadata=m.metadata,
                overwrite=overwrite,
                created=m.created or None,
                expected_rows=store.num_rows,
            ) as writer:
                for i in range(store.num_episodes):
                    rows = store.episode(i, raw=True)
                    writer.add_episode(rows, store.episode_metadata(i) or None, raw=True)
                    if bar is not None:
                        bar.update(len(rows))
        finally:
            if bar is not None:
                bar.close()
    return dest
