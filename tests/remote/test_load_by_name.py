"""``torchstore.load(name)``, ``torchstore datasets``, ``torchstore list`` on loopback servers."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import torchstore
from tests.remote.remote_fixtures import assert_store_matches, make_dataset
from torchstore.cli import main
from torchstore.data import TrajectoryStore
from torchstore.datasets import (
    AmbiguousDatasetError,
    configured_locations,
    local_datasets,
    resolve,
)
from torchstore.remote import NoSuchEntryError, NoSuchLocationError, TransferError, push


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    home = tmp_path / "config-home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("TORCHSTORE_LOCATIONS", raising=False)
    return home


def _data_requests(server) -> int:
    return len(server.requests)


def test_load_pulls_from_the_env_location_then_answers_from_the_cache(
    file_server, tmp_path, monkeypatch, config_home
):
    push(make_dataset(tmp_path / "local"), file_server.url, "ds", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", file_server.url)
    store = torchstore.load("ds", progress=False)
    assert isinstance(store, TrajectoryStore) and store.num_episodes == 3
    assert_store_matches(store.path, 3)
    store.close()
    before = _data_requests(file_server)
    again = torchstore.load("ds", progress=False)
    assert again.path == store.path
    assert _data_requests(file_server) == before  # the cache answered: not even index.json
    again.close()


def test_config_file_locations_in_order_first_listing_wins(tmp_path, config_home):
    empty, first, second = tmp_path / "empty", tmp_path / "first", tmp_path / "second"
    push(make_dataset(tmp_path / "other"), empty, "other", progress=False)
    push(make_dataset(tmp_path / "a", episodes=2), first, "ds", progress=False)
    push(make_dataset(tmp_path / "b", episodes=4), second, "ds", progress=False)
    (config_home / "torchstore").mkdir(parents=True)
    (config_home / "torchstore" / "locations").write_text(
        f"# team datasets\n{empty}\n\n{first}   # the lab's\n{second}\n"
    )
    assert configured_locations() == [str(empty), str(first), str(second)]
    got = resolve("ds", progress=False)
    assert got.location == str(first) and got.source == "location"
    with torchstore.load("ds", progress=False) as store:
        assert store.num_episodes == 2
    with pytest.raises(NoSuchEntryError, match="not at .*empty"):
        torchstore.load("missing", progress=False)


def test_revisions_pin_what_is_loaded(tmp_path, monkeypatch, config_home):
    loc = tmp_path / "loc"
    old = push(make_dataset(tmp_path / "v1", episodes=2), loc, "ds", progress=False)
    new = push(make_dataset(tmp_path / "v2", episodes=5), loc, "ds", replace=True, progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(loc))
    latest = resolve("ds", progress=False)
    assert latest.revision == new.revision and latest.pinned == f"ds@{new.revision}"
    with torchstore.load(f"ds@{old.revision[:10]}", progress=False) as store:
        assert store.num_episodes == 2
    with torchstore.load(f"ds@{new.revision}", progress=False) as store:
        assert store.num_episodes == 5
    with pytest.raises(NoSuchEntryError, match="no revision"):
        torchstore.load("ds@0000000000", progress=False)


def test_offline_answers_from_the_cache_and_never_asks_the_network(
    file_server, tmp_path, monkeypatch, config_home
):
    push(make_dataset(tmp_path / "local"), file_server.url, "ds", progress=False)
    push(make_dataset(tmp_path / "local2"), file_server.url, "ds2", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", file_server.url)
    torchstore.load("ds", progress=False).close()
    monkeypatch.setenv("TORCHSTORE_OFFLINE", "1")
    before = _data_requests(file_server)
    with torchstore.load("ds") as store:
        assert store.num_episodes == 3
    with pytest.raises(NoSuchEntryError, match="skipped \\(offline\\)"):
        torchstore.load("ds2")
    assert _data_requests(file_server) == before


def test_a_damaged_cached_file_is_not_used_and_is_pulled_again(tmp_path, monkeypatch, config_home):
    loc = tmp_path / "loc"
    push(make_dataset(tmp_path / "local"), loc, "ds", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(loc))
    got = resolve("ds", progress=False)
    blob = got.root / "data" / "chunk-000" / "blob.bin"
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    again = resolve("ds", progress=False)
    assert again.source == "location"  # the cache did not answer with damaged bytes
    assert (
        blob.read_bytes() == (tmp_path / "local" / "data" / "chunk-000" / "blob.bin").read_bytes()
    )


def test_a_failing_location_is_an_error_not_a_fall_through(tmp_path, monkeypatch, config_home):
    good = tmp_path / "good"
    push(make_dataset(tmp_path / "local"), good, "ds", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", f"{tmp_path / 'typo'},{good}")
    with pytest.raises(NoSuchLocationError, match="typo"):
        torchstore.load("ds", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", "http://127.0.0.1:9/nothing-listens")
    with pytest.raises(TransferError, match="127.0.0.1:9"):
        torchstore.load("ds", progress=False, timeout=2.0)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", "http://user:secret@host/x")
    with pytest.raises(ValueError, match="TORCHSTORE_LOCATIONS"):
        torchstore.load("ds", progress=False)


@pytest.mark.parametrize("bad", ["", "../etc", "a/b/c", "ds@", "x" * 200, ".hidden"])
def test_hostile_names_are_refused_before_any_lookup(bad, config_home):
    with pytest.raises(ValueError):
        torchstore.load(bad, progress=False)


def test_a_hub_id_loads_from_the_hub(hub, tmp_path, config_home):
    push(make_dataset(tmp_path / "local"), hub.location, "ds", progress=False)
    got = resolve(f"{hub.namespace}/ds", progress=False)
    assert got.source == "hub" and len(got.revision) == 40
    with torchstore.load(f"{hub.namespace}/ds@{got.revision}", progress=False) as store:
        assert store.num_episodes == 3
    os.environ["TORCHSTORE_OFFLINE"] = "1"
    try:  # the cache answers a pinned Hub id offline
        with torchstore.load(f"{hub.namespace}/ds") as store:
            assert store.num_episodes == 3
    finally:
        del os.environ["TORCHSTORE_OFFLINE"]


def test_an_entry_with_several_stores_needs_file(tmp_path, monkeypatch, config_home):
    local = make_dataset(tmp_path / "local")
    shutil.copyfile(local / "store.h5", local / "second.h5")
    push(local, tmp_path / "loc", "two", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(tmp_path / "loc"))
    with pytest.raises(AmbiguousDatasetError, match="second.h5"):
        torchstore.load("two", progress=False)
    with torchstore.load("two", file="second.h5", progress=False) as store:
        assert store.num_episodes == 3


def test_a_lerobot_entry_is_imported_once_and_returned_as_a_store(
    tmp_path, monkeypatch, config_home
):
    pytest.importorskip("pyarrow")
    from torchstore.lerobot import LeRobotWriter

    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    with LeRobotWriter(tmp_path / "lr", fps=10, features=features) as w:
        for episode in range(2):
            for t in range(5):
                w.add_frame(
                    {
                        "observation.state": np.full(3, t + episode, np.float32),
                        "action": np.zeros(2, np.float32),
                    },
                    task="reach",
                )
            w.save_episode()
    push(tmp_path / "lr", tmp_path / "loc", "lr", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(tmp_path / "loc"))
    with torchstore.load("lr", progress=False) as store:
        assert store.num_episodes == 2 and store.num_rows == 10
        assert store.episode(1)["observation.state"][0].tolist() == [1.0, 1.0, 1.0]
        path = store.path
    mtime = os.stat(path).st_mtime_ns
    with torchstore.load("lr", progress=False) as store:
        assert store.path == path
    assert os.stat(path).st_mtime_ns == mtime  # imported once
    listed = {d.name: d for d in local_datasets()}
    assert listed["lr"].episodes == 2 and listed["lr"].note == "LeRobot"


def test_cli_datasets_and_list(tmp_path, monkeypatch, config_home, capsys):
    loc = tmp_path / "loc"
    entry = push(make_dataset(tmp_path / "local"), loc, "ds", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(loc))
    assert main(["list"]) == 0
    assert "no datasets in the cache" in capsys.readouterr().out
    assert main(["datasets", "ds", "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["episodes"] == 3 and doc["rows"] == 150 and doc["pinned"] == f"ds@{entry.revision}"
    assert main(["datasets", "ds", "--path"]) == 0
    assert capsys.readouterr().out.strip().endswith("store.h5")
    assert main(["list"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("ds "))
    assert " 3 " in row and "KiB" in row and entry.revision[:12] in row and str(loc) in row
    assert main(["list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["size"] == entry.size and listed["episodes"] == 3
    assert main(["datasets", "nope"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no dataset 'nope'" in err


def test_the_cache_answers_names_pulled_from_anywhere_but_a_hub_id_only_from_its_repo(
    tmp_path, monkeypatch, config_home
):
    from torchstore.remote import pull

    push(make_dataset(tmp_path / "local"), tmp_path / "elsewhere", "ds", progress=False)
    pull(tmp_path / "elsewhere", "ds", progress=False)  # pulled by hand, not configured
    got = resolve("ds", progress=False)
    assert got.source == "cache" and got.location == str(tmp_path / "elsewhere")
    monkeypatch.setenv("TORCHSTORE_OFFLINE", "1")
    with pytest.raises(NoSuchEntryError, match="skipped \\(offline\\)"):
        resolve("someone/ds")  # not the cached index entry of the same base name


def test_a_minari_entry_is_imported_once_and_returned_as_a_store(
    tmp_path, monkeypatch, config_home
):
    pytest.importorskip("minari")
    gym = pytest.importorskip("gymnasium")
    from torchstore.gym import record
    from torchstore.minari import export_minari

    record(gym.make("CartPole-v1"), None, episodes=3, path=tmp_path / "cp.h5", seed=0)
    with TrajectoryStore(tmp_path / "cp.h5") as store:
        rows = store.num_rows
        folder = export_minari(store, "cartpole-v0", root=tmp_path / "minari-root", progress=False)
    push(folder, tmp_path / "loc", "cartpole", progress=False)
    monkeypatch.setenv("TORCHSTORE_LOCATIONS", str(tmp_path / "loc"))
    with torchstore.load("cartpole", progress=False) as store:
        assert store.num_episodes == 3 and store.num_rows == rows
        assert store.path.parent.name == ".stores"
    listed = {d.name: d for d in local_datasets()}
    assert listed["cartpole"].episodes == 3 and listed["cartpole"].note == "Minari"
