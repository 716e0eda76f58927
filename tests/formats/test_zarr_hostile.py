"""zarr sources whose metadata declares what their chunks cannot back.

A ``.zarray`` of a few bytes can declare a chunk of 0 rows (a division by zero), billions
of chunks (each a lookup, when the grid is enumerated) or chunks of gigabytes. The import
refuses them with one line naming the file and the array, before a row is read, in
bounded time (the stored chunks are listed, never the grid enumerated), and leaves
nothing at ``dest``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

from tests.formats.refused_import import refused_import
from torchstore import TrajectoryStore
from torchstore.cli import main
from torchstore.errors import DatasetFormatError
from torchstore.formats import limits, zarr_source
from torchstore.formats.zarr_import import import_zarr


def _declared(path: Path, shape, chunks, dtype="|u1", ends=None, fmt=2) -> Path:
    """A zarr whose data/x declares ``shape`` in ``chunks``, none of them stored."""
    root = zarr.open_group(store=LocalStore(path), mode="w", zarr_format=fmt)
    root.create_group("data")
    ends = [shape[0]] if ends is None else ends
    root.create_group("meta").create_array("episode_ends", data=np.array(ends, np.int64))
    folder = path / "data" / "x"
    folder.mkdir()
    if fmt == 2:
        meta = {
            "zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype,
            "compressor": None, "fill_value": 0, "filters": None, "order": "C",
        }  # fmt: skip
        (folder / ".zarray").write_text(json.dumps(meta))
    else:
        meta = {
            "zarr_format": 3, "node_type": "array", "shape": list(shape),
            "data_type": np.dtype(dtype).name, "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        }  # fmt: skip
        (folder / "zarr.json").write_text(json.dumps(meta))
    return path


HOSTILE = {
    "zero-chunk": (
        dict(shape=(20, 3), chunks=(0, 3)),
        r"data/x has chunks \[0, 3\] for its shape \[20, 3\]; chunks must be one positive",
    ),
    "negative-chunk": (  # refused by zarr itself as it lists data/
        dict(shape=(20, 3), chunks=(4, -1)),
        r"the arrays of 'data' cannot be listed \(ValueError: .*non-negative. Got \[4, -1\]",
    ),
    "huge-row": (  # the issue's 1 KB file: 8e9 chunks of one byte, rows of 381 MiB
        dict(shape=(20, 20000, 20000), chunks=(1, 1, 1)),
        r"data/x: each row is uint8 \(20000, 20000\), 381 MiB; a row may hold at most 256 MiB",
    ),
    "unstored-grid": (
        dict(shape=(20, 2000, 2000), chunks=(1, 1, 1)),
        r"data/x: declares 80000000 chunks \(76\.3 MiB\) but stores 0",
    ),
    "unstored-grid-v3": (
        dict(shape=(20, 2000, 2000), chunks=(1, 1, 1), fmt=3),
        r"data/x: declares 80000000 chunks \(76\.3 MiB\) but stores 0",
    ),
    "huge-chunk": (
        dict(shape=(4, 3), chunks=(2**28, 3), dtype="<f8"),
        r"data/x: each chunk is float64 \(268435456, 3\), 6 GiB decoded; a chunk may hold",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_declared_sizes_are_refused_in_one_line_before_a_row_is_read(case, tmp_path, capsys):
    kwargs, message = HOSTILE[case]
    src = _declared(tmp_path / "src.zarr", **kwargs)
    dest = tmp_path / "out" / "s.h5"
    with pytest.raises(DatasetFormatError, match=message) as info:
        import_zarr(src, dest, progress=False)
    assert str(info.value).startswith(f"{src}: ")
    assert main(["import", str(src), str(dest), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchstore import: ") and "data" in err[0]
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_the_issues_grid_is_listed_not_enumerated(tmp_path, monkeypatch):
    """With the row limit raised, the (20, 20000, 20000) array in 1x1x1 chunks reaches the
    chunk check: 8e9 chunks declared, none stored, found by one listing (enumerating the
    grid would stat 8e9 keys) and refused."""
    src = _declared(tmp_path / "src.zarr", (20, 20000, 20000), (1, 1, 1))
    monkeypatch.setattr(limits, "MAX_ROW_BYTES", 2**30)
    heads = []
    real = zarr_source.ChunkFiles.head
    monkeypatch.setattr(zarr_source.ChunkFiles, "head", lambda s, k: heads.append(k) or real(s, k))
    with pytest.raises(DatasetFormatError, match=r"declares 8000000000 chunks .* but stores 0"):
        import_zarr(src, tmp_path / "s.h5", progress=False)
    assert [k for k in heads if k.startswith("data/")] == []  # no lookup of data/x's chunks
    assert not (tmp_path / "s.h5").exists()


def test_only_stored_chunks_are_read_for_their_headers(tmp_path, monkeypatch):
    """A sparse zarr 3 array (chunks holding only the fill value are not stored) imports,
    each stored chunk's header read once and no absent one looked up."""
    path = tmp_path / "sparse.zarr"
    root = zarr.open_group(store=LocalStore(path), mode="w", zarr_format=2)
    x = root.create_group("data").create_array(
        "x", shape=(300, 2), chunks=(1, 2), dtype=np.float32, fill_value=0
    )
    values = np.zeros((300, 2), np.float32)
    values[::30] = 7.0
    x[:] = values
    root.create_group("meta").create_array("episode_ends", data=np.array([100, 300]))
    heads = []
    real = zarr_source.ChunkFiles.head
    monkeypatch.setattr(zarr_source.ChunkFiles, "head", lambda s, k: heads.append(k) or real(s, k))
    store = import_zarr(path, tmp_path / "s.h5", progress=False)
    assert sorted(k for k in heads if k.startswith("data/x/")) == sorted(
        f"data/x/{i}.0" for i in range(0, 300, 30)
    )
    with TrajectoryStore(store) as s:
        assert np.array_equal(s.read_column("x", 0, 300), values)


def test_the_cli_prints_one_line_and_exits_1(tmp_path):
    for name, kwargs in (("zero", HOSTILE["zero-chunk"][0]), ("grid", HOSTILE["huge-row"][0])):
        src = _declared(tmp_path / f"{name}.zarr", **kwargs)
        assert "data/x" in refused_import(src, tmp_path / f"{name}.h5")
