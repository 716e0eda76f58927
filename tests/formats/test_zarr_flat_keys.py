"""``export_zarr`` writes flat ``data/<key>`` arrays, as diffusion-policy's loader reads them.

diffusion_policy is not installed here; :func:`_load_like_replay_buffer` does what its
``ReplayBuffer.copy_from_path`` does with the numpy backend (``copy_from_store`` with
``store=None``): open the root group, load ``root['meta'][key]`` for every key (a scalar
with ``np.array``, else ``[:]``) and ``root['data'][key][:]`` for every key. A group under
``data/`` (a nested column written as ``data/next/obs``) fails there, with ``KeyError:
slice(None, None, None)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr.storage import LocalStore, ZipStore

from tests.formats.robomimic_files import write_robomimic
from torchstore import TrajectoryStore
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.errors import DatasetFormatError
from torchstore.formats import import_robomimic
from torchstore.formats.zarr_export import export_zarr, flat_keys
from torchstore.formats.zarr_import import import_zarr

ZARR2 = Path(os.environ.get("ZARR2_PYTHON", "/tmp/zarr2/bin/python"))
#: diffusion-policy's ReplayBuffer.copy_from_path with the numpy backend, in zarr 2
#: (copy_from_store with store=None; a .zarr.zip opened as its ZipStore)
COPY_FROM_PATH = """
import json, sys
import numpy as np
import zarr
path = sys.argv[1]
if path.endswith(".zip"):
    src_store = zarr.ZipStore(path, mode="r")
else:
    src_store = zarr.open(path, "r").store
src_root = zarr.group(src_store)
meta = dict()
for key, value in src_root["meta"].items():
    if len(value.shape) == 0:
        meta[key] = np.array(value)
    else:
        meta[key] = value[:]
keys = src_root["data"].keys()
data = dict()
for key in keys:
    arr = src_root["data"][key]
    data[key] = arr[:]
print(json.dumps({"ends": meta["episode_ends"].tolist(),
                  "data": {k: [v.dtype.str, list(v.shape)] for k, v in data.items()}}))
"""


def _load_like_replay_buffer(path: Path) -> tuple[dict, dict]:
    """(meta, data) as diffusion-policy's ReplayBuffer.copy_from_path loads them."""
    store = ZipStore(path, mode="r") if zipfile.is_zipfile(path) else LocalStore(path)
    try:
        root = zarr.open_group(store=store, mode="r")
        meta = {}
        for key, value in root["meta"].members():
            meta[key] = np.array(value) if len(value.shape) == 0 else value[:]
        data = {key: root["data"][key][:] for key in root["data"].keys()}
    finally:
        store.close()
    return meta, data


