from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import xxhash
from tensordict import TensorDict

from tests.conftest import WALKER_COLUMNS, make_rows
from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.file.layout import MANIFEST_ATTR, MANIFEST_HASH_ATTR
from torchstore.errors import (
    ColumnError,
    EnvUnavailableError,
    EpisodeError,
    RowIndexError,
    StoreFormatError,
    TorchstoreError,
)

ALL_DTYPES = [
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _write(path, columns, lengths, data_seed=0, **kwargs):
    episodes = [make_rows(columns, n, data_seed + i) for i, n in enumerate(lengths)]
    with TrajectoryStoreWriter(path, columns, **kwargs) as w:
        for i, rows in enumerate(episodes):
            w.add_episode(rows, metadata={"n": i})
    return episodes


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (5, 4, 3)])
def test_every_dtype_and_shape_round_trips_exactly(tmp_path, dtype, shape):
    cols = [ColumnSpec("x", dtype, shape)]
    episodes = _write(tmp_path / "s.h5", cols, [3, 2500, 1])
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_rows == 2504 and store.num_episodes == 3
        for i, rows in enumerate(episodes):
            got = store.episode(i)["x"]
            assert got.dtype == dtype and tuple(got.shape[1:]) == shape
            assert np.array_equal(got.numpy(), rows["x"])


def test_walker_store_round_trip_nested_and_quantised(tmp_path):
    path = tmp_path / "w.h5"
    episodes = _write(
        path,
        WALKER_COLUMNS,
        [1000, 700, 1300],
        env_id="walker-walk",
        seed=3,
        metadata={"task": "walk", "nested": {"k": [1, 2]}},
    )
    with TrajectoryStore(path) as store:
        m = store.manifest
        assert (m.env_id, m.seed, m.metadata["nested"], m.num_rows, m.num_episodes) == (
            "walker-walk",
            3,
            {"k": [1, 2]},
            3000,
            3,
        )
        assert m.columns == WALKER_COLUMNS
        ep = store.episode(1)
        assert ep["next", "qpos"].shape == (700, 9)
        assert torch.equal(ep["qpos"], torch.from_numpy(episodes[1]["qpos"]))
        q = WALKER_COLUMNS[-1].quantize
        err = (ep["pixels"] - torch.from_numpy(episodes[1]["pixels"])).abs().max()
        assert ep["pixels"].dtype == torch.float32 and err <= q.step / 2 + 1e-6
        assert store.episode(1, raw=True)["pixels"].dtype == torch.uint8
        assert store.episode_metadata(2) == {"n": 2}
        slab = store.read_slab(900, 1100, columns=["reward", "next/qpos"])
        assert set(slab.keys(True, True)) == {"reward", ("next", "qpos")}
        expected = np.concatenate([episodes[0]["reward"][900:], episodes[1]["reward"][:100]])
        assert np.array_equal(slab["reward"].numpy(), expected)
        streamed = torch.cat([s["action"] for s in store.iter_slabs(777, columns=["action"])])
        assert torch.equal(
            streamed, torch.from_numpy(np.concatenate([e["action"] for e in episodes]))
        )


def test_append_in_pieces_and_tensordict_input(tmp_path):
    cols = [ColumnSpec("obs", torch.float32, (2,)), ColumnSpec("next/obs", torch.float32, (2,))]
    with TrajectoryStoreWriter(tmp_path / "s.h5", cols) as w:
        for i in range(5):
            td = TensorDict(
                {"obs": torch.full((1, 2), float(i)), "next": {"obs": torch.full((1, 2), i + 1.0)}},
                [1],
            )
            w.append(td)
        assert w.pending_rows == 5 and w.num_rows == 0
        w.end_episode()
        w.append({"obs": torch.zeros(3, 2), "next": {"obs": torch.ones(3, 2)}})
        # not committed: dropped at close
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_rows == 5 and store.num_episodes == 1
        assert store.read_slab(0, 5)["obs"][:, 0].tolist() == [0, 1, 2, 3, 4]


def test_resume_appends_with_the_same_schema(tmp_path):
    path = tmp_path / "s.h5"
    first = _write(path, WALKER_COLUMNS, [50, 60])
    with TrajectoryStoreWriter.resume(path) as w:
        assert (w.num_rows, w.num_episodes) == (110, 2)
        extra = make_rows(WALKER_COLUMNS, 70, 99)
        w.add_episode(extra)
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 3 and store.episodes.lengths.tolist() == [50, 60, 70]
        assert np.array_equal(store.episode(0)["qvel"].numpy(), first[0]["qvel"])
        assert np.array_equal(store.episode(2)["qvel"].numpy(), extra["qvel"])


