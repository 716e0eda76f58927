"""diffusion-policy zarr in and out (torchstore/formats/zarr_import.py, zarr_export.py).

The shipped fixture (``fixtures/pusht_tiny.*``) was written by zarr 2.18 the way
diffusion-policy's ``ReplayBuffer`` writes (``make_zarr_fixture.py``), with the arrays zarr
2 read back in an ``.npz``: importing it with zarr 3 must give exactly those. Round trips
go both ways, in folders and zips, zarr v2 and v3; hostile inputs fail with a
``DatasetFormatError`` naming the file, key and episode, and leave nothing at ``dest``.
The check that zarr 2 reads what ``export_zarr`` writes runs where the zarr 2 venv of
``zarr2_venv.sh`` exists (skipped otherwise, as in CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
import zipfile
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.storage import LocalStore

from torchstore import TrajectoryStore
from torchstore.data.columns import ColumnSpec
from torchstore.data.file.writer import TrajectoryStoreWriter
from torchstore.errors import DatasetFormatError, DestinationError, DestinationExistsError
from torchstore.formats import zarr_export, zarr_import, zarr_source
from torchstore.formats.zarr_export import export_zarr
from torchstore.formats.zarr_import import import_zarr

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
FOLDER = FIXTURES / "pusht_tiny.zarr"
ZIPPED = FIXTURES / "pusht_tiny.zarr.zip"
ZARR2 = Path(os.environ.get("ZARR2_PYTHON", "/tmp/zarr2/bin/python"))
BLOSC = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "pusht_tiny.npz") as npz:
        return {k: npz[k] for k in npz.files}


def _open(path: Path):
    """(root group, store) of a zarr folder or zip, read with zarr 3."""
    store = zarr.storage.ZipStore(path, mode="r") if path.suffix == ".zip" else LocalStore(path)
    return zarr.open_group(store=store, mode="r"), store


def _contents(path: Path) -> dict:
    """Every array (values, dtype, shape) and every node's attributes of a zarr store."""
    root, store = _open(path)
    try:
        out = {"attrs": {"": dict(root.attrs)}, "arrays": {}}
        for name, node in root.members(max_depth=None):
            out["attrs"][name] = dict(node.attrs)
            if isinstance(node, zarr.Array):
                out["arrays"][name] = np.asarray(node[...])
        return out
    finally:
        store.close()


def _assert_same(a: dict, b: dict, *, byte_order: bool = True) -> None:
    assert sorted(a["arrays"]) == sorted(b["arrays"])
    for name, value in a["arrays"].items():
        other = b["arrays"][name]
        if byte_order:
            assert value.dtype.str == other.dtype.str, name
        else:
            assert value.dtype.newbyteorder("=") == other.dtype.newbyteorder("="), name
        assert value.shape == other.shape, name
        assert np.array_equal(value, other, equal_nan=value.dtype.kind == "f"), name
    assert a["attrs"] == b["attrs"]


def _leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


# ---------------------------------------------------------------- the zarr 2 fixture
def test_fixture_is_diffusion_policy_layout():
    """What zarr 2 + ReplayBuffer.add_episode wrote (the fixture's own regression)."""
    zarray = json.loads((FOLDER / "data/img/.zarray").read_text())
    assert zarray["zarr_format"] == 2 and zarray["dtype"] == "|u1"
    assert zarray["compressor"] == {
        "id": "blosc",
        "cname": "lz4",
        "clevel": 5,
        "shuffle": 0,
        "blocksize": 0,
    }
    assert zarray["chunks"] == [7, 32, 32, 3]  # get_optimal_chunks of the first episode
    assert json.loads((FOLDER / "data/state/.zarray").read_text())["chunks"] == [7, 5]
    ends = json.loads((FOLDER / "meta/episode_ends/.zarray").read_text())
    assert ends["dtype"] == "<i8" and ends["compressor"] is None
    ours = [*FOLDER.rglob("*"), ZIPPED, FIXTURES / "pusht_tiny.npz"]
    assert sum(f.stat().st_size for f in ours if f.is_file()) < 300_000


