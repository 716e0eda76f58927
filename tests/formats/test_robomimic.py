"""robomimic-layout HDF5 (robomimic, LIBERO, Isaac Lab) into stores and back, exactly."""

from __future__ import annotations

import functools

import h5py
import numpy as np
import pytest
import torch

from tests.formats.robomimic_files import (
    describe,
    write_isaaclab,
    write_libero,
    write_mimicgen,
    write_robomimic,
)
from torchstore import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import DatasetFormatError, DestinationError, DestinationExistsError
from torchstore.formats import export_robomimic, import_robomimic


@pytest.fixture(scope="module")
def robomimic_file(tmp_path_factory):
    return write_robomimic(tmp_path_factory.mktemp("rm") / "lift.hdf5")


def test_every_key_is_imported_exactly_in_robomimic_demo_order(robomimic_file, tmp_path):
    store = TrajectoryStore(import_robomimic(robomimic_file, tmp_path / "s.h5", progress=False))
    with h5py.File(robomimic_file, "r") as f:
        demos = sorted(f["data"], key=lambda n: int(n[5:]))  # robomimic's order
        assert list(f["data"])[:3] == ["demo_0", "demo_1", "demo_10"]  # h5py's is not
        assert store.num_episodes == len(demos)
        renames = {"actions": "action", "rewards": "reward", "dones": "done"}
        for i, demo in enumerate(demos):
            assert store.episode_metadata(i)["demo"] == demo
            start, stop = store.episodes.range(i)
            group = f[f"data/{demo}"]
            assert stop - start == group.attrs["num_samples"]
            for path in [
                "actions",
                "states",
                "rewards",
                "obs/object",
                "obs/agentview_image",
                "next_obs/robot0_eef_pos",
                "next_obs/agentview_image",
            ]:
                name = renames.get(path, path.replace("next_obs/", "next/obs/"))
                got = store.read_column(name, start, stop)
                assert got.dtype == group[path].dtype and np.array_equal(got, group[path][()]), path
            done = store.read_column("done", start, stop)
            assert done.dtype == np.bool_ and np.array_equal(done, group["dones"][()] == 1)
    assert store.column("obs/agentview_image").dtype.is_floating_point is False
    meta = store.manifest.metadata
    assert store.manifest.env_id == "Lift"
    assert meta["robomimic"]["data_attrs"]["env_args"].startswith("{")
    assert store.episode_metadata(0)["attrs"]["model_file"] == "<mujoco model='demo0'/>"
    with h5py.File(robomimic_file, "r") as f:
        for name in ("train", "valid"):
            names = [d.decode() for d in f[f"mask/{name}"][()]]
            assert [demos[i] for i in meta["episode_sets"][name]] == names
    batch = store.episode(3)
    assert batch["obs", "agentview_image"].shape[1:] == (12, 10, 3)
    assert batch["next", "obs", "object"].shape[1:] == (10,)


@pytest.mark.parametrize(
    "writer",
    [
        write_robomimic,
        write_libero,
        write_isaaclab,
        write_mimicgen,
        functools.partial(write_mimicgen, labels_per_step=False),  # labels as metadata
    ],
    ids=["robomimic", "libero", "isaaclab", "mimicgen", "mimicgen-ragged-labels"],
)
def test_file_to_store_to_file_is_byte_equal_per_dataset(writer, tmp_path):
    src = writer(tmp_path / "src.hdf5")
    store = import_robomimic(src, tmp_path / "s.h5", progress=False)
    out = export_robomimic(store, tmp_path / "out.hdf5", progress=False)
    want, got = describe(src), describe(out)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def test_libero_and_isaaclab_extras_are_kept(tmp_path):
    libero = TrajectoryStore(
        import_robomimic(write_libero(tmp_path / "l.hdf5"), tmp_path / "l.h5", progress=False)
    )
    meta = libero.manifest.metadata["robomimic"]
    assert meta["variant"] == "libero"
    assert "problem_info" in meta["data_attrs"] and "bddl_file_name" in meta["data_attrs"]
    assert libero.column("reward").dtype.is_floating_point  # uint8 rewards, exactly as float64
    assert "init_state" in libero.episode_metadata(0)["attrs"]
    isaac = TrajectoryStore(
        import_robomimic(write_isaaclab(tmp_path / "i.hdf5"), tmp_path / "i.h5", progress=False)
    )
    assert isaac.manifest.metadata["robomimic"]["variant"] == "isaaclab"
    assert "initial_state/rigid_object/cube_1/root_pose" in isaac.episode_metadata(1)["arrays"]
    assert "states/articulation/robot/joint_position" in {c.name for c in isaac.columns}
    assert isaac.episode_metadata(1)["attrs"]["seed"]["ndarray"]["dtype"] == "<i8"