def _nested_store(path: Path) -> Path:
    columns = [
        ColumnSpec("obs/agentview_image", torch.uint8, (6, 6, 3)),
        ColumnSpec("obs/robot0_eef_pos", torch.float32, (3,)),
        ColumnSpec("next/obs/robot0_eef_pos", torch.float32, (3,)),
        ColumnSpec("action", torch.float64, (7,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("done", torch.bool),
    ]
    rng = np.random.default_rng(2)
    with TrajectoryStoreWriter(path, columns, env_id="Lift") as writer:
        for n in (4, 2, 5):
            writer.add_episode(
                {
                    "obs": {
                        "agentview_image": rng.integers(0, 256, (n, 6, 6, 3), dtype=np.uint8),
                        "robot0_eef_pos": rng.standard_normal((n, 3)).astype(np.float32),
                    },
                    "next": {
                        "obs": {"robot0_eef_pos": rng.standard_normal((n, 3)).astype(np.float32)}
                    },
                    "action": rng.standard_normal((n, 7)),
                    "reward": rng.standard_normal(n).astype(np.float32),
                    "done": np.arange(n) == n - 1,
                }
            )
    return path


WANT_KEYS = {
    "obs/agentview_image": "agentview_image",  # diffusion-policy's robomimic converter
    "obs/robot0_eef_pos": "robot0_eef_pos",
    "next/obs/robot0_eef_pos": "next.obs.robot0_eef_pos",
    "action": "action",
    "reward": "reward",
    "done": "done",
}


@pytest.mark.parametrize(("name", "fmt"), [("o.zarr", 2), ("o.zarr.zip", 2), ("o.zarr", 3)])
def test_every_data_key_loads_as_replay_buffer_loads_it(tmp_path, name, fmt):
    src = _nested_store(tmp_path / "s.h5")
    out = export_zarr(src, tmp_path / name, zarr_format=fmt, progress=False)
    meta, data = _load_like_replay_buffer(out)
    assert sorted(data) == sorted(WANT_KEYS.values())
    assert meta["episode_ends"].tolist() == [4, 6, 11]
    with TrajectoryStore(src) as store:
        for column, key in WANT_KEYS.items():
            want = store.read_column(column, 0, store.num_rows)
            assert data[key].dtype == want.dtype and np.array_equal(data[key], want), key


def test_the_flat_layout_imports_back_under_the_column_names(tmp_path):
    src = _nested_store(tmp_path / "s.h5")
    out = export_zarr(src, tmp_path / "o.zarr", progress=False)
    back = import_zarr(out, tmp_path / "back.h5", progress=False)
    with TrajectoryStore(src) as a, TrajectoryStore(back) as b:
        assert [c.name for c in b.columns] == [c.name for c in a.columns]
        assert b.episodes.lengths.tolist() == a.episodes.lengths.tolist()
        for spec in a.columns:
            x, y = a.read_column(spec.name, 0, a.num_rows), b.read_column(spec.name, 0, b.num_rows)
            assert x.dtype == y.dtype and np.array_equal(x, y), spec.name
        again = export_zarr(back, tmp_path / "again.zarr", progress=False)
    assert sorted(_load_like_replay_buffer(again)[1]) == sorted(WANT_KEYS.values())


def test_a_robomimic_import_exports_as_diffusion_policy_names_it(tmp_path):
    src = write_robomimic(tmp_path / "lift.hdf5", lengths=(3, 4))
    store = import_robomimic(src, tmp_path / "s.h5", progress=False)
    _, data = _load_like_replay_buffer(export_zarr(store, tmp_path / "o.zarr", progress=False))
    assert {"agentview_image", "robot0_eef_pos", "object", "action", "states"} <= set(data)
    assert "next.obs.agentview_image" in data and data["agentview_image"].shape == (7, 12, 10, 3)


def test_flat_keys():
    assert flat_keys(["obs/image", "next/obs/image", "action", "a/b/c"]) == {
        "obs/image": "image",
        "next/obs/image": "next.obs.image",
        "action": "action",
        "a/b/c": "a.b.c",
    }
    # obs/<k> keeps its prefix where another column is named <k>
    assert flat_keys(["obs/state", "state"]) == {"obs/state": "obs.state", "state": "state"}
    with pytest.raises(DatasetFormatError, match=r"'a/b' and 'a\.b' would both be .*data/a\.b"):
        flat_keys(["a/b", "a.b"])


def test_the_old_nested_layout_still_imports(tmp_path):
    """A zarr with nested groups under data/ (as earlier exports wrote) imports as before."""
    root = zarr.open_group(store=LocalStore(tmp_path / "n.zarr"), mode="w", zarr_format=2)
    obs = root.create_group("data").create_group("obs")
    obs.create_array("state", data=np.arange(6, dtype=np.float32).reshape(3, 2))
    root["data"].create_array("action", data=np.ones((3, 1)))
    root.create_group("meta").create_array("episode_ends", data=np.array([1, 3]))
    with TrajectoryStore(import_zarr(tmp_path / "n.zarr", tmp_path / "s.h5", progress=False)) as s:
        assert sorted(c.name for c in s.columns) == ["action", "obs/state"]
        assert np.array_equal(s.read_column("obs/state", 0, 3), obs["state"][:])


@pytest.mark.skipif(
    not ZARR2.exists(), reason=f"no zarr 2 venv at {ZARR2} (bash tests/formats/zarr2_venv.sh)"
)
@pytest.mark.parametrize("name", ["o.zarr", "o.zarr.zip"])
def test_zarr2_loads_the_export_as_replay_buffer_does(tmp_path, name):
    src = _nested_store(tmp_path / "s.h5")
    out = export_zarr(src, tmp_path / name, progress=False)
    result = subprocess.run(
        [str(ZARR2), "-c", COPY_FROM_PATH, str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["ends"] == [4, 6, 11]
    assert sorted(loaded["data"]) == sorted(WANT_KEYS.values())
    assert loaded["data"]["agentview_image"] == ["|u1", [11, 6, 6, 3]]
    assert loaded["data"]["next.obs.robot0_eef_pos"] == ["<f4", [11, 3]]