@pytest.mark.parametrize("source", [FOLDER, ZIPPED], ids=["folder", "zip"])
def test_import_zarr2_fixture_exact(tmp_path, expected, source):
    dest = import_zarr(source, tmp_path / "pusht.h5", progress=False)
    assert _leftovers(tmp_path, set()) == ["pusht.h5"]
    with TrajectoryStore(dest) as store:
        keys = sorted(k.removeprefix("data/") for k in expected if k.startswith("data/"))
        assert [c.name for c in store.columns] == keys
        ends = expected["meta/episode_ends"]
        assert store.episodes.lengths.tolist() == np.diff(ends, prepend=0).tolist()
        for spec in store.columns:
            want = expected[f"data/{spec.name}"]
            got = store.read_column(spec.name, 0, store.num_rows)
            assert got.dtype == want.dtype and got.shape == want.shape, spec.name
            assert np.array_equal(got, want), spec.name
            assert spec.shape == want.shape[1:]
        meta = store.manifest.metadata["zarr"]
        assert meta["zarr_format"] == 2
        assert meta["arrays"]["data/img"]["compressor"]["cname"] == "lz4"


# ---------------------------------------------------------------- zarr -> store -> zarr
@pytest.mark.parametrize(
    ("source", "name", "fmt"),
    [
        (FOLDER, "out.zarr", 2),
        (FOLDER, "out.zarr.zip", 2),
        (ZIPPED, "out.zarr", 3),
        (ZIPPED, "out.zarr.zip", 3),
    ],
    ids=["folder-v2", "zip-v2", "folder-v3", "zip-v3"],
)
def test_round_trip_zarr_store_zarr(tmp_path, source, name, fmt):
    store = import_zarr(source, tmp_path / "s.h5", progress=False)
    out = export_zarr(store, tmp_path / name, zarr_format=fmt, progress=False)
    assert _leftovers(tmp_path, {"s.h5"}) == [name]
    _assert_same(_contents(source), _contents(out))
    root, zs = _open(out)
    try:
        assert root.metadata.zarr_format == fmt
        assert root["meta/episode_ends"].dtype == np.int64
        assert root["data/img"].chunks == (7, 32, 32, 3)  # the source's chunks, kept
        if fmt == 2:
            assert root["data/img"].compressors == (BLOSC,)
            assert root["meta/episode_ends"].compressors == ()
    finally:
        zs.close()
    if name.endswith(".zip"):
        with zipfile.ZipFile(out) as zf:
            names = zf.namelist()
        assert len(names) == len(set(names))  # every key written once


