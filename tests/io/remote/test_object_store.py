"""A store opened in place from ``s3://`` (moto's server on loopback, through boto3): the same
rows, episodes and window draws as the local file; one version or RemoteChangedError; faults
retried within a bound; missing objects, buckets and refused credentials in one line without
a secret; the CLI, a pickled store in a child and forked DataLoader workers. ``gs://`` takes
the same fetcher through google-cloud-storage: its URL parsing, dispatch and the way a refused
connection ends are tested here; no GCS server can be started in tests."""

from __future__ import annotations

import multiprocessing
import pickle
import sys

import pytest
import torch

from torchstore import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import (
    RemoteChangedError,
    RemoteNotFoundError,
    TransferError,
    UnsupportedError,
)
from torchstore.io.remote.object_store import ObjectURL, locate_object, parse_object_url
from torchstore.io.remote.range_requests import is_url, locate

COLUMNS = [
    ColumnSpec("obs", torch.float32, (5,)),
    ColumnSpec("action", torch.float32, (2,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("pixels", torch.float32, (6, 6, 3), quantize=Quantize(0.0, 1.0)),
]


def _write(path, episodes: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with TrajectoryStoreWriter(path, COLUMNS, env_id="Pendulum-v1", overwrite=True) as w:
        for e in range(episodes):
            n = 40 + e % 7
            w.append({s.name: torch.rand(n, *s.shape, generator=g) for s in COLUMNS})
            w.end_episode(metadata={"episode": e})


@pytest.fixture(scope="module")
def s3_store(moto_s3, tmp_path_factory):
    """A 40-episode store written locally and uploaded: ``(url, local path, boto3 client)``."""
    endpoint, client = moto_s3
    path = tmp_path_factory.mktemp("store") / "runs.h5"
    _write(path, 40)
    client.create_bucket(Bucket="robot-data")
    client.upload_file(str(path), "robot-data", "pusht/runs.h5")
    return "s3://robot-data/pusht/runs.h5", path, client


def _same_rows(remote: TrajectoryStore, local: TrajectoryStore) -> None:
    assert len(remote) == len(local) and remote.manifest == local.manifest
    a, b = remote.read_slab(0, len(local)), local.read_slab(0, len(local))
    for spec in COLUMNS:
        assert torch.equal(a[spec.name], b[spec.name]), spec.name
    assert torch.equal(remote.episodes.lengths, local.episodes.lengths)
    assert torch.equal(remote.episode(11)["obs"], local.episode(11)["obs"])
    assert remote.episode_metadata(7) == local.episode_metadata(7) == {"episode": 7}


def test_a_store_read_through_s3_equals_the_local_file(s3_store):
    url, path, _ = s3_store
    with TrajectoryStore(url) as remote, TrajectoryStore(path) as local:
        assert remote.path == url and repr(remote).startswith(f"TrajectoryStore('{url}'")
        _same_rows(remote, local)
        assert remote.size_on_disk() == path.stat().st_size


def test_a_window_over_s3_draws_the_local_files_batches(s3_store):
    from torchstore.window.window_storage import WindowSampler, WindowStorage

    url, path, _ = s3_store
    draws = []
    for source in (url, path):
        storage = WindowStorage(source, resident=400, resident_blocks=2, seed=1)
        sampler = WindowSampler(storage, seed=1)
        draws.append([storage.get(sampler.sample(storage, 32)[0]) for _ in range(3)])
        storage.close()
    for a, b in zip(*draws, strict=True):
        assert torch.equal(a["obs"], b["obs"]) and torch.equal(a["pixels"], b["pixels"])


def test_an_object_replaced_after_open_is_refused_not_mixed(s3_store, tmp_path):
    url, path, client = s3_store
    client.upload_file(str(path), "robot-data", "replaced/runs.h5")
    remote = TrajectoryStore("s3://robot-data/replaced/runs.h5", cache=False)
    _write(tmp_path / "next.h5", 41, seed=1)
    client.upload_file(str(tmp_path / "next.h5"), "robot-data", "replaced/runs.h5")
    with pytest.raises(
        RemoteChangedError, match=r"s3://robot-data/replaced/runs\.h5 bytes \d+-\d+: changed since"
    ):
        remote.read_slab(0, len(remote))
    remote.close()
    with TrajectoryStore("s3://robot-data/replaced/runs.h5") as again:  # a new open: the new one
        assert again.num_episodes == 41


def test_a_missing_object_or_bucket_is_one_clear_line(s3_store):
    with pytest.raises(RemoteNotFoundError, match=r"s3://robot-data/nope\.h5: no such object"):
        TrajectoryStore("s3://robot-data/nope.h5")
    with pytest.raises(RemoteNotFoundError, match=r"s3://no-such-bucket/a\.h5: no bucket"):
        TrajectoryStore("s3://no-such-bucket/a.h5")


def _moto_checks_keys(endpoint: str, after: str) -> None:
    """Have moto check access keys on requests after the next ``after`` ("0"), or never."""
    import urllib.request

    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=after.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def test_refused_credentials_say_so_without_the_secret(s3_store, moto_s3, monkeypatch):
    url, _, _ = s3_store
    key, secret = "AKIAEXAMPLEKEY000000", "s3cr3t/w1th+chars-9f8e7d"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    _moto_checks_keys(moto_s3[0], "0")
    try:
        with pytest.raises(TransferError, match=r"runs\.h5: access refused \(InvalidAccessKeyId"):
            TrajectoryStore(url)
        with pytest.raises(TransferError) as raised:
            locate_object(url, retries=0)
        text = f"{raised.value!r} {raised.value.__cause__!r} {raised.value.__context__!r}"
        assert secret not in text and key not in text
    finally:
        _moto_checks_keys(moto_s3[0], "inf")


def test_transient_faults_are_retried_then_named(s3_store, s3_faults):
    url, path, _ = s3_store
    data = path.read_bytes()
    fetcher = locate_object(url, retries=3)
    s3_faults.statuses = [503, 500]
    assert fetcher.fetch(100, 5000) == data[100:5000]
    s3_faults.cut_after = 1000
    assert fetcher.fetch(0, 300_000) == data[:300_000]
    s3_faults.bad_range = True
    assert fetcher.fetch(7, 70) == data[7:70]
    assert fetcher.requests == 1 + 3 + 2 + 2  # the open, then each fault's extra attempt
    s3_faults.statuses = [503] * 10
    with pytest.raises(TransferError, match=r"runs\.h5 bytes 10-19: 503.*gave up after 4 attempts"):
        fetcher.fetch(10, 20)


def test_info_verify_and_facts_take_an_s3_url(s3_store, capsys):
    from torchstore.cli.main import main
    from torchstore.data.store.facts import StoreFacts
    from torchstore.data.store.verify import verify_store

    url, path, _ = s3_store
    with StoreFacts(url) as facts:
        assert facts.path == url
    assert main(["info", "--json", url]) == 0
    assert f'"path": "{url}"' in capsys.readouterr().out
    report = verify_store(url)
    assert str(report.path) == url and not report.problems and report.rows > 0
    with pytest.raises(UnsupportedError, match="writers are local; push publishes a store"):
        TrajectoryStoreWriter(url, COLUMNS)


def _read_in_child(blob: bytes, out) -> None:
    store = pickle.loads(blob)  # opens the URL again, with this process's own client
    out.put(store.read_slab(3, 9)["obs"].numpy())
    store.close()


def test_a_pickled_store_reopens_in_a_child_and_forked_workers_read(s3_store):
    from torch.utils.data import DataLoader, Subset

    from tests.data._store_rows import StoreRows

    url, path, _ = s3_store
    ctx = multiprocessing.get_context("fork")
    with TrajectoryStore(url) as remote, TrajectoryStore(path) as local:
        remote.read_slab(0, 10)  # the parent has its client, event loop and connections
        out = ctx.Queue()
        child = ctx.Process(target=_read_in_child, args=(pickle.dumps(remote), out))
        child.start()
        got = out.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0 and (got == local.read_slab(3, 9)["obs"].numpy()).all()
        rows = Subset(StoreRows(remote), range(0, len(local), 17))
        loader = DataLoader(
            rows, batch_size=20, num_workers=2, multiprocessing_context=ctx, timeout=60
        )
        batches = list(loader)
        got = torch.cat([b["obs"] for b in batches])
        assert torch.equal(got, local.read_slab(0, len(local))["obs"][::17])
        assert len({int(p) for b in batches for p in b["pid"]}) == 2


# ----------------------------------------------------------------- URLs
def test_s3_and_gs_urls_are_urls_and_parse():
    assert is_url("s3://bucket/a/b.h5") and is_url("gs://bucket/b.h5")
    assert parse_object_url("gs://bkt/runs/b.h5") == ObjectURL("gs", "bkt", "runs/b.h5")
    assert parse_object_url("s3://bkt/runs/b.h5").url == "s3://bkt/runs/b.h5"
    for bad in ("s3://bucket", "s3://bucket/", "gs:///key", "s3://bucket/folder/"):
        with pytest.raises(ValueError, match="must be s3://BUCKET/KEY or gs://BUCKET/KEY"):
            parse_object_url(bad)
    with pytest.raises(ValueError, match="must not hold credentials") as raised:
        parse_object_url("s3://AKIAX:hunter2@bucket/key")
    assert "hunter2" not in str(raised.value)


def test_gs_urls_go_to_the_gcs_client_and_name_its_extra_when_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # not installed
    hint = r'gs:// stores need google-cloud-storage: pip install -e "\.\[gcs\]"'
    with pytest.raises(ImportError, match=hint):
        locate("gs://bucket/runs.h5")
    with pytest.raises(ImportError, match=hint):
        TrajectoryStore("gs://bucket/runs.h5")


def test_s3_urls_name_the_s3_extra_when_boto3_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ImportError, match=r's3:// stores need boto3: pip install -e "\.\[s3\]"'):
        locate("s3://bucket/runs.h5")


def test_a_gs_endpoint_that_refuses_connections_gives_one_transfer_error(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with pytest.raises(TransferError, match=r"GET gs://bkt/runs/a\.h5: .*gave up after 2 attempts"):
        locate_object("gs://bkt/runs/a.h5", retries=1, timeout=5)
