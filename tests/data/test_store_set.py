"""StoreSet: shards written by separate processes, read as one store while they grow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchstore.data.store.store_set as store_set
from torchstore.cli import main
from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.file.manifest import Manifest
from torchstore.data.file.writer import build_store_file
from torchstore.data.store.store_set import StoreSet, find_shards, open_store
from torchstore.data.store.summary import summarize
from torchstore.data.store.verify import verify_store
from torchstore.errors import (
    ColumnError,
    EpisodeError,
    IntegrityError,
    RowIndexError,
    StoreFormatError,
)
from torchstore.io.hdf5.files import create_atomically, open_for_append
from torchstore.io.hdf5.writer_lock import WriterLock

COLUMNS = [
    ColumnSpec("obs", torch.float32, (3,)),
    ColumnSpec("pixels", torch.float32, (2,), quantize=Quantize(0.0, 1.0)),
    ColumnSpec("done", torch.bool),
]


def _episode(shard: int, ep: int, n: int) -> dict[str, np.ndarray]:
    """Rows that name their shard, episode and step."""
    obs = np.stack([np.full(n, shard), np.full(n, ep), np.arange(n)], 1).astype(np.float32)
    return {
        "obs": obs,
        "pixels": np.full((n, 2), (shard % 5) / 4, np.float32),
        "done": np.arange(n) == n - 1,
    }


def _write(path, shard: int, lengths) -> None:
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for ep, n in enumerate(lengths):
            w.add_episode(_episode(shard, ep, n), metadata={"shard": shard, "ep": ep})


WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.data.test_store_set import COLUMNS, _episode
    from torchstore.data import TrajectoryStoreWriter
    path, shard, episodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for ep in range(episodes):
            w.add_episode(_episode(shard, ep, 2 + ep % 4), metadata={{"shard": shard, "ep": ep}})
            print(ep, flush=True)
            time.sleep(float(sys.argv[4]))
    """
).format(root=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _spawn(path, shard: int, episodes: int, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(shard), str(episodes), str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check_episodes(shards: StoreSet) -> dict[int, int]:
    """Every episode of the set holds what its writer wrote; returns episodes per shard id."""
    seen: dict[int, int] = {}
    for e in range(shards.num_episodes):
        ep = shards.episode(e)
        meta = shards.episode_metadata(e)
        shard, number = meta["shard"], meta["ep"]
        expected = _episode(shard, number, 2 + number % 4)
        np.testing.assert_array_equal(ep["obs"].numpy(), expected["obs"])
        np.testing.assert_array_equal(ep["done"].numpy(), expected["done"])
        assert number == seen.get(shard, 0), "a shard's episodes come in commit order"
        seen[shard] = number + 1
    return seen


def test_reader_follows_writer_processes_and_new_shards(tmp_path):
    """Three writer processes, each its own shard, one started late: a reader refreshing
    all along sees every committed episode exactly, in order, and picks up the new shard."""
    first = [_spawn(tmp_path / f"collector-{k}.h5", k, 40, 0.005) for k in range(2)]
    deadline = time.monotonic() + 120
    while len(find_shards(tmp_path)) < 2:
        assert time.monotonic() < deadline, "the writers never created their shards"
        time.sleep(0.02)
    late = None
    with StoreSet(tmp_path) as shards:
        refreshes = 0
        while True:
            refreshes += shards.refresh()
            seen = _check_episodes(shards)
            assert shards.episodes.num_rows == len(shards)
            if late is None and sum(seen.values()) >= 10:
                late = _spawn(tmp_path / "collector-2.h5", 2, 15)
            procs = first + ([late] if late else [])
            if late is not None and all(p.poll() is not None for p in procs):
                shards.refresh()
                break
            assert time.monotonic() < deadline, "the writers did not finish"
            time.sleep(0.01)
        for p in procs:
            out, err = p.communicate()
            assert p.returncode == 0, err
        assert _check_episodes(shards) == {0: 40, 1: 40, 2: 15}
        assert len(shards.shards) == 3 and refreshes >= 2
        whole = shards.read_slab(0, len(shards))
        assert torch.equal(
            whole["obs"], torch.cat([s.read_slab(0, len(s))["obs"] for s in shards.shards])
        )


def test_a_shard_is_not_opened_before_its_writer_opens_it(tmp_path, monkeypatch):
    """A writer renames its new file into place, then opens it for SWMR writing. A set that
    opened the file in between would hold HDF5's file lock and keep the writer out, so it
    leaves the shard alone until the writer has it open."""
    _write(tmp_path / "a.h5", 0, [2])
    path = tmp_path / "b.h5"
    lock = WriterLock.acquire(path)  # a writer of b.h5, between its rename and its open
    create_atomically(path, lambda f: build_store_file(f, Manifest.new(COLUMNS)))
    monkeypatch.setattr(store_set, "_WRITER_OPEN_WAIT_S", 0.05)
    with StoreSet(tmp_path) as shards:
        assert [s.path.name for s in shards.shards] == ["a.h5"]
        assert not shards.refresh() and len(shards.shards) == 1
        f = open_for_append(path, lock=lock)  # the writer gets in
        try:
            assert shards.refresh() and [s.path.name for s in shards.shards] == ["a.h5", "b.h5"]
        finally:
            f.close()
            lock.release()


def test_killed_writer_loses_nothing_committed(tmp_path):
    """SIGKILL one writer mid-run: the set opens and holds every episode it committed."""
    done = _spawn(tmp_path / "a.h5", 0, 12)
    killed = _spawn(tmp_path / "b.h5", 1, 10_000, 0.002)
    committed = 0
    for line in killed.stdout:
        committed = int(line) + 1
        if committed >= 20:
            break
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    done.communicate()
    assert done.returncode == 0
    with StoreSet(tmp_path) as shards:
        seen = _check_episodes(shards)
        assert seen[0] == 12 and seen[1] >= committed  # printed only after commit
    assert verify_store(tmp_path, progress=False).ok


# hypothesis: reads across shard edges are the concatenation of the shards' reads
_SHARDS = st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=4), min_size=1, max_size=4)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=_SHARDS, data=st.data())
def test_reads_across_shard_edges_equal_the_concatenation(tmp_path_factory, layout, data):
    folder = tmp_path_factory.mktemp("set")
    for k, lengths in enumerate(layout):
        _write(folder / f"s{k}.h5", k, lengths)
    with StoreSet(folder) as shards:
        parts = [s.read_slab(0, len(s)) for s in shards.shards]
        whole = torch.cat(parts)
        raw = torch.cat([s.read_slab(0, len(s), raw=True) for s in shards.shards])
        n = len(shards)
        assert n == sum(map(sum, layout)) and shards.num_episodes == sum(map(len, layout))
        start = data.draw(st.integers(0, n))
        stop = data.draw(st.integers(start, n))
        got = shards.read_slab(start, stop)
        assert (got == whole[start:stop]).all()
        assert torch.equal(
            shards.read_slab(start, stop, raw=True)["pixels"], raw[start:stop]["pixels"]
        )
        assert torch.equal(shards[start:stop]["obs"], whole["obs"][start:stop])
        if n:
            rows = data.draw(st.lists(st.integers(-n, n - 1), min_size=2, max_size=12))
            assert torch.equal(shards[rows]["obs"], whole["obs"][torch.tensor(rows)])
            size = data.draw(st.integers(1, n + 1))
            assert torch.equal(torch.cat([s["obs"] for s in shards.iter_slabs(size)]), whole["obs"])
            view = shards.resident()
            assert torch.equal(view.gather(torch.arange(n))["obs"], whole["obs"])
            assert torch.equal(
                view.episodes.lengths, torch.tensor([x for ls in layout for x in ls])
            )
            # every episode lies inside one shard and reads as that shard's episode
            episodes = [s.episode(i)["obs"] for s in shards.shards for i in range(s.num_episodes)]
            for e, expected in enumerate(episodes):
                assert torch.equal(shards.episode(e)["obs"], expected)
            window = shards.window(max(1, n // 2))
            window.refill(n - 1)
            assert torch.equal(window.gather(torch.tensor([n - 1]))["obs"], whole["obs"][-1:])


def test_list_of_shards_and_open_store(tmp_path):
    _write(tmp_path / "x.h5", 0, [3, 2])
    _write(tmp_path / "y.hdf5", 1, [4])
    (tmp_path / "notes.txt").write_text("not a shard")
    with StoreSet([tmp_path / "y.hdf5", tmp_path / "x.h5"]) as shards:
        assert [s.path.name for s in shards.shards] == ["y.hdf5", "x.h5"]  # list order is kept
        assert shards.episode_metadata(0) == {"shard": 1, "ep": 0}
        assert shards.episode_metadata(-1) == {"shard": 0, "ep": 1}
        assert shards.locate(4) == (1, 0) and shards.shard_of_episode(2) == 1
    opened = open_store(tmp_path)
    assert isinstance(opened, StoreSet) and len(opened) == 9
    opened.close()
    single = open_store(tmp_path / "x.h5")
    assert type(single) is TrajectoryStore
    single.close()


def test_bad_sets_are_clear_errors(tmp_path):
    with pytest.raises(StoreFormatError, match="no store shards"):
        StoreSet(tmp_path)
    with pytest.raises(FileNotFoundError):
        StoreSet(tmp_path / "missing")
    _write(tmp_path / "a.h5", 0, [2])
    with pytest.raises(StoreFormatError, match="listed twice"):
        StoreSet([tmp_path / "a.h5", tmp_path / "a.h5"])
    other = [ColumnSpec("obs", torch.float64, (3,)), *COLUMNS[1:]]
    with TrajectoryStoreWriter(tmp_path / "b.h5", other) as w:
        w.add_episode(
            {
                "obs": np.zeros((2, 3)),
                "pixels": np.zeros((2, 2), np.float32),
                "done": np.zeros(2, bool),
            }
        )
    with pytest.raises(ColumnError, match=r"b\.h5.*'obs'"):
        StoreSet(tmp_path)
    os.unlink(tmp_path / "b.h5")
    with StoreSet(tmp_path) as shards:
        with pytest.raises(RowIndexError):
            shards.read_slab(0, 3)
        with pytest.raises(RowIndexError):
            shards.locate(2)
        with pytest.raises(EpisodeError):
            shards.episode(1)
        with pytest.raises(RowIndexError):
            shards[5]
        # a shard with other columns appearing later is refused, the set stays as it was
        with TrajectoryStoreWriter(tmp_path / "c.h5", other) as w:
            w.add_episode(
                {
                    "obs": np.zeros((2, 3)),
                    "pixels": np.zeros((2, 2), np.float32),
                    "done": np.zeros(2, bool),
                }
            )
        with pytest.raises(ColumnError, match=r"c\.h5"):
            shards.refresh()
        assert len(shards) == 2 and len(shards.shards) == 1


def test_info_and_verify_over_a_set(tmp_path, capsys):
    # the commands run through main() in-process: the set is the point, not the process
    for k in range(3):
        _write(tmp_path / f"s{k}.h5", k, [3, 4])
    with StoreSet(tmp_path) as shards:
        info = summarize(shards)
    assert (info["rows"], info["episodes"], len(info["shards"])) == (21, 6, 3)
    capsys.readouterr()
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "shards     3" in out and "rows       21" in out
    report = verify_store(tmp_path, progress=False)
    assert report.ok and (report.rows, report.episodes) == (21, 6)
    # rot one byte of one column of the middle shard: verify names that shard
    with TrajectoryStore(tmp_path / "s1.h5") as store:
        offset = store._ds.columns["obs"].data.id.get_chunk_info(0).byte_offset
    with open(tmp_path / "s1.h5", "r+b") as f:
        f.seek(offset + 4)
        byte = f.read(1)
        f.seek(offset + 4)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify_store(tmp_path, progress=False)
    assert not report.ok and report.problems[0].startswith("s1.h5: column 'obs'")
    capsys.readouterr()
    assert main(["verify", "--no-progress", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "s1.h5" in out.out + out.err
    with StoreSet(tmp_path) as shards, pytest.raises(IntegrityError):
        shards.read_slab(0, len(shards))