def _rich_source(path: Path, fmt: int) -> Path:
    """A zarr (v2 or v3) with what the fixture lacks: nested data groups, attributes
    everywhere, extra meta arrays, and dtypes a column holds differently."""
    rng = np.random.default_rng(3)
    root = zarr.open_group(
        store=LocalStore(path), mode="w", zarr_format=fmt, attributes={"task": "push", "v": 7}
    )
    data = root.create_group("data", attributes={"fps": 10.0})
    obs = data.create_group("obs", attributes={"frame": "base"})
    meta = root.create_group("meta", attributes={"note": None})
    ends = np.array([3, 4, 9, 11], np.int64)
    n = int(ends[-1])
    codec = BLOSC if fmt == 2 else zarr.codecs.BloscCodec(cname="lz4", clevel=5)
    groups = {"obs": obs, "data": data}
    values = {
        ("obs", "image"): rng.integers(0, 256, (n, 4, 5, 3), dtype=np.uint8),
        ("obs", "state"): rng.standard_normal((n, 3)).astype(np.float32),
        ("data", "action"): rng.standard_normal((n, 2)).astype(">f4" if fmt == 2 else "<f4"),
        ("data", "depth"): rng.integers(0, 2**16, (n, 2, 2), dtype=np.uint16),
        ("data", "ticks"): rng.integers(0, 2**32, n, dtype=np.uint32),
        ("data", "stamp"): rng.integers(0, 2**62, n, dtype=np.uint64),
        ("data", "contact"): rng.random(n) < 0.5,
        ("data", "half"): rng.standard_normal(n).astype(np.float16),
        ("data", "stage"): rng.integers(-3, 3, n).astype(np.int8),
        ("data", "time"): np.arange(n, dtype=np.float64) / 10,
    }
    for k, ((group, key), value) in enumerate(values.items()):
        arr = groups[group].create_array(
            key,
            shape=value.shape,
            chunks=(1 + k % 4, *value.shape[1:]),
            dtype=value.dtype,
            compressors=codec,
            fill_value=0,
            attributes={"key": key, "unit": [1, 2]} if k % 2 else {},
        )
        arr[:] = value
    e = meta.create_array("episode_ends", shape=ends.shape, dtype=np.int64, chunks=(2,))
    e[:] = ends
    e.attrs["about"] = "cumulative ends"
    scale = meta.create_array("scale", shape=(2, 2), dtype=np.float64, chunks=(2, 2))
    scale[:] = [[1.5, np.nan], [np.inf, -0.0]]
    scale.attrs["nan"] = "kept"
    seeds = meta.create_array("seeds", shape=(4,), dtype=np.int32, chunks=(4,))
    seeds[:] = [5, 6, 7, 8]
    camera = meta.create_group("camera", attributes={"name": "front"})
    camera.create_array("intrinsics", data=np.eye(3), attributes={"model": "pinhole"})
    if fmt == 3:
        named = data.create_array(
            "named", shape=(n, 2), dtype=np.float32, dimension_names=["t", "xy"]
        )
        named[:] = 1.5
    return path


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("name", ["out.zarr", "out.zarr.zip"])
def test_round_trip_rich_source(tmp_path, fmt, name):
    source = _rich_source(tmp_path / "src.zarr", fmt)
    store = import_zarr(source, tmp_path / "s.h5", progress=False)
    with TrajectoryStore(store) as s:
        columns = {c.name: c for c in s.columns}
        assert columns["obs/image"].dtype == torch.uint8
        assert columns["obs/image"].shape == (4, 5, 3)
        assert columns["depth"].dtype == torch.int32  # uint16 in a wider column
        assert columns["ticks"].dtype == torch.int64
        assert columns["stamp"].dtype == torch.int64
        assert columns["contact"].dtype == torch.bool
        assert s.episodes.lengths.tolist() == [3, 1, 5, 2]
    out = export_zarr(store, tmp_path / name, zarr_format=fmt, progress=False)
    _assert_same(_contents(source), _contents(out))
    if fmt == 3:
        root, zs = _open(out)
        try:
            assert root["data/named"].metadata.dimension_names == ("t", "xy")
        finally:
            zs.close()


# ---------------------------------------------------------------- store -> zarr -> store
def _store(path: Path) -> Path:
    columns = [
        ColumnSpec("obs", torch.float32, (3,)),
        ColumnSpec("next/obs", torch.float32, (3,)),
        ColumnSpec("pixels", torch.uint8, (6, 6, 3)),
        ColumnSpec("action", torch.float64, (2,)),
        ColumnSpec("reward", torch.float32),
        ColumnSpec("done", torch.bool),
        ColumnSpec("step", torch.int16),
    ]
    rng = np.random.default_rng(5)
    with TrajectoryStoreWriter(
        path, columns, env_id="Pendulum-v1", seed=11, metadata={"origin": {"run": 3}}
    ) as writer:
        for length in (4, 1, 9, 3):
            writer.add_episode(
                {
                    "obs": rng.standard_normal((length, 3)).astype(np.float32),
                    "next": {"obs": rng.standard_normal((length, 3)).astype(np.float32)},
                    "pixels": rng.integers(0, 256, (length, 6, 6, 3), dtype=np.uint8),
                    "action": rng.standard_normal((length, 2)),
                    "reward": rng.standard_normal(length).astype(np.float32),
                    "done": np.arange(length) == length - 1,
                    "step": np.arange(length, dtype=np.int16),
                }
            )
    return path