def test_a_store_of_another_origin_exports_in_robomimic_names(tmp_path):
    cols = [
        ColumnSpec("obs", "float32", (3,)),
        ColumnSpec("next/obs", "float32", (3,)),
        ColumnSpec("action", "float32", (2,)),
        ColumnSpec("reward", "float32"),
        ColumnSpec("done", "bool"),
    ]
    with TrajectoryStoreWriter(
        tmp_path / "s.h5", cols, env_id="Pendulum-v1", metadata={"episode_sets": {"valid": [1]}}
    ) as w:
        for n in (4, 6):
            w.add_episode(
                {
                    "obs": np.ones((n, 3), np.float32),
                    "next": {"obs": np.zeros((n, 3), np.float32)},
                    "action": np.ones((n, 2), np.float32),
                    "reward": np.ones(n, np.float32),
                    "done": np.arange(n) == n - 1,
                }
            )
    out = export_robomimic(tmp_path / "s.h5", tmp_path / "out.hdf5", progress=False)
    with h5py.File(out, "r") as f:
        assert sorted(f["data/demo_1"]) == ["actions", "dones", "next_obs", "obs", "rewards"]
        assert f["data/demo_1/obs/obs"].shape == (6, 3)
        assert f["data/demo_1/dones"].dtype == np.int64 and f["data/demo_1/dones"][-1] == 1
        assert f["data"].attrs["total"] == 10 and f["data/demo_0"].attrs["num_samples"] == 4
        assert '"Pendulum-v1"' in f["data"].attrs["env_args"]
        assert [d.decode() for d in f["mask/valid"][()]] == ["demo_1"]


def _mismatched(path):
    write_robomimic(path, lengths=(4, 5, 6))
    with h5py.File(path, "a") as f:
        del f["data/demo_1/obs/object"]
        f["data/demo_1/obs/object"] = np.zeros((4, 10))  # 4 rows in a 5-step demo
    return path


def _truncated(path):
    write_robomimic(path, lengths=(40, 40))
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    return path


def _no_data(path):
    with h5py.File(path, "w") as f:
        f["observations"] = np.zeros((3, 2))
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_mismatched, ["data/demo_1", "obs/object", "4 rows", "5 steps"]),
        (_truncated, ["src.hdf5"]),
        (_no_data, ["no 'data' group"]),
    ],
)
def test_bad_files_are_refused_by_name_and_leave_nothing(make, words, tmp_path):
    src = make(tmp_path / "src.hdf5")
    with pytest.raises(DatasetFormatError) as info:
        import_robomimic(src, tmp_path / "out" / "s.h5", progress=False)
    for word in words:
        assert word in str(info.value)
    assert not (tmp_path / "out" / "s.h5").exists()
    assert (
        [p.name for p in (tmp_path / "out").iterdir()] == []
        if (tmp_path / "out").exists()
        else True
    )


def test_an_existing_destination_is_kept(robomimic_file, tmp_path):
    dest = tmp_path / "s.h5"
    import_robomimic(robomimic_file, dest, progress=False)
    with pytest.raises(DestinationExistsError):
        import_robomimic(robomimic_file, dest, progress=False)
    out = export_robomimic(dest, tmp_path / "o.hdf5", progress=False)
    with pytest.raises(DestinationExistsError):
        export_robomimic(dest, out, progress=False)
    assert TrajectoryStore(dest).num_episodes == 12


