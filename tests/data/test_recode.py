"""A store recoded: camera columns encoded (or raw again), everything else kept exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchstore.cli import main
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.quantize import Quantize
from torchstore.data.store.recode import camera_columns, recode_store
from torchstore.errors import ColumnError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._camera_frames import camera_frames  # noqa: E402

COLUMNS = [
    ColumnSpec("obs/cam", torch.uint8, (48, 64, 3)),
    ColumnSpec("obs/depth", torch.uint8, (48, 64, 1)),
    ColumnSpec("obs/pos", torch.float32, (2,), quantize=Quantize(-1.0, 1.0)),
    ColumnSpec("action", torch.float32, (2,)),
]


@pytest.fixture
def raw_store(tmp_path) -> Path:
    path = tmp_path / "raw.h5"
    with TrajectoryStoreWriter(path, COLUMNS, env_id="Cam-v0", seed=4, metadata={"a": 1}) as w:
        for i, n in enumerate((30, 45)):
            rng = np.random.default_rng(i)
            w.add_episode(
                {
                    "obs/cam": camera_frames(n, 48, 64, episode=i),
                    "obs/depth": camera_frames(n, 48, 64, episode=i)[..., :1],
                    "obs/pos": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
                    "action": rng.normal(size=(n, 2)).astype(np.float32),
                },
                {"episode": i},
            )
    return path


def test_recode_encodes_the_cameras_and_keeps_everything_else(raw_store, tmp_path):
    assert camera_columns(COLUMNS) == ["obs/cam"]
    out = recode_store(raw_store, tmp_path / "enc.h5", {"obs/cam": "png"}, progress=False)
    with TrajectoryStore(raw_store) as a, TrajectoryStore(out) as b:
        assert b.column("obs/cam").codec.kind == "png" and b.column("obs/depth").codec is None
        assert (b.manifest.env_id, b.manifest.seed, b.manifest.metadata) == ("Cam-v0", 4, {"a": 1})
        assert b.manifest.created == a.manifest.created
        assert torch.equal(a.episodes.lengths, b.episodes.lengths)
        assert [b.episode_metadata(i) for i in range(2)] == [{"episode": 0}, {"episode": 1}]
        left, right = a.read_slab(0, a.num_rows, raw=True), b.read_slab(0, b.num_rows, raw=True)
        for key in left.keys(include_nested=True, leaves_only=True):
            assert torch.equal(left[key], right[key]), key  # PNG is exact; codes kept as codes
    back = recode_store(out, tmp_path / "back.h5", {"obs/cam": None}, progress=False)
    with TrajectoryStore(back) as c:
        assert c.column("obs/cam").codec is None and c.manifest.format_version == 2


def test_recode_refuses_what_it_cannot_keep_before_writing(raw_store, tmp_path):
    with pytest.raises(ColumnError, match="no column 'obs/nope'"):
        recode_store(raw_store, tmp_path / "x.h5", {"obs/nope": "av1"}, progress=False)
    with pytest.raises(ColumnError, match="cannot have 1 channels"):
        recode_store(raw_store, tmp_path / "x.h5", {"obs/depth": "av1"}, progress=False)
    with pytest.raises(ColumnError, match="must be uint8"):
        recode_store(raw_store, tmp_path / "x.h5", {"action": "png"}, progress=False)
    assert not (tmp_path / "x.h5").exists()


def test_the_encode_command(raw_store, tmp_path, capsys):
    dest = tmp_path / "enc.h5"
    assert main(["encode", str(raw_store), str(dest), "--gop", "8", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {dest}: obs/cam as uint8[48, 64, 3] as av1 crf 30 gop 8 (lossy)")
    with TrajectoryStore(dest) as store:
        assert store.column("obs/cam").codec.gop == 8
    assert (
        main(["encode", str(raw_store), str(tmp_path / "p.h5"), "--codec", "png", "--crf", "3"])
        == 1
    )
    assert "png frames take no crf setting" in capsys.readouterr().err
    assert not (tmp_path / "p.h5").exists()
    assert main(["encode", str(raw_store), str(dest), "--no-progress"]) == 1
    assert "exists" in capsys.readouterr().err
