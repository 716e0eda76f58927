"""Corrupted and truncated files: reported as errors, never returned as data, never a hang.

Each damaged copy is opened and read completely in a forked child with a deadline.
The only acceptable outcomes are a torchstore error (naming what is damaged) or, when
the damaged byte was unused space, data identical to what was written.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch

from tests.conftest import make_rows
from tests.forked import run_forked
from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError, TorchstoreError

COLUMNS = (
    ColumnSpec("obs", torch.float32, (26,)),
    ColumnSpec("action", torch.float32, (7,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("pix", torch.float32, (8,), quantize=Quantize(-1, 1)),
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("integrity") / "good.h5"
    episodes = [make_rows(COLUMNS, n, i) for i, n in enumerate([3000, 17000, 5000, 9000])]
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i, rows in enumerate(episodes):
            w.add_episode(rows, metadata={"i": i})
    with TrajectoryStore(path) as store:
        reference = {c.name: store.read_column(c.name, 0, store.num_rows) for c in COLUMNS}
    return path, reference


def _read_all(path: str, reference: dict) -> None:
    """Exit normally only if the file reads back exactly; a TorchstoreError exits 3."""
    try:
        with TrajectoryStore(path) as store:
            assert store.num_rows == 34000 and store.num_episodes == 4
            for name, ref in reference.items():
                got = np.concatenate([s.numpy() for s in (
                    torch.from_numpy(store.read_column(name, a, min(a + 7000, 34000))) for a in range(0, 34000, 7000)
                )])
                assert np.array_equal(got, ref), f"silent wrong data in column {name}"
            for i in range(4):
                assert store.episode_metadata(i) == {"i": i}
    except TorchstoreError as exc:
        print(type(exc).__name__, exc)
        os._exit(3)


def _outcome(status: str, text: str) -> str:
    if status == "ok":
        return "no effect"
    if status == "error" and not text:  # os._exit(3) path: a clean torchstore error
        return "reported"
    return f"{status}: {text}"


@pytest.mark.slow
def test_flipped_bytes_are_reported_or_harmless(pristine, tmp_path):
    path, reference = pristine
    size = os.path.getsize(path)
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    for trial in range(120):
        bad = tmp_path / f"flip{trial}.h5"
        shutil.copyfile(path, bad)
        offset = rng.randrange(size)
        with open(bad, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        result = _outcome(*run_forked(_read_all, str(bad), reference, timeout=30))
        assert result in ("no effect", "reported"), f"flip at byte {offset} of {size}: {result}"
        outcomes[result] = outcomes.get(result, 0) + 1
        bad.unlink()
    assert outcomes.get("reported", 0) > 60  # most of the file is committed data


@pytest.mark.slow
def test_truncated_files_are_reported_or_harmless(pristine, tmp_path):
    path, reference = pristine
    size = os.path.getsize(path)
    rng = random.Random(11)
    reported = 0
    for trial in range(30):
        bad = tmp_path / f"cut{trial}.h5"
        shutil.copyfile(path, bad)
        cut = rng.randrange(size) if trial else 0
        os.truncate(bad, cut)
        result = _outcome(*run_forked(_read_all, str(bad), reference, timeout=30))
        # cutting only unused space at the end of the file (page padding) is harmless
        assert result in ("no effect", "reported"), f"truncated to {cut} of {size} bytes: {result}"
        reported += result == "reported"
        bad.unlink()
    assert reported >= 25


def test_a_flipped_data_byte_names_the_column_and_rows(pristine, tmp_path):
    path, _ = pristine
    bad = tmp_path / "one.h5"
    shutil.copyfile(path, bad)
    with TrajectoryStore(bad) as store:
        ds = store._ds.columns["obs"].data
        offset = ds.id.get_chunk_info(3).byte_offset  # the fourth chunk of 'obs'
        rows = ds.chunks[0]
    with open(bad, "r+b") as f:
        f.seek(offset + 100)
        b = f.read(1)[0]
        f.seek(offset + 100)
        f.write(bytes([b ^ 0x10]))
    with TrajectoryStore(bad) as store:
        with pytest.raises(IntegrityError, match=rf"column 'obs' rows {3 * rows}\.\.{4 * rows - 1} fail their checksum"):
            store.read_slab(0, store.num_rows)
        # other columns and other rows of the same column are still readable
        assert store.read_slab(0, 3 * rows, columns=["obs"])["obs"].shape[0] == 3 * rows
        store.read_slab(0, store.num_rows, columns=["action", "reward"])