def test_gzip_datasets_with_edge_chunks_export_exactly(tmp_path):
    rng = np.random.default_rng(3)
    src = tmp_path / "big.hdf5"
    with h5py.File(src, "w") as f:
        for i, n in enumerate((1999, 1001)):
            demo = f.create_group(f"data/demo_{i}")
            demo.create_dataset("actions", data=rng.normal(size=(n, 7)), compression="gzip")
            demo.create_dataset(
                "obs/cam", data=rng.integers(0, 255, (n, 9, 11, 3), np.uint8),
                compression="gzip", compression_opts=6,
            )  # fmt: skip
            demo.attrs["num_samples"] = n
        assert f["data/demo_0/obs/cam"].chunks[0] < 1999  # several chunks, a partial last one
    store = import_robomimic(src, tmp_path / "s.h5", progress=False)
    out = export_robomimic(store, tmp_path / "out.hdf5", progress=False)
    with h5py.File(src, "r") as a, h5py.File(out, "r") as b:
        for path in ("data/demo_0/obs/cam", "data/demo_1/obs/cam", "data/demo_1/actions"):
            assert b[path].compression == "gzip"
            assert b[path].compression_opts == a[path].compression_opts
            assert b[path].chunks == a[path].chunks
            assert np.array_equal(a[path][()], b[path][()]), path


def test_what_a_store_cannot_keep_is_named_in_one_warning(tmp_path):
    src = write_robomimic(tmp_path / "src.hdf5", lengths=(3, 4))
    with h5py.File(src, "a") as f:
        f["data/demo_0/obs/alias"] = h5py.SoftLink("/data/demo_0/obs/object")
        f["data/notes"] = np.zeros(2)
        f.create_group("mask/sub")
        f["data/demo_1"].attrs["ref"] = f["data/demo_1/actions"].ref
    with pytest.warns(UserWarning, match="does not keep 4 item") as record:
        store = TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False))
    message = str(record[0].message)
    for part in ("obs/alias (soft link", "data/notes", "mask/sub", "'ref'"):
        assert part in message
    assert "obs/alias" not in {c.name for c in store.columns}


def test_dtypes_a_column_cannot_hold_are_held_exactly_and_written_back(tmp_path):
    src = tmp_path / "src.hdf5"
    with h5py.File(src, "w") as f:
        for i, n in enumerate((3, 5)):
            demo = f.create_group(f"data/demo_{i}")
            demo["actions"] = np.arange(n * 2, dtype=">f8").reshape(n, 2)
            demo["obs/depth"] = np.full((n, 4, 4), 60000 + i, np.uint16)
            demo["obs/ticks"] = np.full((n,), 2**32 - 1, np.uint32)
            demo["dones"] = np.eye(n, dtype=np.int64)[-1]
            demo["done"] = np.eye(n, dtype=bool)[-1]  # both names: each keeps its own
            demo.attrs["num_samples"] = n
    store = TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False))
    assert store.column("action").dtype == torch.float64
    assert store.column("obs/depth").dtype == torch.int32
    assert store.column("obs/ticks").dtype == torch.int64
    assert {"done", "dones"} <= {c.name for c in store.columns}
    out = export_robomimic(store, tmp_path / "out.hdf5", progress=False)
    want, got = describe(src), describe(out)
    for name in want:
        assert got[name] == want[name], name


def test_a_num_samples_that_is_not_a_count_is_named(tmp_path):
    src = write_robomimic(tmp_path / "src.hdf5", lengths=(3, 4))
    with h5py.File(src, "a") as f:
        f["data/demo_1"].attrs["num_samples"] = np.array([4, 4])
    with pytest.raises(DatasetFormatError, match=r"data/demo_1: num_samples is int64 \(2,\)"):
        import_robomimic(src, tmp_path / "s.h5", progress=False)


def test_an_export_overwrites_only_a_robomimic_file(robomimic_file, tmp_path):
    store = import_robomimic(robomimic_file, tmp_path / "s.h5", progress=False)
    other = import_robomimic(robomimic_file, tmp_path / "other.h5", progress=False)
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5")
    for victim, words in ((other, "a torchstore store"), (text, "not an HDF5 file")):
        with pytest.raises(DestinationError, match=words):
            export_robomimic(store, victim, overwrite=True, progress=False)
    assert TrajectoryStore(other).num_episodes == 12 and text.read_text() == "not hdf5"
    out = export_robomimic(store, tmp_path / "o.hdf5", progress=False)
    assert export_robomimic(store, out, overwrite=True, progress=False) == out