@pytest.mark.parametrize(
    ("name", "fmt", "chunk_rows"),
    [("out.zarr", 2, None), ("out.zarr.zip", 2, 5), ("out.zarr", 3, 2), ("out.zarr.zip", 3, None)],
)
def test_round_trip_store_zarr_store(tmp_path, name, fmt, chunk_rows):
    source = _store(tmp_path / "s.h5")
    out = export_zarr(
        source, tmp_path / name, zarr_format=fmt, chunk_rows=chunk_rows, progress=False
    )
    back = import_zarr(out, tmp_path / "back.h5", progress=False)
    with TrajectoryStore(source) as a, TrajectoryStore(back) as b:
        assert [(c.name, c.dtype, c.shape) for c in a.columns] == [
            (c.name, c.dtype, c.shape) for c in b.columns
        ]  # the order too: the export records it
        assert torch.equal(a.episodes.lengths, b.episodes.lengths)
        for spec in a.columns:
            assert np.array_equal(
                a.read_column(spec.name, 0, a.num_rows), b.read_column(spec.name, 0, b.num_rows)
            )
        assert b.manifest.env_id == "Pendulum-v1" and b.manifest.seed == 11
        assert b.manifest.metadata["origin"] == {"run": 3}
    root, zs = _open(out)
    try:
        assert root["meta/episode_ends"][:].tolist() == [4, 5, 14, 17]
        assert root["data/next.obs"].shape == (17, 3)  # flat, as ReplayBuffer loads them
        if chunk_rows:
            assert root["data/pixels"].chunks == (chunk_rows, 6, 6, 3)
        else:  # get_optimal_chunks: the whole 17 rows fit in 2 MB
            assert root["data/pixels"].chunks == (17, 6, 6, 3)
    finally:
        zs.close()


@pytest.mark.parametrize(
    ("fmt", "compressor"),
    [(2, "disk"), (3, "disk"), (2, None), (3, numcodecs.Zstd(level=1))],
    ids=["v2-disk", "v3-disk", "v2-none", "v3-numcodecs"],
)
@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")
def test_export_compressors(tmp_path, expected, fmt, compressor):
    store = import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    out = export_zarr(
        store, tmp_path / "o.zarr", compressor=compressor, zarr_format=fmt, progress=False
    )
    got = _contents(out)["arrays"]
    for key, want in expected.items():
        assert np.array_equal(got[key], want), key
    root, zs = _open(out)
    try:
        codecs = root["data/img"].compressors
        if compressor is None:
            assert codecs == ()
        elif compressor == "disk":
            assert "zstd" in str(codecs[0]) and "bitshuffle" in str(codecs[0]).lower()
    finally:
        zs.close()
    with pytest.raises(ValueError, match="numcodecs codec"):
        export_zarr(store, tmp_path / "x.zarr", compressor=zarr.codecs.ZstdCodec(), zarr_format=2)
    with pytest.raises(ValueError, match="must be 2 or 3"):
        export_zarr(store, tmp_path / "x.zarr", zarr_format=4)
    assert not (tmp_path / "x.zarr").exists()


def test_optimal_chunks_match_diffusion_policy():
    assert zarr_export.optimal_chunks((25650, 96, 96, 3), 1) == (73, 96, 96, 3)
    assert zarr_export.optimal_chunks((25650, 2), 4) == (25650, 2)
    assert zarr_export.optimal_chunks((200000, 5), 4) == (100000, 5)
    assert zarr_export.optimal_chunks((10, 1024, 1024, 3), 1) == (1, 652, 1024, 3)
    assert zarr_export.optimal_chunks((0, 3), 4) == (1, 3)


def test_slabs_and_pieces_cut_anywhere(tmp_path, monkeypatch, expected):
    """Slabs smaller than an episode (pieces) and reads cut inside chunks stay exact."""
    monkeypatch.setattr(zarr_source, "SLAB_BYTES", 5000)
    monkeypatch.setattr(zarr_source, "READ_BYTES", 1)
    dest = import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    with TrajectoryStore(dest) as store:
        ends = expected["meta/episode_ends"]
        assert store.episodes.lengths.tolist() == np.diff(ends, prepend=0).tolist()
        for spec in store.columns:
            got = store.read_column(spec.name, 0, store.num_rows)
            assert np.array_equal(got, expected[f"data/{spec.name}"])
    out = export_zarr(dest, tmp_path / "o.zarr", chunk_rows=5, progress=False)
    assert np.array_equal(_contents(out)["arrays"]["data/img"], expected["data/img"])


