"""Remote locations at their edges: mistyped locations, offline, read-only caches, dead
writers, 0-byte files, file<->folder updates, deadlines, resumed progress, policy checks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.remote.remote_fixtures import COLUMNS, episode, make_dataset, parquet_bytes, tree_bytes
from torchstore.cli.main import main
from torchstore.remote import (
    DeadlineError,
    NoSuchEntryError,
    NoSuchLocationError,
    OfflineError,
    RemoteCatalog,
    prune,
    pull,
    push,
    sync_recording,
    write_index,
)

REPO = Path(__file__).resolve().parents[2]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


# --------------------------------------------------------------------------- locations
@pytest.mark.parametrize("command", [["catalog", "{loc}"], ["pull", "{loc}", "x"]])
def test_a_mistyped_location_is_no_such_location(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(loc="./nowhere") for a in command]
    assert main(argv + (["--cache-dir", str(tmp_path / "c")] if argv[0] == "pull" else [])) == 1
    line = _one_line_error(capsys)
    assert "no such location" in line and "nowhere" in line and "no such folder" in line
    (tmp_path / "plain").mkdir()
    with pytest.raises(NoSuchLocationError, match="a folder without index.json"):
        RemoteCatalog(tmp_path / "plain").names()


def test_a_mistyped_http_location_is_no_such_location(file_server, tmp_path):
    with pytest.raises(NoSuchLocationError, match=r"no such location: .*index.json is not there"):
        pull(file_server.url + "/typo", "ds", cache_dir=tmp_path / "c", progress=False)


def test_a_missing_entry_is_said_plainly(file_server, tmp_path, capsys):
    push(make_dataset(tmp_path / "local"), file_server.url, "ds", progress=False)
    cache = str(tmp_path / "c")
    assert main(["pull", file_server.url, "nope", "--cache-dir", cache, "--no-progress"]) == 1
    line = _one_line_error(capsys)
    assert line.endswith("has no entry 'nope' (its entries: ds)")
    catalog = RemoteCatalog(file_server.url)
    with pytest.raises(KeyError):
        catalog["nope"]
    with pytest.raises(NoSuchEntryError):
        catalog["nope"]


# --------------------------------------------------------------------------- offline
@pytest.fixture(params=["HF_HUB_OFFLINE", "TORCHSTORE_OFFLINE"])
def offline_env(request, monkeypatch):
    monkeypatch.setenv(request.param, "1")
    return request.param


def _recording(tmp_path) -> Path:
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "a.parquet").write_bytes(parquet_bytes())
    return rec


def test_offline_forbids_http_for_every_command(file_server, tmp_path, capsys, offline_env):
    local = make_dataset(tmp_path / "local")
    rec = _recording(tmp_path)
    url = file_server.url
    for argv in (
        ["push", str(local), url, "ds", "--no-progress"],
        ["sync", str(rec), url, "rec", "--no-progress"],
        ["catalog", url],
        ["prune", url, "ds"],
    ):
        assert main(argv) == 1, argv
        line = _one_line_error(capsys)
        assert "offline mode" in line and "needs the network" in line and offline_env in line
    # pull answers from the cache: not there, so it says so
    assert main(["pull", url, "ds", "--cache-dir", str(tmp_path / "c")]) == 1
    assert "is not in the cache" in _one_line_error(capsys)
    assert file_server.requests == []  # nothing was sent, not even a GET


def test_offline_forbids_the_hub_for_push_sync_and_catalog(hub, tmp_path, offline_env):
    local = make_dataset(tmp_path / "local")
    n = len(hub.requests)
    with pytest.raises(OfflineError, match="pushing to hf://datasets/"):
        push(local, hub.location, "ds", progress=False)
    with pytest.raises(OfflineError, match="syncing to hf://datasets/"):
        sync_recording(_recording(tmp_path), hub.location, "rec")
    with pytest.raises(OfflineError, match="listing hf://datasets/"):
        RemoteCatalog(hub.location).names()
    assert main(["push", str(local), f"{hub.namespace}/lerobot-ds"]) == 1
    assert len(hub.requests) == n


def test_offline_forbids_fsspec_remotes(tmp_path, offline_env):
    pytest.importorskip("fsspec")
    with pytest.raises(OfflineError, match=r"pushing to s3://bucket/x needs the network"):
        push(make_dataset(tmp_path / "local"), "s3://bucket/x", "ds", progress=False)


@pytest.mark.parametrize("scheme", ["path", "file://"])
def test_local_folders_work_offline_in_every_command(tmp_path, capsys, offline_env, scheme):
    folder = tmp_path / "loc"
    loc = str(folder) if scheme == "path" else f"file://{folder}"
    local = make_dataset(tmp_path / "local")
    assert main(["push", str(local), loc, "ds", "--no-progress"]) == 0
    assert main(["sync", str(_recording(tmp_path)), loc, "rec", "--no-progress"]) == 0
    assert main(["catalog", loc]) == 0
    assert main(["pull", loc, "ds", "--cache-dir", str(tmp_path / "c"), "--no-progress"]) == 0
    pulled = capsys.readouterr().out.strip().splitlines()[-1]
    assert tree_bytes(Path(pulled)) == tree_bytes(local)
    assert main(["prune", loc, "ds"]) == 0
    make_dataset(folder / "byhand")
    assert main(["remote", "index", str(folder)]) == 0
    assert RemoteCatalog(loc, offline=True).names() == ["byhand", "ds", "rec"]


# --------------------------------------------------------------------------- read-only cache
def _can_mount_read_only() -> bool:
    if not shutil.which("unshare") or not shutil.which("mount"):
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp /tmp",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def _cli_on_read_only(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``torchstore ARGS`` in a mount namespace where ``folder`` is a read-only bind mount.

    Read-only at the file-system level: root's permission bypass does not apply (EROFS).
    """
    script = (
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && '
        'exec "$1" -m torchstore.cli "${@:2}"'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHSTORE_DISABLE_PROGRESS": "1"}
    return subprocess.run(
        ["unshare", "-rm", "bash", "-c", script, str(folder), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


needs_ro_mount = pytest.mark.skipif(
    not _can_mount_read_only(), reason="needs unshare and mount for a read-only bind mount"
)


@needs_ro_mount
def test_a_read_only_cache_serves_a_complete_entry(file_server, tmp_path):
    loc = tmp_path / "loc"
    local = make_dataset(tmp_path / "local")
    push(local, loc, "ds", progress=False)
    push(local, file_server.url, "ds", progress=False)
    cache = tmp_path / "cache"
    got = pull(loc, "ds", cache_dir=cache, progress=False)
    got_http = pull(file_server.url, "ds", cache_dir=cache, progress=False)
    before = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*"))
    for args in (
        ["pull", str(loc), "ds", "--cache-dir", str(cache)],
        ["pull", str(loc), "ds", "--cache-dir", str(cache), "--offline"],
        ["pull", file_server.url, "ds", "--cache-dir", str(cache)],
        ["pull", file_server.url, "ds", "--cache-dir", str(cache), "--offline"],
    ):
        proc = _cli_on_read_only(cache, *args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() in (str(got), str(got_http))
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) == before


@needs_ro_mount
def test_an_unwritable_cache_is_one_line_naming_it(tmp_path):
    loc = tmp_path / "loc"
    push(make_dataset(tmp_path / "local"), loc, "ds", progress=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = _cli_on_read_only(cache, "pull", str(loc), "ds", "--cache-dir", str(cache))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(cache) in lines[0] and "not writable" in lines[0]
    assert "--cache-dir" in lines[0] and "TORCHSTORE_CACHE" in lines[0]
    # a cache folder that does not exist yet, under a read-only folder
    inner = cache / "new" / "cache"
    proc = _cli_on_read_only(cache, "pull", str(loc), "ds", "--cache-dir", str(inner))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"the cache {inner} is not writable" in proc.stderr
    # half there: the record is complete but a file is missing, so the pull must write
    pull(loc, "ds", cache_dir=cache, progress=False)
    next(cache.glob("*/ds/meta/info.json")).unlink()
    proc = _cli_on_read_only(cache, "pull", str(loc), "ds", "--cache-dir", str(cache))
    assert proc.returncode == 1 and "not writable" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- dead writers
def _kill_a_writer_after(path: Path, episodes: int) -> None:
    """A real writer process commits ``episodes`` episodes, then is SIGKILLed."""
    from torchstore.data import TrajectoryStoreWriter

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            w = TrajectoryStoreWriter(path, COLUMNS, env_id="slow")
            for i in range(episodes):
                w.add_episode(episode(i), metadata={"i": i})
            os.write(write_end, b"k")
            time.sleep(600)
        finally:
            os._exit(1)
    os.close(write_end)
    assert os.read(read_end, 1) == b"k"
    os.close(read_end)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_dead_writers_store_is_synced_and_push_says_how_to_finish_it(
    file_server, tmp_path, capsys
):
    from tests.remote.remote_fixtures import assert_store_matches

    rec = tmp_path / "rec"
    rec.mkdir()
    _kill_a_writer_after(rec / "slow.h5", 5)
    assert main(["sync", str(rec), file_server.url, "rec", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1 uploaded" in out and "waiting" not in out
    assert "writer died" in out and "5 committed episodes are safe" in out
    assert "TrajectoryStoreWriter.resume(" in out
    got = pull(file_server.url, "rec", cache_dir=tmp_path / "c", progress=False)
    assert_store_matches(got / "slow.h5", 5)
    assert main(["push", str(rec), file_server.url, "pushed", "--no-progress"]) == 1
    line = _one_line_error(capsys)
    assert "writer of 'slow.h5' died" in line and "committed episodes are safe" in line
    assert "TrajectoryStoreWriter.resume(" in line
    assert not any(p.startswith("pushed/") for p in file_server.puts)
    assert not any(".lock" in p for p in file_server.puts)  # the writer's sidecar stays local


# --------------------------------------------------------------------------- edge files
def test_a_zero_byte_file_pulls_over_http(file_server, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "empty.txt").write_bytes(b"")
    (local / "x.txt").write_text("x")
    push(local, file_server.url, "ds", progress=False)
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert (got / "empty.txt").read_bytes() == b"" and tree_bytes(got) == tree_bytes(local)


@pytest.mark.parametrize("order", ["folder-then-file", "file-then-folder"])
def test_a_folder_becomes_a_file_and_back(file_server, tmp_path, order):
    folder_version = tmp_path / "v-folder"
    (folder_version / "a").mkdir(parents=True)
    (folder_version / "a" / "b.txt").write_text("inside a/")
    (folder_version / "keep.txt").write_text("k")
    file_version = tmp_path / "v-file"
    file_version.mkdir()
    (file_version / "a").write_text("a is a file now")
    (file_version / "keep.txt").write_text("k")
    versions = [folder_version, file_version]
    if order == "file-then-folder":
        versions.reverse()
    cache = tmp_path / "c"
    for i, version in enumerate([*versions, versions[0]]):
        push(version, file_server.url, "ds", replace=i > 0, progress=False)
        got = pull(file_server.url, "ds", cache_dir=cache, progress=False)
        assert tree_bytes(got) == tree_bytes(version)
        listed = sorted(p.relative_to(got).as_posix() for p in got.rglob("*"))
        expected = sorted(p.relative_to(version).as_posix() for p in version.rglob("*"))
        assert listed == expected  # nothing stale: no leftover file or empty folder


def test_entries_foo_and_foo_lock_do_not_collide(file_server, tmp_path):
    for name in ("foo", "foo.lock"):
        local = tmp_path / name
        local.mkdir()
        (local / "x.txt").write_text(name)
        push(local, file_server.url, name, progress=False)
    cache = tmp_path / "c"
    for name in ("foo", "foo.lock", "foo"):
        got = pull(file_server.url, name, cache_dir=cache, progress=False)
        assert (got / "x.txt").read_text() == name


def test_a_dripping_server_is_stopped_by_the_deadline(file_server, tmp_path, capsys):
    local = tmp_path / "local"
    local.mkdir()
    (local / "big.bin").write_bytes(os.urandom(4000))
    push(local, file_server.url, "ds", progress=False)
    file_server.drip_s["ds/big.bin"] = 0.05  # far inside the read timeout, 200 s in all
    cache = tmp_path / "c"
    with pytest.raises(DeadlineError, match="past the overall deadline"):
        pull(file_server.url, "ds", cache_dir=cache, progress=False, timeout=5, deadline_s=1.0)
    partial = next(cache.glob("*/.partial/ds/*"))
    have = partial.stat().st_size
    assert 0 < have < 4000  # what arrived is kept
    assert (
        main(
            [
                "pull",
                file_server.url,
                "ds",
                "--cache-dir",
                str(cache),
                "--deadline",
                "1",
                "--no-progress",
            ]
        )
        == 1
    )
    assert "deadline" in _one_line_error(capsys)
    del file_server.drip_s["ds/big.bin"]
    got = pull(file_server.url, "ds", cache_dir=cache, progress=False)
    assert tree_bytes(got) == tree_bytes(local)
    assert file_server.gets("ds/big.bin")[-1]["range"] is not None  # resumed, not restarted
    for bad in ("0", "-1", "nan", "inf"):
        assert main(["pull", file_server.url, "ds", "--deadline", bad]) == 2
        assert "--deadline" in capsys.readouterr().err


def test_a_resumed_pull_progress_starts_at_the_bytes_already_there(
    file_server, tmp_path, monkeypatch
):
    import torchstore.remote.cache as cache_mod

    local = tmp_path / "local"
    local.mkdir()
    (local / "big.bin").write_bytes(os.urandom(100_000))
    push(local, file_server.url, "ds", progress=False)
    file_server.cut_after["ds/big.bin"] = 30_000
    cache = tmp_path / "c"
    with pytest.raises(Exception, match="gave up"):
        pull(file_server.url, "ds", cache_dir=cache, progress=False, retries=0)
    bars = []

    class Bar:
        def __init__(self, total, desc, *, enabled=True, initial=0):
            self.total, self.n = total, initial
            bars.append(self)

        def update(self, n=1):
            self.n += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(cache_mod, "progress_bar", Bar)
    pull(file_server.url, "ds", cache_dir=cache, progress=True)
    (bar,) = bars
    assert bar.total == 100_000 and bar.n == bar.total  # 30 000 already there + 70 000 fetched


# --------------------------------------------------------------------------- policies
st = pytest.importorskip("safetensors.torch")


def _weights(folder: Path) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    st.save_file({"a": torch.ones(4, 3), "b": torch.zeros(5)}, str(folder / "model.safetensors"))
    return folder / "model.safetensors"


def _edit_header(path: Path, edit) -> None:
    import json
    import struct

    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h: h["a"].update(dtype="F64"), r"tensor 'a' \(F64 x \[4, 3\]\) needs 96 bytes"),
        (lambda h: h["a"].update(shape=[4, 4]), r"tensor 'a' .* needs 64 bytes"),
        (
            lambda h: (h["a"].update(data_offsets=[20, 68]), h["b"].update(data_offsets=[40, 60])),
            "tensor 'b' .* overlaps tensor 'a'",
        ),
        (lambda h: h["b"].update(dtype="Q9"), "unknown dtype 'Q9'"),
    ],
)
def test_push_policy_checks_safetensors_headers_fully(file_server, tmp_path, edit, match):
    path = _weights(tmp_path / "policy")
    _edit_header(path, edit)
    with pytest.raises(Exception, match=match):
        push(tmp_path / "policy", file_server.url, "pi", kind="policy", progress=False)
    assert file_server.puts == []


def test_a_gap_between_tensors_is_refused(tmp_path):
    from torchstore.errors import StoreFormatError
    from torchstore.remote import check_safetensors

    path = _weights(tmp_path / "policy")
    check_safetensors(path)
    _edit_header(
        path, lambda h: (h["a"].update(data_offsets=[24, 72]), h["b"].update(data_offsets=[0, 20]))
    )
    with open(path, "ab") as f:
        f.write(b"\0" * 4)
    with pytest.raises(
        StoreFormatError, match=r"tensor 'a' \(bytes 24..72\) leaves a gap at byte 20"
    ):
        check_safetensors(path)


def test_push_policy_needs_a_safetensors_file(file_server, tmp_path, capsys):
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert main(["push", str(folder), file_server.url, "pi", "--kind", "policy"]) == 1
    assert "needs at least one .safetensors file" in _one_line_error(capsys)
    _weights(folder)
    assert (
        main(["push", str(folder), file_server.url, "pi", "--kind", "policy", "--no-progress"]) == 0
    )


def test_fetching_onto_a_missing_device_is_a_device_error(file_server, tmp_path):
    import torch

    from torchstore.errors import StoreFormatError
    from torchstore.remote import DeviceError, fetch_policy_weights

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _weights(tmp_path / "policy")
    push(tmp_path / "policy", file_server.url, "pi", kind="policy", progress=False)
    with pytest.raises(DeviceError, match="device 'cuda' cannot be used here") as info:
        fetch_policy_weights(file_server.url, "pi", device="cuda", cache_dir=tmp_path / "c")
    assert not isinstance(info.value, StoreFormatError)
    assert not file_server.gets("pi/model.safetensors")  # refused before any download
    state = fetch_policy_weights(file_server.url, "pi", device="cpu", cache_dir=tmp_path / "c")
    assert sorted(state) == ["a", "b"]


def test_prune_on_the_hub_is_refused(hub, tmp_path):
    from torchstore.errors import TorchstoreError

    push(make_dataset(tmp_path / "local"), hub.location, "ds", progress=False)
    with pytest.raises(TorchstoreError, match="keeps every revision as a commit"):
        prune(hub.location, "ds")


def test_write_index_refuses_unknown_kinds_before_writing(tmp_path):
    make_dataset(tmp_path / "loc" / "ds")
    with pytest.raises(ValueError, match="kind"):
        write_index(tmp_path / "loc", kinds={"ds": "weird"})
    assert not (tmp_path / "loc" / "index.json").exists()
