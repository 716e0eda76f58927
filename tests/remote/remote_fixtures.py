"""Local folders to push: a small dataset (a torchstore store plus plain files)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import torch

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter

COLUMNS = (ColumnSpec("obs", torch.float32, (4,)), ColumnSpec("action", torch.float32, (2,)))


def episode(i: int, n: int = 50) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {
        "obs": rng.standard_normal((n, 4), dtype=np.float32),
        "action": rng.standard_normal((n, 2), dtype=np.float32),
    }


def make_dataset(root: Path, episodes: int = 3, blob_bytes: int = 200_000) -> Path:
    """``root`` with ``store.h5`` (closed), ``meta/info.json`` and ``data/chunk-000/blob.bin``."""
    (root / "meta").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    with TrajectoryStoreWriter(root / "store.h5", COLUMNS, env_id="test-env") as w:
        for i in range(episodes):
            w.add_episode(episode(i), metadata={"i": i})
    (root / "meta" / "info.json").write_text(json.dumps({"episodes": episodes}))
    (root / "data" / "chunk-000" / "blob.bin").write_bytes(
        np.random.default_rng(7).bytes(blob_bytes)
    )
    return root


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root`` (hidden ones left out) by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                path = Path(dirpath) / name
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def assert_store_matches(path: Path, episodes: int) -> None:
    with TrajectoryStore(path) as store:
        assert store.num_episodes == episodes
        for i in range(episodes):
            got = store.episode(i)
            for name, value in episode(i).items():
                assert np.array_equal(got[name].numpy(), value)
            assert store.episode_metadata(i) == {"i": i}


def mp4_box(kind: bytes, payload: bytes = b"", size: int | None = None) -> bytes:
    """One MP4 box (size 0 means: runs to the end of the file)."""
    return struct.pack(">I", 8 + len(payload) if size is None else size) + kind + payload


def parquet_bytes(payload: bytes = b"rows") -> bytes:
    """A file shaped like Parquet: PAR1, payload, footer, footer length, PAR1."""
    footer = b"footer"
    return b"PAR1" + payload + footer + struct.pack("<I", len(footer)) + b"PAR1"


def mp4_bytes() -> bytes:
    """A finalised MP4 shape: ftyp, mdat, moov."""
    return (
        mp4_box(b"ftyp", b"isom\0\0\0\0")
        + mp4_box(b"mdat", b"\0" * 64)
        + mp4_box(b"moov", b"\0" * 16)
    )