# ---------------------------------------------------------------- episode boundaries
@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=7),
    chunk=st.integers(1, 6),
    slab=st.integers(1, 400),
)
def test_episode_boundaries_survive(tmp_path_factory, lengths, chunk, slab):
    tmp = tmp_path_factory.mktemp("ends")
    ends = np.cumsum(lengths).astype(np.int64)
    n = int(ends[-1])
    root = zarr.open_group(store=LocalStore(tmp / "src.zarr"), mode="w", zarr_format=2)
    x = root.create_group("data").create_array(
        "x", shape=(n, 2), chunks=(chunk, 2), dtype=np.int32, compressors=BLOSC
    )
    x[:] = np.arange(2 * n, dtype=np.int32).reshape(n, 2)
    root.create_group("meta").create_array("episode_ends", data=ends)
    old = zarr_source.SLAB_BYTES
    zarr_source.SLAB_BYTES = slab  # hypothesis and function-scoped monkeypatch do not mix
    try:
        store = import_zarr(tmp / "src.zarr", tmp / "s.h5", progress=False)
    finally:
        zarr_source.SLAB_BYTES = old
    with TrajectoryStore(store) as s:
        assert s.episodes.lengths.tolist() == lengths
        assert np.array_equal(s.read_column("x", 0, n), x[:])
    out = export_zarr(store, tmp / "out.zarr", progress=False)
    assert _contents(out)["arrays"]["meta/episode_ends"].tolist() == ends.tolist()


# ---------------------------------------------------------------- hostile inputs
def _small(path: Path, ends=(2, 5, 6), rows: dict | None = None) -> Path:
    root = zarr.open_group(store=LocalStore(path), mode="w", zarr_format=2)
    data = root.create_group("data")
    rows = rows or {"img": 6, "state": 6}
    for key, n in rows.items():
        arr = data.create_array(
            key, shape=(n, 3), chunks=(2, 3), dtype=np.float32, compressors=BLOSC
        )
        arr[:] = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
    meta = root.create_group("meta")
    if ends is not None:
        meta.create_array("episode_ends", data=np.asarray(ends))
    return path


def _no_meta(p: Path) -> None:
    shutil.rmtree(p / "meta")


def _no_data(p: Path) -> None:
    shutil.rmtree(p / "data")


def _corrupt_chunk(p: Path) -> None:
    chunk = p / "data/img/1.0"  # rows 2..3: episode 1
    chunk.write_bytes(b"\x02\x01" + os.urandom(40))


def _le32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _undecodable_chunk(p: Path) -> None:
    """A Blosc header of the right sizes (24 bytes in, 40 stored; lz4, not a plain copy)
    over blocks that are not lz4: the sizes pass, the decode fails."""
    header = bytes([2, 1, 0x20, 4]) + _le32(24) + _le32(24) + _le32(40)
    (p / "data/img/1.0").write_bytes(header + b"\xff" * 24)


def _truncated_chunk(p: Path) -> None:
    os.truncate(p / "data/img/1.0", 30)  # of 40: numcodecs would decode 24 bytes anyway


def _short_chunk(p: Path) -> None:
    os.truncate(p / "data/img/1.0", 9)  # less than a Blosc header


def _resized_chunk(p: Path) -> None:
    """A sound Blosc frame of 12 bytes where a chunk of data/img is 24."""
    (p / "data/img/1.0").write_bytes(BLOSC.encode(np.zeros(3, np.float32)))