# ---------------------------------------------------------------------------- bad input
@pytest.fixture
def open_writer(tmp_path):
    cols = [ColumnSpec("obs", torch.float32, (3,)), ColumnSpec("done", torch.bool)]
    w = TrajectoryStoreWriter(tmp_path / "s.h5", cols)
    w.add_episode({"obs": np.ones((4, 3), np.float32), "done": np.zeros(4, bool)})
    yield w
    w.close()
    with TrajectoryStore(tmp_path / "s.h5") as store:  # the committed episode survived every error
        assert store.num_rows == 4 and store.num_episodes == 1
        assert store.episode(0)["obs"].sum().item() == 12


@pytest.mark.parametrize(
    "rows, match",
    [
        ({"obs": np.ones((2, 3), np.float32)}, r"missing \['done'\]"),
        (
            {"obs": np.ones((2, 3), np.float32), "done": np.zeros(2, bool), "x": np.ones(2)},
            r"unknown \['x'\]",
        ),
        (
            {"obs": np.full((2, 3), 0.1), "done": np.zeros(2, bool)},
            r"column 'obs' expects float32\[3\], got float64\[3\]",
        ),
        (
            {"obs": np.ones((2, 4), np.float32), "done": np.zeros(2, bool)},
            "expects rows of shape \\[3\\]",
        ),
        (
            {"obs": np.ones((2, 3), np.float32), "done": np.zeros(3, bool)},
            "has 3 rows, other columns have 2",
        ),
        (
            {"obs": np.ones((2, 3), np.float32), "done": np.zeros(2, np.float32)},
            "column 'done' expects bool",
        ),
        ({"obs": np.ones((0, 3), np.float32), "done": np.zeros(0, bool)}, "zero rows"),
        ([1, 2, 3], "mapping of columns"),
    ],
)
def test_bad_rows_are_rejected_and_lose_nothing(open_writer, rows, match):
    with pytest.raises(ColumnError, match=match):
        open_writer.append(rows)
    assert open_writer.pending_rows == 0


def test_episode_misuse(open_writer):
    with pytest.raises(EpisodeError, match="no rows appended"):
        open_writer.end_episode()
    open_writer.append({"obs": np.ones((1, 3), np.float32), "done": np.zeros(1, bool)})
    with pytest.raises(EpisodeError, match="already appended"):
        open_writer.add_episode({"obs": np.ones((1, 3), np.float32), "done": np.zeros(1, bool)})
    with pytest.raises(EpisodeError, match="JSON-serialisable"):
        open_writer.end_episode(metadata={"x": object()})


def test_existing_file_is_not_overwritten_by_default(open_writer, tmp_path):
    with pytest.raises(FileExistsError, match="resume"):
        TrajectoryStoreWriter(tmp_path / "s.h5", [ColumnSpec("obs", torch.float32)])


def test_bad_manifest_inputs(tmp_path):
    with pytest.raises(ColumnError, match="JSON-serialisable"):
        TrajectoryStoreWriter(
            tmp_path / "a.h5", [ColumnSpec("x", torch.float32)], metadata={"t": torch.ones(1)}
        )
    with pytest.raises(ColumnError, match="seed must be an int"):
        TrajectoryStoreWriter(tmp_path / "a.h5", [ColumnSpec("x", torch.float32)], seed="1")
    assert not (tmp_path / "a.h5").exists()


def test_not_a_store(tmp_path):
    (tmp_path / "text.h5").write_text("hello, not hdf5")
    with pytest.raises(StoreFormatError, match="not an HDF5 file"):
        TrajectoryStore(tmp_path / "text.h5")
    with h5py.File(tmp_path / "foreign.h5", "w", libver="latest") as f:
        f["x"] = np.arange(3)
    with pytest.raises(StoreFormatError, match="not a torchstore store"):
        TrajectoryStore(tmp_path / "foreign.h5")
    with pytest.raises(StoreFormatError, match="not a torchstore store"):
        TrajectoryStoreWriter.resume(tmp_path / "foreign.h5")
    with h5py.File(tmp_path / "old.h5", "w") as f:  # default (old) file format
        f["x"] = np.arange(3)
    with pytest.raises(StoreFormatError, match="older format|not a torchstore"):
        TrajectoryStore(tmp_path / "old.h5")
    with pytest.raises(FileNotFoundError, match="no store at"):
        TrajectoryStore(tmp_path / "missing.h5")


