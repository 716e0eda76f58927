"""LeRobot datasets on the loopback Hub: push (snapshot, card, tag), revision resolution, download.

Everything goes to tests/hubserver.py on 127.0.0.1; huggingface_hub's cache, token file and
telemetry state live under ``tmp_path`` (patched on ``huggingface_hub.constants`` too, since
it reads several settings once, at import).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from torchstore.errors import LeRobotFormatError  # noqa: E402
from torchstore.io.paths import resolve_inside  # noqa: E402
from torchstore.io.remote.transfer import RemoteNotFoundError, TransferError  # noqa: E402
from torchstore.lerobot.hub import (  # noqa: E402
    dataset_card,
    download_lerobot,
    is_lerobot_dataset,
    push_to_hub,
    resolve_lerobot_revision,
)
from torchstore.lerobot.layout import writer_lock  # noqa: E402

COMPLETE = {
    "meta/info.json",
    "meta/episodes/chunk-000/file-000.parquet",
    "data/chunk-000/file-000.parquet",
    "videos/observation.images.cam/chunk-000/file-000.mp4",
}
INFO = {
    "codebase_version": "v3.0",
    "robot_type": "so100",
    "fps": 30,
    "total_episodes": 2,
    "total_frames": 6,
    "total_tasks": 1,
    "features": {"action": {"dtype": "float32", "shape": [2], "names": None}},
}


def _write_parquet(path: Path, columns: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def make_v3(root: Path, *, info: dict | None = None) -> Path:
    """A small LeRobot v3.0 folder plus the scratch a recorder leaves behind."""
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info or INFO, indent=4))
    _write_parquet(
        root / "data/chunk-000/file-000.parquet",
        {"index": list(range(6)), "episode_index": [0, 0, 0, 1, 1, 1]},
    )
    _write_parquet(
        root / "meta/episodes/chunk-000/file-000.parquet",
        {"episode_index": [0, 1], "length": [3, 3]},
    )
    video = root / "videos/observation.images.cam/chunk-000/file-000.mp4"
    video.parent.mkdir(parents=True)
    video.write_bytes(os.urandom(3000))
    # scratch: never uploaded
    png = root / "images/observation.images.cam/episode-000000/frame-000000.png"
    png.parent.mkdir(parents=True)
    png.write_bytes(b"\x89PNG not really")
    (root / "data/chunk-000/.file-000.parquet.123.tmp").write_bytes(b"half a file")
    with writer_lock(root):  # leaves the lock file
        pass
    return root


def local_bytes(root: Path, files=COMPLETE) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in files}


def repo_of(hub, repo_id: str):
    return hub.repos[("dataset", repo_id)]


def commits_posted(hub) -> int:
    return sum(r["method"] == "POST" and "/commit/" in r["path"] for r in hub.requests)


def front_matter(card: str) -> dict:
    yaml = pytest.importorskip("yaml")
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


# --------------------------------------------------------------------------- push
def test_push_uploads_complete_files_card_and_tag(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    before = commits_posted(hub)
    commit = push_to_hub(root, repo_id, tags=["so100", "tutorial"], progress=False)
    repo = repo_of(hub, repo_id)
    assert len(commit) == 40 and repo.branches["main"] == commit
    assert repo.tags["v3.0"] == commit
    assert commits_posted(hub) - before == 1  # one commit for files and card
    files = repo.commits[commit].files
    assert set(files) == COMPLETE | {"README.md"}
    assert {k: v for k, v in files.items() if k != "README.md"} == local_bytes(root)
    card = files["README.md"].decode()
    meta = front_matter(card)
    assert meta["tags"] == ["LeRobot", "so100", "tutorial"]
    assert meta["license"] == "apache-2.0" and meta["task_categories"] == ["robotics"]
    assert meta["configs"] == [{"config_name": "default", "data_files": "data/*/*.parquet"}]
    assert "## Dataset Structure" in card and "```json\n" in card
    assert json.loads(card.split("```json\n")[1].split("\n```")[0]) == INFO
    assert not repo.private
    assert [p.name for p in tmp_path.iterdir() if ".push-" in p.name] == []  # staging removed
    assert (root / "images").is_dir()  # the scratch is left alone


def test_push_again_moves_the_tag_and_drops_stale_files(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    extra = root / "data/chunk-000/file-001.parquet"
    _write_parquet(extra, {"index": [6, 7]})
    repo_id = f"{hub.namespace}/ds"
    first = push_to_hub(root, repo_id, progress=False)
    assert "data/chunk-000/file-001.parquet" in repo_of(hub, repo_id).commits[first].files
    assert push_to_hub(root, repo_id, progress=False) == first  # unchanged: no new commit
    assert repo_of(hub, repo_id).tags == {"v3.0": first}
    extra.unlink()
    info = dict(INFO, total_frames=7)
    (root / "meta/info.json").write_text(json.dumps(info))
    second = push_to_hub(root, repo_id, progress=True)
    repo = repo_of(hub, repo_id)
    assert second != first and repo.tags == {"v3.0": second}
    files = repo.commits[second].files
    assert set(files) == COMPLETE | {"README.md"}
    assert json.loads(files["meta/info.json"]) == info


def test_push_without_videos_to_a_private_repo(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/private"
    commit = push_to_hub(root, repo_id, private=True, push_videos=False, progress=False)
    repo = repo_of(hub, repo_id)
    assert repo.private
    assert set(repo.commits[commit].files) == {
        p for p in COMPLETE if not p.startswith("videos/")
    } | {"README.md"}


def test_push_to_a_branch_tags_the_branch_commit(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    commit = push_to_hub(
        root, repo_id, branch="dev", tag_version=True, commit_message="rec 1", progress=False
    )
    repo = repo_of(hub, repo_id)
    assert repo.branches["dev"] == commit and repo.tags["v3.0"] == commit
    assert repo.commits[repo.branches["main"]].files == {}  # main untouched
    assert repo.commits[commit].title == "rec 1"


def test_push_without_tag(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    push_to_hub(root, repo_id, tag_version=False, progress=False)
    assert repo_of(hub, repo_id).tags == {}
    with pytest.raises(LeRobotFormatError, match="must be tagged with a codebase version"):
        download_lerobot(repo_id, progress=False)


def test_footerless_parquet_is_refused_and_nothing_is_uploaded(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    data = root / "data/chunk-000/file-000.parquet"
    with open(data, "rb+") as f:
        f.truncate(data.stat().st_size - 8)
    with pytest.raises(
        LeRobotFormatError, match=r"data/chunk-000/file-000\.parquet in .* no Parquet footer"
    ):
        push_to_hub(root, f"{hub.namespace}/ds", progress=False)
    assert ("dataset", f"{hub.namespace}/ds") not in hub.repos
    assert not any(hub.namespace in r["path"] for r in hub.requests)
    assert [p.name for p in tmp_path.iterdir() if ".push-" in p.name] == []


@pytest.mark.parametrize(
    "text, match",
    [
        (None, r"not a LeRobot dataset: meta/info\.json is missing"),
        ("{not json", r"meta/info\.json is not valid JSON"),
        ("[1, 2]", r"must hold a JSON object, got list"),
        (json.dumps(dict(INFO, codebase_version="v2.1")), r"codebase_version 'v2\.1'.* v3\.x"),
        (json.dumps({"fps": 30}), r"codebase_version None"),
    ],
)
def test_bad_info_json_is_refused(hub, tmp_path, text, match):
    root = make_v3(tmp_path / "ds")
    if text is None:
        (root / "meta/info.json").unlink()
    else:
        (root / "meta/info.json").write_text(text)
    with pytest.raises(LeRobotFormatError, match=match):
        push_to_hub(root, f"{hub.namespace}/ds", progress=False)
    assert not any(hub.namespace in r["path"] for r in hub.requests)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_symlinks_inside_the_dataset_are_refused(hub, tmp_path, kind):
    root = make_v3(tmp_path / "ds")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not upload")
    if kind == "file":
        os.symlink(outside / "secret.txt", root / "meta" / "notes.txt")
        match = r"meta/notes\.txt in .* is a symlink"
    else:
        os.symlink(outside, root / "data" / "chunk-001")
        match = r"data/chunk-001 in .* is a symlink"
    with pytest.raises(LeRobotFormatError, match=match):
        push_to_hub(root, f"{hub.namespace}/ds", progress=False)
    assert ("dataset", f"{hub.namespace}/ds") not in hub.repos


def test_symlinked_scratch_is_ignored_not_followed(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "images" / "elsewhere")
    commit = push_to_hub(root, f"{hub.namespace}/ds", progress=False)
    assert set(repo_of(hub, f"{hub.namespace}/ds").commits[commit].files) == COMPLETE | {
        "README.md"
    }


def test_a_writer_holding_the_lock_delays_the_snapshot(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    held, release, done = threading.Event(), threading.Event(), threading.Event()
    new_info = dict(INFO, total_episodes=3)
    result: dict = {}

    def writer() -> None:
        with writer_lock(root):
            held.set()
            release.wait(10)
            # the end of an episode: replace info.json by rename, as the writer does
            tmp = root / "meta" / ".info.json.tmp"
            tmp.write_text(json.dumps(new_info))
            os.replace(tmp, root / "meta" / "info.json")

    def pusher() -> None:
        try:
            result["commit"] = push_to_hub(root, repo_id, progress=False)
        except BaseException as exc:  # reported by the assertions below
            result["error"] = exc
        finally:
            done.set()

    w = threading.Thread(target=writer)
    w.start()
    assert held.wait(10)
    n = len(hub.requests)
    p = threading.Thread(target=pusher)
    p.start()
    assert not done.wait(0.4)  # still waiting for the writer
    assert len(hub.requests) == n
    release.set()
    w.join(10)
    p.join(30)
    assert "error" not in result, result.get("error")
    files = repo_of(hub, repo_id).commits[result["commit"]].files
    assert json.loads(files["meta/info.json"]) == new_info  # the state after the writer


def test_push_refuses_a_bad_repo_id(tmp_path):
    root = make_v3(tmp_path / "ds")
    with pytest.raises(ValueError, match=r"repo_id \('ds'\) must be 'namespace/name'"):
        push_to_hub(root, "ds", progress=False)


def test_dataset_card_is_valid_yaml_for_odd_tags():
    info = dict(INFO, robot_type=None, note="a ``` fence and ```` more")
    tags = ['quote " and \\ back', "colon: hash #", "é😀", "LeRobot"]
    card = dataset_card(info, "me/ds", license="mit", tags=tags)
    meta = front_matter(card)
    assert meta["tags"] == ["LeRobot", *tags[:3]] and meta["license"] == "mit"
    assert "- Robot type: unknown" in card and "- Episodes: 2" in card
    fenced = card.split("## Dataset Structure")[1]
    assert "`````json\n" in fenced  # longer than any backtick run inside
    assert json.loads(fenced.split("`````json\n")[1].split("\n`````")[0]) == info
    with pytest.raises(TypeError, match="sequence of strings"):
        dataset_card(INFO, "me/ds", tags="LeRobot")


def test_is_lerobot_dataset(tmp_path):
    assert is_lerobot_dataset(make_v3(tmp_path / "ds"))
    assert not is_lerobot_dataset(tmp_path)
    assert not is_lerobot_dataset(tmp_path / "missing")


# --------------------------------------------------------------------------- resolve
@pytest.mark.parametrize(
    "branches, tags, revision, expected",
    [
        ([], ["v3.0"], None, "v3.0"),
        ([], ["v3.0"], "v3.1", "v3.0"),
        ([], ["v2.1", "v3.0", "v3.1", "v3.2"], "v3.1", "v3.1"),
        ([], ["v2.1", "v3.0", "v3.2"], "v3.1", "v3.0"),
        (["v3.0"], [], None, "v3.0"),  # a version branch counts too
        ([], ["v3.0"], "main", "main"),
        ([], [], "main", "main"),
        ([], ["v2.1"], "v2.1", "v2.1"),
        ([], ["v2.0"], "v2.1", "v2.0"),
    ],
)
def test_resolve_lerobot_revision(hub, branches, tags, revision, expected):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint)
    repo_id = f"{hub.namespace}/ds"
    api.create_repo(repo_id, repo_type="dataset")
    for b in branches:
        api.create_branch(repo_id, branch=b, repo_type="dataset")
    for t in tags:
        api.create_tag(repo_id, tag=t, repo_type="dataset")
    assert resolve_lerobot_revision(repo_id, revision) == expected


@pytest.mark.parametrize(
    "tags, match",
    [
        (["v2.1"], r"is LeRobot v2\.1 .*v2\.1 path; pass revision='v2\.1' \(or 'main'\)"),
        (["v2.0", "v2.1"], r"is LeRobot v2\.1"),
        ([], r"must be tagged with a codebase version"),
        (["release"], r"must be tagged with a codebase version"),
        (["v3.2"], r"no version <= v3\.0 .*pass revision='v3\.2'"),
    ],
)
def test_resolve_lerobot_revision_errors(hub, tags, match):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint)
    repo_id = f"{hub.namespace}/ds"
    api.create_repo(repo_id, repo_type="dataset")
    for t in tags:
        api.create_tag(repo_id, tag=t, repo_type="dataset")
    with pytest.raises(LeRobotFormatError, match=match):
        resolve_lerobot_revision(repo_id)


# --------------------------------------------------------------------------- download
def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("how", ["env", "constants"])
def test_download_then_offline_from_the_cache(hub, tmp_path, monkeypatch, how):
    from huggingface_hub import constants

    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    commit = push_to_hub(root, repo_id, progress=False)
    got = download_lerobot(repo_id, progress=False)
    assert got.is_dir() and got.name == commit
    assert got.is_relative_to(hub.home / "hub")  # huggingface_hub's cache under HF_HOME
    tree = _tree(got)
    assert {k: v for k, v in tree.items() if k != "README.md"} == local_bytes(root)
    assert "README.md" in tree and is_lerobot_dataset(got)
    # regular files (hard links to the cache's blobs): torchstore's readers refuse symlinks
    for rel in tree:
        assert not (got / rel).is_symlink() and (got / rel).stat().st_nlink >= 2
        resolve_inside(got, rel)

    n = len(hub.requests)
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert download_lerobot(repo_id, progress=False) == got
    assert download_lerobot(repo_id, revision="v3.1", progress=False) == got  # same rule, cached
    assert download_lerobot(repo_id, revision=commit, progress=False) == got
    assert len(hub.requests) == n  # no request at all
    with pytest.raises(
        TransferError,
        match=r"'.*/other' is not in the huggingface_hub cache .*HF_HUB_OFFLINE is set",
    ):
        download_lerobot(f"{hub.namespace}/other", progress=False)
    with pytest.raises(TransferError, match=r"at 'dev' is not \(completely\) in the .*cache"):
        download_lerobot(repo_id, revision="dev", progress=False)


def test_offline_with_an_empty_cache(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        TransferError,
        match=r"'me/ds' is not in the huggingface_hub cache \(.*\) and HF_HUB_OFFLINE is set",
    ):
        download_lerobot("me/ds", cache_dir=tmp_path / "empty", progress=False)
    assert not any("me/ds" in r["path"] for r in hub.requests)


def test_torchstore_offline_is_offline_for_the_hub_too(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTORE_OFFLINE", "1")
    n = len(hub.requests)
    with pytest.raises(TransferError, match=r"'me/ds' is not in the huggingface_hub cache"):
        download_lerobot("me/ds", cache_dir=tmp_path / "empty", progress=False)
    assert len(hub.requests) == n


def test_download_into_a_cache_dir_with_patterns(hub, tmp_path):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    push_to_hub(root, repo_id, progress=False)
    got = download_lerobot(
        repo_id, cache_dir=tmp_path / "c", allow_patterns=["meta/*", "data/*"], progress=True
    )
    assert got.is_relative_to(tmp_path / "c")
    assert set(_tree(got)) == {p for p in COMPLETE if not p.startswith("videos/")}
    assert download_lerobot(repo_id, cache_dir=tmp_path / "c", progress=False) == got
    assert set(_tree(got)) == COMPLETE | {"README.md"}  # the view follows the snapshot
    assert _tree(got)["meta/info.json"] == (root / "meta/info.json").read_bytes()


def test_download_a_missing_repo_is_not_found(hub):
    secret = "hf_SECRETtoken123456"
    with pytest.raises(RemoteNotFoundError, match=rf"'{hub.namespace}/nothing'") as info:
        download_lerobot(f"{hub.namespace}/nothing", token=secret, progress=False)
    assert secret not in str(info.value)
    assert any(r["authorization"] == f"Bearer {secret}" for r in hub.requests)


def _closed_port_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_hub_falls_back_to_the_cache(hub, tmp_path, caplog):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    push_to_hub(root, repo_id, progress=False)
    got = download_lerobot(repo_id, progress=False)
    down = _closed_port_endpoint()
    with caplog.at_level(logging.WARNING, logger="torchstore.lerobot.hub"):
        assert download_lerobot(repo_id, endpoint=down, progress=False) == got
    assert "using the cached copy" in caplog.text
    with pytest.raises(
        TransferError, match=rf"listing the refs of dataset '{hub.namespace}/other'"
    ):
        download_lerobot(f"{hub.namespace}/other", endpoint=down, progress=False)


def test_offline_with_only_a_branch_cached(hub, tmp_path, monkeypatch):
    root = make_v3(tmp_path / "ds")
    repo_id = f"{hub.namespace}/ds"
    push_to_hub(root, repo_id, progress=False)
    got = download_lerobot(repo_id, revision="main", progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_lerobot(repo_id, revision="main", progress=False) == got
    with pytest.raises(TransferError, match=r"no version ref in the .*cache .*only main"):
        download_lerobot(repo_id, progress=False)


# --------------------------------------------------------------------------- round trip
def test_push_a_recorded_dataset_then_import_it_by_repo_id(hub, tmp_path):
    """LeRobotWriter -> push_to_hub -> import_lerobot("user/name"): the data comes back."""
    from tests.lerobot.test_lerobot_roundtrip import check_store, record
    from torchstore.lerobot import import_lerobot

    root = tmp_path / "recorded"
    written = record(root, (6, 9))
    repo_id = f"{hub.namespace}/so101"
    push_to_hub(root, repo_id, progress=False)
    pushed = repo_of(hub, repo_id)
    files = set(pushed.commits[pushed.tags["v3.0"]].files)
    assert "README.md" in files and not any(f.startswith("images/") for f in files)
    summary = import_lerobot(repo_id, tmp_path / "pulled.h5", progress=False)
    assert (summary.episodes, summary.frames) == (2, 15)
    check_store(tmp_path / "pulled.h5", written)
    local = import_lerobot(root, tmp_path / "local.h5", progress=False)
    assert local.frames == summary.frames


def test_push_and_import_by_repo_id_with_the_default_endpoint(hub_server, tmp_path):
    """``push DIR REPO_ID`` and ``import-lerobot REPO_ID`` with ``HF_ENDPOINT`` unset, each in a
    fresh interpreter (where huggingface_hub has loaded none of its submodules yet)."""
    from tests.hubserver import run_cli_default_endpoint
    from tests.lerobot.test_lerobot_roundtrip import check_store, record

    root = tmp_path / "recorded"
    written = record(root, (4, 5))
    repo_id = "defaultep/so101"
    env = {"HF_HOME": str(tmp_path / "hf-home"), "TORCHSTORE_DISABLE_PROGRESS": "1"}
    pushed = run_cli_default_endpoint(
        hub_server.endpoint, "push", str(root), repo_id, "--no-progress", env=env
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "v3.0" in repo_of(hub_server, repo_id).tags
    imported = run_cli_default_endpoint(
        hub_server.endpoint,
        "import-lerobot",
        repo_id,
        str(tmp_path / "pulled.h5"),
        "--no-progress",
        env=env,
    )
    assert imported.returncode == 0, imported.stderr
    assert "Traceback" not in imported.stderr
    check_store(tmp_path / "pulled.h5", written)