HOSTILE = {
    "no-episode-ends": (dict(ends=None), None, r"no meta/episode_ends"),
    "no-meta": (dict(), _no_meta, r"no 'meta' group"),
    "no-data": (dict(), _no_data, r"no 'data' group"),
    "not-increasing": (dict(ends=(2, 2, 6)), None, r"not increasing: episode 1 ends at row 2"),
    "decreasing": (dict(ends=(4, 3, 6)), None, r"not increasing: episode 1 ends at row 3"),
    "zero-first": (dict(ends=(0, 3, 6)), None, r"not increasing: episode 0"),
    "negative": (dict(ends=(-1, 3, 6)), None, r"episode 0 ends at row -1, which is negative"),
    "float-ends": (dict(ends=(2.0, 5.0, 6.0)), None, r"must hold integers"),
    "overrun": (dict(ends=(2, 5, 8)), None, r"overruns data/img: episode 2 ends at row 8"),
    "underrun": (dict(ends=(2, 5)), None, r"data/img has 6 rows.*episode \(1\) ends at row 5"),
    "short-key": (
        dict(rows={"img": 6, "state": 5}),
        None,
        r"overruns data/state: episode 2 ends at row 6, but data/state has 5 rows",
    ),
    "long-key": (dict(rows={"img": 6, "state": 8}), None, r"data/state has 8 rows"),
    "corrupted-chunk": (
        dict(),
        _corrupt_chunk,
        r"data/img chunk 1\.0 \(rows 2\.\.3, episode 1\) is damaged: it holds 42 bytes",
    ),
    "undecodable-chunk": (
        dict(),
        _undecodable_chunk,
        r"data/img rows 2\.\.3 \(episode 1\) cannot be read: the chunk is damaged",
    ),
    "truncated-chunk": (
        dict(),
        _truncated_chunk,
        r"data/img chunk 1\.0 \(rows 2\.\.3, episode 1\) is damaged: it holds 30 bytes, "
        r"but its Blosc header says 40 \(a truncated",
    ),
    "short-chunk": (
        dict(),
        _short_chunk,
        r"data/img chunk 1\.0 .*it holds 9 bytes, fewer than a Blosc header's 16",
    ),
    "resized-chunk": (
        dict(),
        _resized_chunk,
        r"data/img chunk 1\.0 .*decompresses to 12 bytes, but a chunk of this array is 24",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_folder_rejected(tmp_path, case):
    kwargs, damage, message = HOSTILE[case]
    source = _small(tmp_path / "bad.zarr", **kwargs)
    if damage is not None:
        damage(source)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DatasetFormatError, match=message) as info:
        import_zarr(source, out / "s.h5", progress=False)
    assert str(source) in str(info.value)
    assert _leftovers(out, set()) == []


@pytest.mark.parametrize("case", ["corrupted-chunk", "truncated-chunk", "overrun", "no-data"])
def test_hostile_zip_rejected(tmp_path, case):
    kwargs, damage, message = HOSTILE[case]
    folder = _small(tmp_path / "bad.zarr", **kwargs)
    if damage is not None:
        damage(folder)
    source = tmp_path / "bad.zarr.zip"
    with zipfile.ZipFile(source, "w") as zf:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(folder).as_posix())
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DatasetFormatError, match=message) as info:
        import_zarr(source, out / "s.h5", progress=False)
    assert str(source) in str(info.value)
    assert _leftovers(out, set()) == []


# ---------------------------------------------------------------- damaged and absent chunks
def _rezip(source: Path, dest: Path, edit) -> Path:
    """``source`` zip written again to ``dest``, each entry's bytes through ``edit(name,
    data)`` (None drops the entry)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(dest, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
    return dest


@pytest.mark.parametrize("where", ["folder", "zip"])
def test_truncated_blosc_chunk_refused(tmp_path, where):
    """numcodecs' Blosc decodes a truncated chunk into the header's full size, the rest
    uninitialised memory; the header's sizes are checked against the stored length."""
    if where == "folder":
        source = tmp_path / "x.zarr"
        shutil.copytree(FOLDER, source)
        os.truncate(source / "data/img/1.0.0.0", 50)
    else:
        source = _rezip(
            ZIPPED,
            tmp_path / "x.zarr.zip",
            lambda name, data: data[:50] if name == "data/img/1.0.0.0" else data,
        )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DatasetFormatError) as info:
        import_zarr(source, out / "s.h5", progress=False)
    message = str(info.value)
    assert message.startswith(f"{source}: data/img chunk 1.0.0.0 (rows 7..13, episode 1)")
    assert "it holds 50 bytes, but its Blosc header says" in message
    assert _leftovers(out, set()) == []