def _rewrite_manifest(path, mutate):
    """Rewrite the manifest as a writer would (its checksum rewritten to match)."""
    with h5py.File(path, "a", libver="latest") as f:
        text = mutate(bytes(f.attrs[MANIFEST_ATTR]).decode()).encode()
        f.attrs[MANIFEST_ATTR] = np.bytes_(text)
        f.attrs[MANIFEST_HASH_ATTR] = np.uint64(xxhash.xxh3_64_intdigest(text))


def test_future_format_version_and_corrupt_manifest(tmp_path):
    path = tmp_path / "s.h5"
    _write(path, [ColumnSpec("x", torch.float32)], [3])
    _rewrite_manifest(path, lambda t: t.replace('"format_version": 2', '"format_version": 7'))
    with pytest.raises(
        StoreFormatError, match="format version 7.*reads up to version 3: upgrade torchstore"
    ):
        TrajectoryStore(path)
    _rewrite_manifest(path, lambda t: t[:40])
    with pytest.raises(StoreFormatError, match="manifest is not valid JSON"):
        TrajectoryStore(path)


def test_read_bounds(tmp_path):
    _write(tmp_path / "s.h5", [ColumnSpec("x", torch.float32)], [3])
    with TrajectoryStore(tmp_path / "s.h5") as store:
        for start, stop in ((2, 4), (-1, 2), (2, 1), (0, -1)):
            with pytest.raises(
                RowIndexError, match=rf"slab \[{start}, {stop}\) is outside the rows \[0, 3\)"
            ):
                store.read_slab(start, stop)
        with pytest.raises(IndexError):  # the builtin a user catches
            store.read_slab(-1, 2)
        with pytest.raises(RowIndexError, match="must be ints"):
            store.read_slab(0.5, 2)
        with pytest.raises(ColumnError, match="no column 'y'"):
            store.read_slab(0, 1, columns=["y"])
        with pytest.raises(EpisodeError, match="out of range"):
            store.episode(1)


def test_quantised_column_accepts_raw_codes(tmp_path):
    cols = [ColumnSpec("img", torch.float32, (2,), quantize=Quantize(0, 255))]
    with TrajectoryStoreWriter(tmp_path / "q.h5", cols) as w:
        w.add_episode({"img": np.array([[0, 255], [7, 9]], np.uint8)}, raw=True)
    with TrajectoryStore(tmp_path / "q.h5") as store:
        assert store.read_slab(0, 2)["img"].tolist() == [[0.0, 255.0], [7.0, 9.0]]


def test_two_readers_of_one_file_in_one_process(tmp_path):
    # HDF5's dataset refresh through one open corrupts reads through another open of the
    # same dataset ("can't insert duplicate key"); readers in a process share one handle.
    cols = [ColumnSpec("img", torch.float32, (32, 32, 3), quantize=Quantize(0, 1))]
    episodes = _write(tmp_path / "s.h5", cols, [300, 400])
    a = TrajectoryStore(tmp_path / "s.h5")
    a.read_slab(0, 10)
    b = TrajectoryStore(tmp_path / "s.h5")
    b.refresh()
    assert a.read_slab(0, 700, raw=True)["img"].shape == (700, 32, 32, 3)
    a.close()
    expected = np.concatenate([e["img"] for e in episodes])
    assert (b.read_slab(0, 700)["img"].numpy() - expected).max() <= 1 / 510 + 1e-6
    b.close()


