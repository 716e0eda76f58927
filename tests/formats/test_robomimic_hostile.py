"""robomimic-layout files that declare more than they hold, and MimicGen's per-demo arrays.

A few KB of HDF5 can declare gigabytes of rows: the import refuses them by name before it
allocates (torchstore.formats.limits), reads demos in bounded slabs, and leaves nothing
at ``dest``. MimicGen's ``src_demo_inds`` (one entry per subtask) is kept in the
episode's metadata and written back exactly.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.formats.refused_import import refused_import
from tests.formats.robomimic_files import describe, write_mimicgen, write_robomimic
from torchstore import TrajectoryStore
from torchstore.cli import main
from torchstore.errors import DatasetFormatError
from torchstore.formats import export_robomimic, import_robomimic, limits, robomimic
from torchstore.formats.robomimic_layout import decode_attr


def _declared(path, shape, **options):
    """One demo of 5 steps whose obs/cam declares ``shape`` and stores none of it."""
    with h5py.File(path, "w") as f:
        demo = f.create_group("data/demo_0")
        demo["actions"] = np.zeros((shape[0], 7))
        demo.create_dataset("obs/cam", shape=shape, dtype=np.uint8, **options)
        demo.attrs["num_samples"] = shape[0]
    return path


def _huge_rows(path):
    return _declared(path, (5, 50000, 50000))  # 11.6 GiB declared in a 7 KB file


def _unstored_chunks(path):
    return _declared(path, (5, 3000, 3000), chunks=(1, 10, 10))  # 450000 chunks, none stored


def _huge_per_demo(path):
    write_robomimic(path, lengths=(3, 4))
    with h5py.File(path, "a") as f:
        f["data/demo_1"].create_dataset("src_demo_inds", shape=(10**9,), dtype=np.int64)
    return path


def _huge_chunk(path):
    with h5py.File(path, "w") as f:
        demo = f.create_group("data/demo_0")
        demo["actions"] = np.zeros((3, 7))
        demo.create_dataset(
            "obs/cam", shape=(3, 4, 4), maxshape=(None, 4, 4), chunks=(2**27, 4, 4), dtype="u1"
        )  # 2 GiB chunks for 48 bytes of rows
        demo.attrs["num_samples"] = 3
    return path


HOSTILE = {
    "huge-rows": (
        _huge_rows,
        r"data/demo_0 key 'obs/cam': each row is uint8 \(50000, 50000\), 2\.33 GiB; a row "
        r"may hold at most 256 MiB \(torchstore\.formats\.limits\.MAX_ROW_BYTES\)",
    ),
    "unstored-chunks": (_unstored_chunks, r"'obs/cam': declares 450000 chunks .* but stores 0"),
    "huge-per-demo": (
        _huge_per_demo,
        r"data/demo_1 key 'src_demo_inds' \(one per demo\): holds 7\.45 GiB",
    ),
    "huge-chunk": (_huge_chunk, r"'obs/cam': each chunk is uint8 \(134217728, 4, 4\), 2 GiB"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_what_a_file_declares_is_bounded_before_anything_is_allocated(case, tmp_path, capsys):
    make, message = HOSTILE[case]
    src = make(tmp_path / "src.hdf5")
    assert src.stat().st_size < 2**20
    dest = tmp_path / "out" / "s.h5"
    with pytest.raises(DatasetFormatError, match=message):
        import_robomimic(src, dest, progress=False)
    assert main(["import", str(src), str(dest), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchstore import: ") and str(src) in err[0]
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_the_cli_prints_one_line_and_exits_1(tmp_path):
    src = _huge_rows(tmp_path / "src.hdf5")
    assert "MAX_ROW_BYTES" in refused_import(src, tmp_path / "s.h5")
    assert list(tmp_path.iterdir()) == [src]


def test_a_larger_row_limit_lets_the_same_shape_through(tmp_path, monkeypatch):
    """The limits are module attributes read when an import runs."""
    src = _declared(tmp_path / "src.hdf5", (3, 40, 40))
    monkeypatch.setattr(limits, "MAX_ROW_BYTES", 1000)
    with pytest.raises(DatasetFormatError, match=r"1\.56 KiB; a row may hold at most 1000"):
        import_robomimic(src, tmp_path / "s.h5", progress=False)
    monkeypatch.undo()
    with TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False)) as store:
        assert store.column("obs/cam").shape == (40, 40) and store.num_rows == 3


def test_demos_are_read_in_bounded_slabs_and_imported_exactly(tmp_path, monkeypatch):
    """With slabs of a few rows, demos come in pieces (committed at their last), and no
    read is larger than a slab: the same store as with whole demos."""
    src = write_robomimic(tmp_path / "src.hdf5", lengths=(5, 7, 3, 6))
    whole = TrajectoryStore(import_robomimic(src, tmp_path / "whole.h5", progress=False))
    reads = []
    real_read = robomimic._read

    def read(where, ds, out, start=None):
        reads.append(out.nbytes)
        real_read(where, ds, out, start)

    row_bytes = 12 * 10 * 3  # one agentview_image row, the widest key
    monkeypatch.setattr(robomimic, "_SLAB_BYTES", 2 * 2 * row_bytes)  # 2 steps of all keys
    monkeypatch.setattr(robomimic, "_read", read)
    sliced = TrajectoryStore(import_robomimic(src, tmp_path / "sliced.h5", progress=False))
    assert reads and max(reads) <= robomimic._SLAB_BYTES
    assert sliced.episodes.lengths.tolist() == [5, 7, 3, 6]
    for spec in whole.columns:
        a = whole.read_column(spec.name, 0, whole.num_rows)
        b = sliced.read_column(spec.name, 0, sliced.num_rows)
        assert a.dtype == b.dtype and np.array_equal(a, b), spec.name
    for i in range(4):
        assert sliced.episode_metadata(i) == whole.episode_metadata(i)
    out = export_robomimic(sliced, tmp_path / "out.hdf5", progress=False)
    assert describe(out) == describe(src)


# ---------------------------------------------------------------- MimicGen
def test_mimicgen_source_demos_are_episode_metadata_exactly(tmp_path):
    src = write_mimicgen(tmp_path / "src.hdf5")  # demo_1 has 2 steps and 2 subtasks
    store = TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False))
    columns = {c.name for c in store.columns}
    assert "src_demo_inds" not in columns
    assert {"src_demo_labels", "datagen_info/object_poses/cube", "states"} <= columns
    with h5py.File(src, "r") as f:
        for i in range(3):
            kept = decode_attr(store.episode_metadata(i)["arrays"]["src_demo_inds"]["value"])
            want = f[f"data/demo_{i}/src_demo_inds"][()]
            assert kept.dtype == want.dtype and kept.shape == want.shape == (2,)
            assert np.array_equal(kept, want)
            start, stop = store.episodes.range(i)
            labels = store.read_column("src_demo_labels", start, stop)
            assert np.array_equal(labels, f[f"data/demo_{i}/src_demo_labels"][()])


def test_labels_of_another_length_in_one_demo_are_kept_per_demo_in_all(tmp_path):
    src = write_mimicgen(tmp_path / "src.hdf5", labels_per_step=False)
    store = TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False))
    assert "src_demo_labels" not in {c.name for c in store.columns}
    shapes = [
        decode_attr(store.episode_metadata(i)["arrays"]["src_demo_labels"]["value"]).shape
        for i in range(3)
    ]
    assert shapes == [(6, 1), (1, 1), (9, 1)]


def test_a_per_step_key_of_another_length_is_still_refused(tmp_path):
    src = write_mimicgen(tmp_path / "src.hdf5")
    with h5py.File(src, "a") as f:
        del f["data/demo_2/datagen_info/eef_pose"]
        f["data/demo_2/datagen_info/eef_pose"] = np.zeros((8, 4, 4))
    with pytest.raises(DatasetFormatError, match=r"demo_2: key 'datagen_info/eef_pose' has 8"):
        import_robomimic(src, tmp_path / "s.h5", progress=False)
    assert not (tmp_path / "s.h5").exists()