def test_truncated_episode_ends_chunk_refused(tmp_path):
    source = _small(tmp_path / "x.zarr")
    ends = source / "meta/episode_ends/0"
    os.truncate(ends, ends.stat().st_size - 1)  # zarr 3's default v2 compressor: Blosc
    with pytest.raises(DatasetFormatError, match=r"meta/episode_ends chunk 0 .*is damaged"):
        import_zarr(source, tmp_path / "s.h5", progress=False)
    assert not (tmp_path / "s.h5").exists()


@pytest.mark.parametrize("where", ["folder", "zip"])
def test_absent_chunk_warns_and_reads_fill_value(tmp_path, expected, where):
    """zarr 2 (diffusion-policy's writer) stores every chunk: one not stored is read as the
    fill value, and warned about."""
    if where == "folder":
        source = tmp_path / "x.zarr"
        shutil.copytree(FOLDER, source)
        (source / "data/img/1.0.0.0").unlink()
    else:
        source = _rezip(
            ZIPPED,
            tmp_path / "x.zarr.zip",
            lambda name, data: None if name == "data/img/1.0.0.0" else data,
        )
    with pytest.warns(UserWarning) as seen:
        dest = import_zarr(source, tmp_path / "s.h5", progress=False)
    messages = [str(w.message) for w in seen]
    assert messages == [
        f"{source}: data/img: 1 of 4 chunks are not stored and read as the fill value (0), "
        "the first chunk 1.0.0.0 (rows 7..13, episode 1); zarr 2 (diffusion-policy's "
        "writer) stores every chunk, so these may be lost"
    ]
    with TrajectoryStore(dest) as store:
        img = store.read_column("img", 0, store.num_rows)
    want = expected["data/img"].copy()
    want[7:14] = 0
    assert np.array_equal(img, want)


@pytest.mark.parametrize("fmt", [2, 3])
def test_chunks_zarr3_leaves_out_do_not_warn(tmp_path, fmt):
    """zarr 3 stores no chunk that holds only the fill value (in v2 stores too)."""
    root = zarr.open_group(store=LocalStore(tmp_path / "x.zarr"), mode="w", zarr_format=fmt)
    x = root.create_group("data").create_array(
        "x", shape=(6, 2), chunks=(2, 2), dtype=np.float32, fill_value=0
    )
    x[:] = np.array([[1, 2], [3, 4], [0, 0], [0, 0], [5, 6], [7, 8]], np.float32)
    root.create_group("meta").create_array("episode_ends", data=np.array([3, 6]))
    chunk = "data/x/1.0" if fmt == 2 else "data/x/c/1/0"
    assert not (tmp_path / "x.zarr" / chunk).exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = import_zarr(tmp_path / "x.zarr", tmp_path / "s.h5", progress=False)
    with TrajectoryStore(store) as s:
        assert np.array_equal(s.read_column("x", 0, 6), x[:])


def test_unsupported_dtype_and_not_zarr(tmp_path):
    root = zarr.open_group(store=LocalStore(tmp_path / "c.zarr"), mode="w", zarr_format=2)
    root.create_group("data").create_array("z", shape=(2,), dtype=np.complex64)
    root.create_group("meta").create_array("episode_ends", data=np.array([2]))
    with pytest.raises(DatasetFormatError, match=r"data/z cannot be a column"):
        import_zarr(tmp_path / "c.zarr", tmp_path / "s.h5", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="not a readable zarr group"):
        import_zarr(tmp_path / "empty", tmp_path / "s.h5", progress=False)
    (tmp_path / "junk.zip").write_bytes(b"not a zip at all")
    with pytest.raises(DatasetFormatError, match="neither a zarr folder nor a zip"):
        import_zarr(tmp_path / "junk.zip", tmp_path / "s.h5", progress=False)
    assert not (tmp_path / "s.h5").exists()


