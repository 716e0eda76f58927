"""A store opened by URL (loopback HTTP with Range, the loopback Hub through huggingface_hub):
the same rows as the local file, a few pages fetched at open, pins, faults and secrets."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch

from tests.remote.conftest import _isolated_env, file_server, hub, hub_server  # noqa: F401
from torchstore import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.store.facts import StoreFacts
from torchstore.data.store.summary import summarize
from torchstore.data.store.verify import verify_store
from torchstore.errors import (
    IntegrityError,
    RemoteChangedError,
    RemoteNotFoundError,
    StoreFormatError,
    UnsupportedError,
)

COLUMNS = [
    ColumnSpec("obs", torch.float32, (5,)),
    ColumnSpec("action", torch.float32, (2,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("pixels", torch.float32, (8, 8, 3), quantize=Quantize(0.0, 1.0)),
    ColumnSpec("step", torch.int64),
]


def _rows(spec: ColumnSpec, n: int, g: torch.Generator) -> torch.Tensor:
    if spec.dtype == torch.bool:
        return torch.arange(n) == n - 1
    if spec.dtype == torch.int64:
        return torch.arange(n)
    return torch.rand(n, *spec.shape, generator=g)


def _write(path, episodes: int, rows: int = 50, columns=COLUMNS) -> None:
    g = torch.Generator().manual_seed(episodes)
    with TrajectoryStoreWriter(path, columns, env_id="Pendulum-v1", seed=3, overwrite=True) as w:
        for e in range(episodes):
            n = rows + e % 7
            w.append({spec.name: _rows(spec, n, g) for spec in columns})
            w.end_episode(metadata={"episode": e})


@pytest.fixture
def served_store(file_server, tmp_path):  # noqa: F811
    path = file_server.root / "runs.h5"
    _write(path, 40)
    return file_server, f"{file_server.url}/runs.h5", path


def _same_store(remote: TrajectoryStore, local: TrajectoryStore) -> None:
    assert len(remote) == len(local) and remote.num_episodes == local.num_episodes
    assert remote.manifest == local.manifest
    a, b = remote.read_slab(0, len(local)), local.read_slab(0, len(local))
    for spec in local.columns:
        key = tuple(spec.name.split("/"))
        assert torch.equal(a[key], b[key]), spec.name
    assert torch.equal(remote.episodes.lengths, local.episodes.lengths)
    assert remote.episode_metadata(7) == local.episode_metadata(7) == {"episode": 7}


def test_a_store_opened_by_https_url_reads_every_column_as_the_local_file(served_store):
    server, url, path = served_store
    with TrajectoryStore(url) as remote, TrajectoryStore(path) as local:
        assert remote.path == url and repr(remote).startswith(f"TrajectoryStore('{url}'")
        _same_store(remote, local)
        assert remote.size_on_disk() == path.stat().st_size
        again = pickle.loads(pickle.dumps(remote))  # a worker reopens it by its URL
        assert again.path == url and torch.equal(again[5]["obs"], local[5]["obs"])
        again.close()


def test_forked_dataloader_workers_read_a_url_store(served_store):
    from _store_rows import StoreRows
    from torch.utils.data import DataLoader

    server, url, path = served_store
    with TrajectoryStore(url) as remote, TrajectoryStore(path) as local:
        remote.read_slab(0, 10)  # the parent has fetched, with its connections and threads
        loader = DataLoader(
            StoreRows(remote),
            batch_size=100,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=120,
        )
        batches = list(loader)
        assert torch.equal(
            torch.cat([b["obs"] for b in batches]), local.read_slab(0, len(local))["obs"]
        )
    assert len({int(p) for b in batches for p in b["pid"]}) == 2


def test_residency_and_windows_read_a_url_store(served_store):
    server, url, path = served_store
    with TrajectoryStore(url) as remote, TrajectoryStore(path) as local:
        rows = torch.arange(0, len(local), 7)
        a, b = remote.resident().gather(rows), local.resident().gather(rows)
        assert torch.equal(a["obs"], b["obs"]) and torch.equal(a["pixels"], b["pixels"])
        win, ref = remote.window(500), local.window(500)
        win.refill(900), ref.refill(900)
        rows = torch.arange(win.start, win.stop, 3)
        assert torch.equal(win.gather(rows)["action"], ref.gather(rows)["action"])


def test_info_and_verify_take_a_url(served_store):
    server, url, path = served_store
    with StoreFacts(url) as facts:
        info = summarize(facts)
    assert info["path"] == url and info["episodes"] == 40 and info["size_on_disk"] > 0
    report = verify_store(url)
    assert (
        str(report.path) == url
        and not report.problems
        and report.rows == len(TrajectoryStore(path))
    )


def test_the_cli_info_and_verify_take_a_url(served_store, capsys):
    from torchstore.cli.main import main

    server, url, path = served_store
    assert main(["info", "--json", url]) == 0
    assert f'"path": "{url}"' in capsys.readouterr().out
    assert main(["verify", "--no-progress", url]) == 0
    assert capsys.readouterr().out.startswith(f"{url}: OK (6 columns")
    with TrajectoryStore(path) as local:
        offset = local._ds.columns["action"].data.id.get_chunk_info(0).byte_offset
    server.flip_byte["runs.h5"] = offset + 3  # a new ETag: a new version, fetched anew
    assert main(["verify", "--no-progress", url]) == 1
    assert "DAMAGED: column 'action' rows 0.." in capsys.readouterr().err


def test_opening_fetches_under_one_percent_of_a_store_of_many_episodes(file_server, tmp_path):  # noqa: F811
    path = file_server.root / "many.h5"
    _write(path, 3000, rows=40, columns=COLUMNS[:3] + [ColumnSpec("big", torch.float32, (64,))])
    size = path.stat().st_size
    store = TrajectoryStore(f"{file_server.url}/many.h5", cache=False)
    fetched = store._file._torchstore_fileobj.bytes_fetched
    assert store.num_episodes == 3000
    assert fetched < 0.01 * size, (fetched, size)
    assert file_server.body_bytes["many.h5"] == fetched + 1  # and the open's 1-byte probe
    store.close()


def test_a_second_open_comes_from_the_cache(served_store, tmp_path):
    server, url, path = served_store
    with TrajectoryStore(url, cache="64MiB") as s:
        first = s.read_slab(0, len(s))
    gets = len(server.gets("runs.h5"))
    with TrajectoryStore(url, cache="64MiB") as s:
        again = s.read_slab(0, len(s))
        assert s._file._torchstore_fileobj.bytes_fetched == 0
    assert torch.equal(first["obs"], again["obs"])
    assert [r["range"] for r in server.gets("runs.h5")[gets:]] == ["bytes=0-0"]  # the pin


def test_a_flipped_byte_on_the_server_is_caught_by_the_block_checksums(served_store):
    server, url, path = served_store
    with TrajectoryStore(path) as local:
        offset = local._ds.columns["obs"].data.id.get_chunk_info(0).byte_offset
    server.flip_byte["runs.h5"] = offset + 17
    with TrajectoryStore(url, cache=False) as remote:
        with pytest.raises(IntegrityError, match="checksum"):
            remote.read_slab(0, 10)


def test_a_store_changed_after_open_is_refused_not_mixed(served_store, tmp_path):
    server, url, path = served_store
    remote = TrajectoryStore(url, cache=False)
    shutil.copy(path, tmp_path / "old.h5")
    _write(path, 41)  # republished: a new ETag
    with pytest.raises(RemoteChangedError, match=r"runs\.h5 changed since it was opened"):
        remote.read_slab(0, len(remote))
    remote.close()


def test_faults_during_reads_are_retried(served_store):
    server, url, path = served_store
    with TrajectoryStore(url, cache=False) as remote, TrajectoryStore(path) as local:
        server.status_for["runs.h5"] = [503, 500]
        server.cut_after["runs.h5"] = 100
        server.body_delta["runs.h5"] = -3
        _same_store(remote, local)


def test_writers_refuse_a_url(served_store):
    server, url, path = served_store
    with pytest.raises(UnsupportedError, match="writers are local; push publishes a store"):
        TrajectoryStoreWriter(url, COLUMNS)
    with pytest.raises(UnsupportedError, match="writers are local; push publishes a store"):
        TrajectoryStoreWriter.resume(url)


def test_a_missing_store_url_names_it_without_the_token(file_server, monkeypatch):  # noqa: F811
    secret = "tok-3b9c1e"
    monkeypatch.setenv("TORCHSTORE_HTTP_TOKEN", secret)
    with pytest.raises(RemoteNotFoundError, match=r"/data/nope\.h5") as e:
        TrajectoryStore(f"{file_server.url}/nope.h5?key={secret}")
    assert secret not in str(e.value)


# ----------------------------------------------------------------- the Hub
def _publish(hub, tmp_path, name="ds", episodes=30):  # noqa: F811
    from huggingface_hub import HfApi

    path = tmp_path / f"{name}.h5"
    _write(path, episodes)
    api = HfApi(endpoint=hub.endpoint)
    repo = f"{hub.namespace}/{name}"
    api.create_repo(repo, repo_type="dataset")
    info = api.upload_file(
        path_or_fileobj=str(path), path_in_repo="data/runs.h5", repo_id=repo, repo_type="dataset"
    )
    return api, repo, path, info.oid


def test_a_store_on_the_hub_opens_in_place_and_stays_at_its_commit(hub, tmp_path):  # noqa: F811
    api, repo, path, commit = _publish(hub, tmp_path)
    url = f"hf://datasets/{repo}/data/runs.h5"
    remote = TrajectoryStore(url, cache=False)
    local = TrajectoryStore(path)
    _same_store(remote, local)
    _write(tmp_path / "next.h5", 31)
    api.upload_file(
        path_or_fileobj=str(tmp_path / "next.h5"),
        path_in_repo="data/runs.h5",
        repo_id=repo,
        repo_type="dataset",
    )
    ranged = remote._file._torchstore_fileobj
    ranged._block.memory.clear()
    before = ranged.bytes_fetched
    # fetched again from the Hub after the new commit: the bytes of the commit it opened
    assert ranged.fetch_ranges([(0, ranged.size)]) == [path.read_bytes()]
    assert ranged.bytes_fetched == before + ranged.size
    _same_store(remote, local)
    remote.close()
    local.close()
    pinned_url = f"hf://datasets/{repo}@{commit}/data/runs.h5"
    with TrajectoryStore(url) as latest, TrajectoryStore(pinned_url) as pinned:
        assert latest.num_episodes == 31 and pinned.num_episodes == 30


def test_hub_errors_name_the_file_and_never_the_token(hub, tmp_path, monkeypatch):  # noqa: F811
    api, repo, _, _ = _publish(hub, tmp_path)
    secret = "hf_" + "x" * 30
    monkeypatch.setenv("HF_TOKEN", secret)
    with pytest.raises(RemoteNotFoundError, match=r"data/missing\.h5") as e:
        TrajectoryStore(f"hf://datasets/{repo}/data/missing.h5")
    assert secret not in str(e.value)
    store = TrajectoryStore(f"hf://datasets/{repo}/data/runs.h5", cache=False)
    assert any(r.get("authorization") == f"Bearer {secret}" for r in hub.requests[-3:])
    assert secret not in repr(store) and secret not in str(store.path)
    store.close()


def test_the_window_fetches_its_coming_blocks_ahead_by_coalesced_ranges(file_server, tmp_path):  # noqa: F811
    """``ChunkReader.advise`` on a URL store fetches the chunks of the next block (plain
    columns, an AV1 column's packet rows and the packet bytes they point at) into the cache
    in the background: the refill's read of that block then sends no request, and reads the
    plain chunks from those bytes (verified) as it reads a local file's; and a windowed
    DataModule over the URL gives the local file's batches."""
    import numpy as np

    from torchstore.data.residency.block_read import ChunkReader
    from torchstore.io.frames.codec import FrameCodec
    from torchstore.lightning import DemonstrationDataModule

    columns = [
        ColumnSpec("cam", torch.uint8, (24, 32, 3), codec=FrameCodec("av1", gop=4)),
        ColumnSpec("state", torch.float32, (4,)),
        ColumnSpec("action", torch.float32, (2,)),
    ]
    path = file_server.root / "cams.h5"
    g = torch.Generator().manual_seed(0)
    with TrajectoryStoreWriter(path, columns) as writer:
        for _ in range(12):
            writer.add_episode({
                "cam": torch.randint(0, 255, (40, 24, 32, 3), dtype=torch.uint8, generator=g),
                "state": torch.rand(40, 4, generator=g), "action": torch.rand(40, 2, generator=g),
            })  # fmt: skip
    url = f"{file_server.url}/cams.h5"
    with TrajectoryStore(url) as remote:
        reader = ChunkReader(remote, ["cam", "state"], lock=__import__("threading").Lock())
        assert reader._remote is not None
        reader.advise(["cam", "state"], 200, 320)
        ranged = remote._file._torchstore_fileobj
        ranged._prefetcher.shutdown(wait=True)  # the prefetches queued, all run
        ranged._prefetcher = None
        before = len(file_server.requests)
        outs = {
            "cam": np.empty((120, 24, 32, 3), np.uint8),
            "state": np.empty((120, 4), np.float32),
        }
        reader.read_block(200, 320, outs)
        assert len(file_server.requests) == before  # every byte was fetched ahead
        # the plain column was read chunk by chunk from the fetched bytes, verified
        assert reader.stats["direct_chunks"] > 0 and reader.stats["store_reads"] == 0
        with TrajectoryStore(path) as local:
            assert np.array_equal(outs["cam"], local.read_column("cam", 200, 320))
            assert np.array_equal(outs["state"], local.read_column("state", 200, 320))
        reader.close()
    batches = []
    for store in (url, path):
        dm = DemonstrationDataModule(
            store, batch_size=16, obs_keys=["cam", "state"], action_keys=["action"],
            action_horizon=3, resident="600KB", device="cpu", stats_cache=False, seed=2,
        )  # fmt: skip
        dm.setup("fit")
        it = iter(dm.train_dataloader())
        batches.append([next(it) for _ in range(20)])
        dm.close()
    for a, b in zip(*batches, strict=True):
        assert torch.equal(a["obs", "cam"], b["obs", "cam"])
        assert torch.equal(a["action", "action"], b["action", "action"])


def test_a_url_window_hints_several_phases_ahead_and_draws_as_the_local_one(served_store):
    """A block fetched by URL waits a round trip plus its transfer, so a window over a URL
    with a cache hints the blocks of its next ``_RemoteAhead.PHASES`` phase changes (a local
    file: the next one only); the batches are those of the local file."""
    from torchstore.data.residency.block_read import _RemoteAhead
    from torchstore.window.window_storage import WindowSampler, WindowStorage

    server, url, path = served_store
    draws = {}
    for source in (url, path):
        storage = WindowStorage(source, resident=400, resident_blocks=2, seed=1)
        sampler = WindowSampler(storage, seed=1)
        batches = [storage.get(sampler.sample(storage, 32)[0])["obs"] for _ in range(3)]
        window = storage.window
        assert window._pending is not None
        window._pending.result()  # the spare slot's read, which hints what comes after
        phases = _RemoteAhead.PHASES if source == url else 1
        assert window._reader.ahead_phases == phases
        schedule, nxt = window.schedule, window.schedule.phase + 1
        assert schedule.per_epoch > phases + 2  # enough blocks that every phase brings one
        hinted = {
            b
            for p in range(nxt, nxt + phases)
            for b in schedule.active(p + 1)
            if b not in schedule.active(p)
        }
        assert hinted and hinted <= window._advised
        beyond = set(schedule.active(nxt + phases + 1)) - set(schedule.active(nxt + phases))
        assert not beyond & window._advised
        draws[source] = torch.cat(batches)
        storage.close()
    assert torch.equal(draws[url], draws[path])


# ----------------------------------------------------------------- store sets, pickling
def test_a_store_set_of_shard_urls_reads_as_the_local_set(file_server):  # noqa: F811
    from torchstore.data.store.store_set import StoreSet

    paths = [file_server.root / f"shard-{i}.h5" for i in range(3)]
    for i, path in enumerate(paths):
        _write(path, 4 + i)
    urls = [f"{file_server.url}/{p.name}" for p in paths]
    with StoreSet(urls, cache=False) as remote, StoreSet(paths) as local:
        assert remote.path == f"{file_server.url}/"
        assert (len(remote), remote.num_episodes) == (len(local), local.num_episodes)
        a, b = remote.read_slab(0, len(local)), local.read_slab(0, len(local))
        assert all(torch.equal(a[k], b[k]) for k in b.keys())
        assert remote.episode_metadata(9) == local.episode_metadata(9)
        again = pickle.loads(pickle.dumps(remote))
        assert [s.path for s in again._shards] == urls and again._cache is False
        assert torch.equal(again.episode(7)["obs"], local.episode(7)["obs"])
        again.close()
    with pytest.raises(StoreFormatError, match="listed twice"):
        StoreSet([urls[0], urls[0]])


def test_a_hub_folder_opens_as_a_store_set_pinned_to_one_commit(hub, tmp_path):  # noqa: F811
    from huggingface_hub import HfApi

    from torchstore.data.store.store_set import StoreSet, open_store
    from torchstore.window.window_storage import WindowSampler, WindowStorage

    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(2):
        _write(folder / f"part-{i}.h5", 3 + i)
    (folder / "README.md").write_text("not a shard")
    (folder / "nested").mkdir()
    _write(folder / "nested" / "other.h5", 2)
    api = HfApi(endpoint=hub.endpoint)
    repo = f"{hub.namespace}/sharded"
    api.create_repo(repo, repo_type="dataset")
    commit = api.upload_folder(folder_path=str(folder), path_in_repo="runs", repo_id=repo,
                               repo_type="dataset").oid  # fmt: skip
    with open_store(f"hf://datasets/{repo}/runs/") as remote, StoreSet(folder) as local:
        assert isinstance(remote, StoreSet)
        assert [s.path for s in remote._shards] == [
            f"hf://datasets/{repo}@{commit}/runs/part-{i}.h5" for i in range(2)
        ]
        assert remote.num_episodes == local.num_episodes == 7
        n = len(local)
        assert (remote.read_column("obs", 0, n) == local.read_column("obs", 0, n)).all()
    draws = []
    for source in (f"hf://datasets/{repo}/runs/", folder):
        storage = WindowStorage(source, resident=20, resident_blocks=2, seed=3)
        sampler = WindowSampler(storage, seed=3)
        draws.append(storage.get(sampler.sample(storage, 16)[0])["obs"])
        storage.close()
    assert torch.equal(*draws)
    with pytest.raises(StoreFormatError, match="no store shards in hf://"):
        StoreSet(f"hf://datasets/{repo}/runs/nested/missing/")
    with pytest.raises(ValueError, match="only hf:// folders can be listed"):
        StoreSet("https://example.invalid/shards/")


def test_a_pickled_url_store_reopens_through_the_cache_it_was_given(served_store, tmp_path):
    from torchstore.io.remote.chunk_cache import ChunkCache

    server, url, path = served_store
    cache = ChunkCache(tmp_path / "my-cache", budget="64MiB")
    for given in (cache, False, "32MiB"):
        with TrajectoryStore(url, cache=given) as store:
            again = pickle.loads(pickle.dumps(store))
        try:
            entries = again._file._torchstore_fileobj.cached
            if given is False:
                assert entries == ()
            elif given is cache:
                assert entries and all(e.cache.folder == cache.folder for e in entries)
                assert entries[0].cache.budget == 64 * 2**20
            else:
                assert entries and entries[0].cache.budget == 32 * 2**20
            assert torch.equal(again.episode(3)["obs"], TrajectoryStore(path).episode(3)["obs"])
        finally:
            again.close()