def test_a_store_indexes_and_iterates_as_rows(tmp_path):
    cols = [ColumnSpec("x", torch.float32, (2,)), ColumnSpec("next/y", torch.int64)]
    episodes = _write(tmp_path / "s.h5", cols, [5, 3, 4])
    x = np.concatenate([e["x"] for e in episodes])
    y = np.concatenate([e["next/y"] for e in episodes])
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert len(store) == 12 == store.num_rows
        row = store[7]
        assert row.batch_size == torch.Size([]) and np.array_equal(row["x"].numpy(), x[7])
        assert int(store[-1]["next", "y"]) == y[-1] and np.array_equal(
            store[-12]["x"].numpy(), x[0]
        )
        assert np.array_equal(store[2:9]["x"].numpy(), x[2:9])
        assert np.array_equal(store[1:11:3]["x"].numpy(), x[1:11:3])
        assert np.array_equal(store[::-2]["next", "y"].numpy(), y[::-2])
        assert store[9:3].batch_size == torch.Size([0])
        picks = [11, 0, 5, 5, -2, 6]
        assert np.array_equal(store[picks]["x"].numpy(), x[picks])
        assert np.array_equal(store[torch.tensor(picks)]["next", "y"].numpy(), y[picks])
        mask = torch.zeros(12, dtype=torch.bool)
        mask[[1, 4]] = True
        assert np.array_equal(store[mask]["x"].numpy(), x[[1, 4]])
        assert store[[]].batch_size == torch.Size([0])
        rows = list(store)
        assert len(rows) == len(store)
        assert np.array_equal(np.stack([r["x"].numpy() for r in rows]), x)
        assert [e.batch_size[0] for e in store.iter_episodes()] == [5, 3, 4]
        for bad in (12, -13):
            with pytest.raises(
                RowIndexError, match=f"row {bad} is out of range for .* which holds 12 rows"
            ):
                store[bad]
        with pytest.raises(IndexError, match="row 40 is out of range"):
            store[[1, 40]]
        with pytest.raises(RowIndexError, match="1-D integer"):
            store[torch.tensor([0.5])]
        with pytest.raises(RowIndexError, match="boolean mask"):
            store[torch.ones(3, dtype=torch.bool)]
        with pytest.raises(RowIndexError, match="cannot index"):
            store["x"]


def test_make_env_builds_the_recorded_environment(tmp_path):
    gymnasium = pytest.importorskip("gymnasium")
    _write(tmp_path / "env.h5", [ColumnSpec("x", torch.float32)], [2], env_id="CartPole-v1")
    with TrajectoryStore(tmp_path / "env.h5") as store:
        env = store.make_env(max_episode_steps=7)
        try:
            assert isinstance(env, gymnasium.Env)
            assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 7
        finally:
            env.close()
    _write(tmp_path / "none.h5", [ColumnSpec("x", torch.float32)], [2])
    with TrajectoryStore(tmp_path / "none.h5") as store:
        with pytest.raises(EnvUnavailableError, match="records no env id; pass env_id="):
            store.make_env()
    _write(tmp_path / "odd.h5", [ColumnSpec("x", torch.float32)], [2], env_id="NoSuchEnv-v9")
    with TrajectoryStore(tmp_path / "odd.h5") as store:
        with pytest.raises(EnvUnavailableError, match="gymnasium cannot make 'NoSuchEnv-v9'"):
            store.make_env()


def test_make_env_without_gymnasium_says_what_to_install(tmp_path, monkeypatch):
    import sys

    _write(tmp_path / "env.h5", [ColumnSpec("x", torch.float32)], [2], env_id="CartPole-v1")
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium now fails
    with TrajectoryStore(tmp_path / "env.h5") as store:
        with pytest.raises(EnvUnavailableError, match="pip install gymnasium"):
            store.make_env()


def _format1_store(tmp_path):
    """A store written by torchstore's format 1 (no manifest or commit-record hash; the
    manifest a variable-length heap string): three episodes of 5, 6 and 7 rows."""
    import gzip
    from pathlib import Path

    path = tmp_path / "format1.h5"
    path.write_bytes(
        gzip.decompress((Path(__file__).parent / "fixtures" / "format1.h5.gz").read_bytes())
    )
    return path


def test_stores_of_the_previous_format_still_open_and_resume(tmp_path):
    path = _format1_store(tmp_path)
    with TrajectoryStore(path) as store:
        assert store.manifest.format_version == 1 and store.manifest.env_id == "CartPole-v1"
        assert store.episodes.lengths.tolist() == [5, 6, 7]
        assert store.episode_metadata(2) == {"i": 2}
        first = store.read_slab(0, store.num_rows)
        assert first["obs"][5].tolist() == [1.0, 2.0, 3.0]
        assert float(first["pix"][-1, -1]) == 1.0
    with TrajectoryStoreWriter.resume(path) as w:
        w.add_episode(first[:4], metadata={"i": 3})
    with TrajectoryStore(path) as store:
        assert store.manifest.format_version == 1  # appending keeps the store's format
        assert (store.read_slab(0, len(first)) == first).all()
        assert store.num_rows == len(first) + 4 and store.episode_metadata(3) == {"i": 3}