def test_zip_of_a_zarr_folder(tmp_path, expected):
    """A zip of a folder holding the .zarr (as datasets are often shipped) imports too."""
    source = tmp_path / "pusht.zip"
    with zipfile.ZipFile(source, "w") as zf:
        for f in sorted(FOLDER.rglob("*")):
            if f.is_file():
                zf.write(f, "pusht/" + f.relative_to(FIXTURES).as_posix())
    with TrajectoryStore(import_zarr(source, tmp_path / "s.h5", progress=False)) as s:
        assert np.array_equal(s.read_column("img", 0, s.num_rows), expected["data/img"])


# ---------------------------------------------------------------- destinations
def test_failed_runs_leave_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(zarr_import, "_write_slabs", boom)
    with pytest.raises(RuntimeError, match="half-way"):
        import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    assert _leftovers(tmp_path, set()) == []
    monkeypatch.undo()
    store = import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    monkeypatch.setattr(zarr_export, "_copy_rows", boom)
    for name in ("o.zarr", "o.zarr.zip"):
        with pytest.raises(RuntimeError, match="half-way"):
            export_zarr(store, tmp_path / name, progress=False)
    assert _leftovers(tmp_path, set()) == ["s.h5"]


def test_destinations_checked(tmp_path):
    store = import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    with pytest.raises(DestinationExistsError):
        import_zarr(FOLDER, store, progress=False)
    import_zarr(ZIPPED, store, overwrite=True, progress=False)
    out = export_zarr(store, tmp_path / "o.zarr", progress=False)
    with pytest.raises(DestinationExistsError):
        export_zarr(store, out, progress=False)
    export_zarr(store, out, overwrite=True, progress=False)  # a zarr folder: replaced
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationError, match="not a zarr folder"):
        export_zarr(store, precious, overwrite=True, progress=False)
    other = tmp_path / "photos.zip"
    other.write_bytes(b"not a zip")
    with pytest.raises(DestinationError, match="not a zip"):
        export_zarr(store, other, overwrite=True, progress=False)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert other.read_bytes() == b"not a zip"
    assert _leftovers(tmp_path, set()) == ["o.zarr", "photos.zip", "precious", "s.h5"]


# ---------------------------------------------------------------- zarr 2 reads our export
@pytest.mark.skipif(
    not ZARR2.exists(), reason=f"no zarr 2 venv at {ZARR2} (bash tests/formats/zarr2_venv.sh)"
)
@pytest.mark.parametrize("name", ["out.zarr", "out.zarr.zip"])
def test_zarr2_reads_export(tmp_path, expected, name):
    store = import_zarr(FOLDER, tmp_path / "s.h5", progress=False)
    stores = {"pusht": export_zarr(store, tmp_path / f"pusht-{name}", progress=False)}
    stores["store"] = export_zarr(_store(tmp_path / "t.h5"), tmp_path / name, progress=False)
    seen = {}
    for key, path in stores.items():
        result = subprocess.run(
            [str(ZARR2), str(HERE / "make_zarr_fixture.py"), "--check", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        seen[key] = json.loads(result.stdout)
    arrays = seen["pusht"]["arrays"]
    assert sorted(arrays) == sorted(expected)
    for key, want in expected.items():
        got = arrays[key]
        value = np.frombuffer(_b64(got["b64"]), dtype=got["dtype"]).reshape(got["shape"])
        assert got["dtype"] == want.dtype.str and np.array_equal(value, want), key
    assert arrays["data/img"]["compressor"] == BLOSC.get_config()
    assert arrays["data/img"]["chunks"] == [7, 32, 32, 3]
    other = seen["store"]
    assert other["arrays"]["meta/episode_ends"]["shape"] == [4]
    assert "data/next.obs" in other["arrays"]
    assert other["groups"][""]["torchstore"]["env_id"] == "Pendulum-v1"


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)
