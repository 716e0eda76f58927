"""``torchstore demo data/reach_demo.h5 --task reach --overwrite`` leaves the shipped file
byte for byte as it was (the README's promise), and the copy that makes it so lays a file
out by its content alone, not by the order the writer created its objects in."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from torchstore.cli import main
from torchstore.io.hdf5.reproducible import reproducible_copy

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "reach_demo.h5"


def test_demo_data_regenerates_the_shipped_file_to_the_byte(tmp_path):
    again = tmp_path / "reach_demo.h5"
    assert main(["demo", str(again), "--task", "reach"]) == 0
    assert main(["demo", str(again), "--task", "reach", "--overwrite"]) == 0  # written twice
    assert again.read_bytes() == SHIPPED.read_bytes(), (
        "data/reach_demo.h5 is not what `torchstore demo --task reach` writes now: if the "
        "store format changed on purpose, regenerate it with "
        "`torchstore demo data/reach_demo.h5 --task reach --overwrite`"
    )


def _write(path: Path, order: list[str]) -> Path:
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs["manifest"] = np.bytes_(b"{}")
        for name in order:
            f.create_dataset(f"columns/{name}", data=np.arange(10.0) * len(name), chunks=(4,))
        f.create_dataset("commit", data=np.zeros(4, np.int64))
    return path


def test_the_copy_does_not_depend_on_the_order_objects_were_created_in(tmp_path):
    names = ["state", "pixels", "action", "terminated", "next_state"]
    a = reproducible_copy(_write(tmp_path / "a.h5", names), tmp_path / "a.copy.h5")
    b = reproducible_copy(_write(tmp_path / "b.h5", names[::-1]), tmp_path / "b.copy.h5")
    assert a.read_bytes() == b.read_bytes()
    with h5py.File(a, "r") as f:
        assert sorted(f["columns"]) == sorted(names)
        assert np.array_equal(f["columns/state"][()], np.arange(10.0) * 5)
        assert f.attrs["manifest"] == b"{}"