def test_deeply_nested_or_malformed_manifests_are_format_errors(tmp_path):
    path = tmp_path / "s.h5"
    _write(path, [ColumnSpec("x", torch.float32)], [3])
    deep = (
        '{"format": "torchstore.trajectory", "format_version": 2, "columns": [], "metadata": '
        + "[" * 100_000
        + "]" * 100_000
        + "}"
    )
    _rewrite_manifest(path, lambda t: deep)
    with pytest.raises(StoreFormatError, match="not valid JSON"):
        TrajectoryStore(path)
    for mutate in (
        lambda t: t.replace('"shape": []', '"shape": "abc"'),
        lambda t: t.replace('"shape": []', '"shape": ["a"]'),
        lambda t: t.replace('"dtype": "float32"', '"dtype": [1]'),
        lambda t: t.replace('"columns": [', '"columns": ["abc", '),
        lambda t: t.replace('"quantize": null', '"quantize": {"low": "x", "high": 1}'),
        lambda t: t.replace('"env_id": null', '"env_id": 5'),
        lambda t: t.replace('"metadata": {}', '"metadata": [1]'),
        lambda t: "[1, 2]",
    ):
        _write(path, [ColumnSpec("x", torch.float32)], [3], overwrite=True)
        _rewrite_manifest(path, mutate)
        with pytest.raises(StoreFormatError):
            TrajectoryStore(path)
        with pytest.raises(StoreFormatError):
            TrajectoryStoreWriter.resume(path)


def test_deeply_nested_metadata_is_refused_when_written(tmp_path):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ColumnError, match="JSON-serialisable"):
        TrajectoryStoreWriter(
            tmp_path / "a.h5", [ColumnSpec("x", torch.float32)], metadata={"d": deep}
        )
    with TrajectoryStoreWriter(tmp_path / "b.h5", [ColumnSpec("x", torch.float32)]) as w:
        w.append({"x": np.zeros(2, np.float32)})
        with pytest.raises(EpisodeError, match="JSON-serialisable"):
            w.end_episode({"d": deep})
        w.end_episode({"ok": 1})
    with TrajectoryStore(tmp_path / "b.h5") as store:
        assert store.episode_metadata(0) == {"ok": 1}
    assert issubclass(EnvUnavailableError, TorchstoreError)


def test_expected_rows_sizes_a_small_store_and_it_still_grows_past_them(tmp_path):
    """HDF5 allocates a chunk whole: at the default 128 KiB a table, a store of 1,500 small
    rows is mostly empty chunks. With ``expected_rows`` its chunks fit its rows; resumed, it
    takes many times more rows, read back and verified like any store."""
    from torchstore.data.store.verify import verify_store

    columns = [ColumnSpec("state", torch.float32, (14,)), ColumnSpec("done", torch.bool)]
    rng = np.random.default_rng(0)
    episodes = [
        {"state": rng.standard_normal((150, 14), dtype=np.float32), "done": np.arange(150) == 149}
        for _ in range(50)
    ]
    sizes = {}
    for expected in (None, 1500):
        path = tmp_path / f"{expected}.h5"
        with TrajectoryStoreWriter(path, columns, expected_rows=expected) as w:
            for ep in episodes[:10]:
                w.add_episode(ep)
        sizes[expected] = path.stat().st_size
    assert sizes[1500] < 0.6 * sizes[None], sizes
    path = tmp_path / "1500.h5"
    with TrajectoryStoreWriter.resume(path) as w:
        for ep in episodes[10:]:
            w.add_episode(ep)
    with TrajectoryStore(path) as store:
        assert store.num_rows == 50 * 150
        got = np.asarray(store.read_column("state", 0, store.num_rows))
    assert np.array_equal(got, np.concatenate([ep["state"] for ep in episodes]))
    assert verify_store(path, progress=False).ok


@pytest.mark.parametrize("bad", [-1, 1.5, True, "100"])
def test_expected_rows_must_be_a_whole_number(tmp_path, bad):
    with pytest.raises(ValueError, match="expected_rows"):
        TrajectoryStoreWriter(
            tmp_path / "s.h5", [ColumnSpec("x", torch.float32)], expected_rows=bad
        )
    assert not (tmp_path / "s.h5").exists()
