"""Text and per-episode metadata through the robomimic export: an RLDS import's
``language_instruction`` leaves as HDF5 strings (not int64 codes) and each episode's
``episode_metadata`` (``file_path``) as its demo's attributes; per-step string datasets
of a robomimic-layout file import as text columns and are written back as they were."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.formats.robomimic_files import write_robomimic
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import DatasetFormatError
from torchstore.formats import export_robomimic, import_rlds, import_robomimic

FIXTURE = Path(__file__).parent / "fixtures" / "rlds_tiny"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "expected.npz") as npz:
        return {k: npz[k] for k in npz.files}


@pytest.fixture
def rlds_store(tmp_path) -> Path:
    """The tfds-written fixture (language_instruction, episode_metadata/file_path),
    copied and imported."""
    source = shutil.copytree(FIXTURE / "1.0.0", tmp_path / "rlds" / "1.0.0")
    return import_rlds(source, tmp_path / "rlds.h5", progress=False)


def _demo_strings(path: Path, key: str) -> list[str]:
    with h5py.File(path, "r") as f:
        demos = sorted(f["data"], key=lambda n: int(n.removeprefix("demo_")))
        return [s for d in demos for s in f[f"data/{d}/{key}"].asstr()[()].tolist()]


def test_rlds_text_and_file_path_leave_as_strings(rlds_store, expected, tmp_path):
    out = tmp_path / "rlds.hdf5"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the strings are written, nothing to warn of
        export_robomimic(rlds_store, out, progress=False)
    with h5py.File(out, "r") as f:
        lengths = expected["lengths"].tolist()
        for i, n in enumerate(lengths):
            demo = f[f"data/demo_{i}"]
            text = demo["language_instruction"]
            assert h5py.check_string_dtype(text.dtype).encoding == "utf-8"
            assert text.shape == (n,)
            meta = json.loads(demo.attrs["episode_metadata"])
            assert meta["file_path"] == expected["episode_metadata/file_path"][i]
            assert meta["episode_id"] == expected["episode_metadata/episode_id"][i]
            assert json.loads(demo.attrs["rlds"])["shard"].startswith("rlds_tiny-train")
            assert demo.attrs["num_samples"] == n
    want = expected["steps/language_instruction"].tolist()
    assert _demo_strings(out, "language_instruction") == want  # the emoji and the accent too


def test_the_export_imports_again_with_its_text(rlds_store, expected, tmp_path):
    first = export_robomimic(rlds_store, tmp_path / "a.hdf5", progress=False)
    back = import_robomimic(first, tmp_path / "back.h5", progress=False)
    with TrajectoryStore(back) as store:
        table = store.manifest.metadata["robomimic"]["string_tables"]["language_instruction"]
        codes = store.read_column("language_instruction", 0, store.num_rows)
        assert codes.dtype == np.int64
        strings = [table[c] for c in codes.tolist()]
        assert strings == expected["steps/language_instruction"].tolist()
        file_path = store.episode_metadata(0)["attrs"]["episode_metadata"]
        assert json.loads(file_path)["file_path"] == expected["episode_metadata/file_path"][0]
    again = export_robomimic(back, tmp_path / "b.hdf5", progress=False)
    assert _demo_strings(again, "language_instruction") == strings


def _with_text(path: Path) -> Path:
    """A robomimic file with a variable-length UTF-8 string per step and fixed-length
    ASCII bytes per step (gzip-compressed), beside its numbers."""
    write_robomimic(path, lengths=(3, 4, 2))
    words = {0: ["lift", "lift", "lift"], 1: ["stack", "stack", "rest", "stack"], 2: ["é", "é"]}
    with h5py.File(path, "a") as f:
        for i, steps in words.items():
            demo = f[f"data/demo_{i}"]
            demo.create_dataset("lang", data=steps, dtype=h5py.string_dtype("utf-8"))
            ds = demo.create_dataset(
                "phase", data=np.array([f"p{j}" for j in range(len(steps))], dtype="S2"),
                compression="gzip",
            )  # fmt: skip
            ds.attrs["note"] = "fixed-length bytes"
    return path


def test_string_datasets_of_a_robomimic_file_come_back_as_they_were(tmp_path):
    source = _with_text(tmp_path / "text.hdf5")
    store = import_robomimic(source, tmp_path / "text.h5", progress=False)
    with TrajectoryStore(store) as s:
        tables = s.manifest.metadata["robomimic"]["string_tables"]
        assert tables == {"lang": ["lift", "stack", "rest", "é"], "phase": ["p0", "p1", "p2", "p3"]}
        assert s.read_column("lang", 0, s.num_rows).tolist() == [0, 0, 0, 1, 1, 2, 1, 3, 3]
    out = export_robomimic(store, tmp_path / "again.hdf5", progress=False)
    with h5py.File(source, "r") as a, h5py.File(out, "r") as b:
        for i in range(3):
            for key in ("lang", "phase"):
                x, y = a[f"data/demo_{i}/{key}"], b[f"data/demo_{i}/{key}"]
                assert x.dtype == y.dtype and x.shape == y.shape, key
                assert h5py.check_string_dtype(x.dtype) == h5py.check_string_dtype(y.dtype)
                assert x[()].tolist() == y[()].tolist(), key
                assert (x.compression, dict(x.attrs)) == (y.compression, dict(y.attrs)), key


def test_strings_a_store_cannot_hold_as_text_are_refused(tmp_path):
    wide = write_robomimic(tmp_path / "wide.hdf5", lengths=(2, 3))
    with h5py.File(wide, "a") as f:
        for i, n in enumerate((2, 3)):
            f[f"data/demo_{i}"].create_dataset("pair", data=[["a", "b"]] * n, dtype="S1")
    with pytest.raises(DatasetFormatError, match=r"key 'pair' holds \(2,\) strings per step"):
        import_robomimic(wide, tmp_path / "wide.h5", progress=False)
    latin = write_robomimic(tmp_path / "latin.hdf5", lengths=(2, 3))
    with h5py.File(latin, "a") as f:
        for i, n in enumerate((2, 3)):
            f[f"data/demo_{i}"].create_dataset("word", data=[b"caf\xe9"] * n, dtype="S4")
    with pytest.raises(DatasetFormatError, match=r"demo_0 key 'word'.*not UTF-8 text"):
        import_robomimic(latin, tmp_path / "latin.h5", progress=False)
    assert not (tmp_path / "wide.h5").exists() and not (tmp_path / "latin.h5").exists()


def test_a_text_code_outside_its_table_is_refused(tmp_path):
    specs = [ColumnSpec("action", torch.float32, (2,)), ColumnSpec("note", torch.int64)]
    path = tmp_path / "bad.h5"
    meta = {"rlds": {"string_tables": {"note": ["only one"]}}}
    with TrajectoryStoreWriter(path, specs, metadata=meta) as w:
        w.add_episode({"action": torch.zeros(3, 2), "note": torch.tensor([0, 0, 5])})
    with pytest.raises(DatasetFormatError, match=r"column 'note': text code 5 is outside"):
        export_robomimic(path, tmp_path / "bad.hdf5", progress=False)
    assert not (tmp_path / "bad.hdf5").exists()


def test_episode_metadata_of_any_other_store_goes_into_its_demo(tmp_path):
    specs = [ColumnSpec("action", torch.float32, (2,))]
    path = tmp_path / "meta.h5"
    metas = [
        {"seed": 7, "success": True, "task": "push", "gains": [0.5, 1.0], "extra": None},
        {"seed": 8, "success": False, "task": "pull", "gains": [], "num_samples": 99},
    ]
    with TrajectoryStoreWriter(path, specs) as w:
        for meta in metas:
            w.add_episode({"action": torch.zeros(3, 2)}, meta)
    out = export_robomimic(path, tmp_path / "meta.hdf5", progress=False)
    with h5py.File(out, "r") as f:
        a, b = f["data/demo_0"].attrs, f["data/demo_1"].attrs
        assert (a["seed"], bool(a["success"]), a["task"]) == (7, True, "push")
        assert json.loads(a["gains"]) == [0.5, 1.0] and json.loads(a["extra"]) is None
        assert b["num_samples"] == 3  # robomimic's own attribute is the demo's length
