"""LeRobot v3.0 datasets on the Hugging Face Hub: push a folder, resolve its version, download it.

What lerobot expects on the Hub: the dataset files
without the writer's scratch, a ``README.md`` dataset card, and a ``v3.0`` git tag on the
pushed commit, because lerobot loads the ref named by its codebase version (else the
highest ``v3.x`` below it) and refuses a repo with no version tag at all.

:func:`push_to_hub` uploads a consistent snapshot: it hard-links the complete files while
holding the folder's writer lock (shared), so a recorder finishing an episode never gets
half of its files into a commit, and checks every Parquet footer before anything is sent.
:func:`download_lerobot` resolves the tag the way lerobot does and fills huggingface_hub's
cache; offline (``HF_HUB_OFFLINE``) it answers from that cache alone. Hub errors become
:class:`~torchstore.io.remote.transfer.TransferError` / ``RemoteNotFoundError`` with tokens
redacted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchstore.errors import LeRobotFormatError
from torchstore.io.remote.hub import HubClient, hub_constants, hub_errors, require_huggingface_hub
from torchstore.io.remote.transfer import RemoteNotFoundError, TransferError, env_flag, progress_bar
from torchstore.lerobot.layout import CODEBASE_VERSION, INFO, is_scratch, writer_lock
from torchstore.lerobot.parquet_files import check_footer

__all__ = [
    "push_to_hub",
    "dataset_card",
    "resolve_lerobot_revision",
    "download_lerobot",
    "is_lerobot_dataset",
]

log = logging.getLogger(__name__)

_VERSION = re.compile(r"v?(\d+)\.(\d+)")
_CARD = "README.md"
# Folders a push owns on the Hub: a file there that the snapshot lacks is deleted.
_MANAGED = ("data/", "meta/", "videos/")
# Where download_lerobot puts its regular-file views, inside the cached repo's folder.
_VIEWS = "torchstore-views"


# --------------------------------------------------------------------------- helpers
def is_lerobot_dataset(path: str | os.PathLike) -> bool:
    """True if ``path`` is a folder holding ``meta/info.json`` (any codebase version)."""
    return (Path(path) / INFO).is_file()


def _client(repo_id: str, endpoint: str | None, token: str | None) -> HubClient:
    """A HubClient for the repo's namespace (its ``_call`` translates and redacts errors)."""
    parts = repo_id.split("/") if isinstance(repo_id, str) else []
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo_id ({repo_id!r}) must be 'namespace/name'")
    return HubClient(parts[0], repo_type="dataset", endpoint=endpoint, token=token)


def _read_info(path: Path, where: str) -> dict[str, Any]:
    """info.json as a dict, checked to be a v3.x dataset's (else LeRobotFormatError)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LeRobotFormatError(f"{where} is not a LeRobot dataset: {INFO} is missing") from None
    except ValueError as exc:  # bad JSON or bad UTF-8
        raise LeRobotFormatError(f"{where}/{INFO} is not valid JSON: {exc}") from None
    if not isinstance(info, dict):
        raise LeRobotFormatError(
            f"{where}/{INFO} must hold a JSON object, got {type(info).__name__}"
        )
    version = info.get("codebase_version")
    if not isinstance(version, str) or not version.startswith("v3."):
        raise LeRobotFormatError(
            f"{where}/{INFO} has codebase_version {version!r}; push_to_hub uploads LeRobot v3.x "
            "datasets only (convert v2.x with lerobot's v2.1 -> v3.0 converter first)"
        )
    return info


def _quiet(progress: bool):
    """A context that silences huggingface_hub's own bars unless ``progress``."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

    if progress or are_progress_bars_disabled():
        return contextlib.nullcontext()
    return disable_progress_bars()


# --------------------------------------------------------------------------- snapshot
def _complete_files(root: Path, push_videos: bool) -> list[str]:
    """Relative paths of every complete file under ``root``; refuses symlinks and specials."""
    found: list[str] = []

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = prefix + entry.name
                if is_scratch(rel) or (not push_videos and rel.split("/")[0] == "videos"):
                    continue
                if rel == _CARD:  # replaced by the card push_to_hub writes
                    continue
                if entry.is_symlink():
                    raise LeRobotFormatError(
                        f"{rel} in {root} is a symlink; push_to_hub uploads regular files only "
                        "(replace it with the file it points to)"
                    )
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    walk(Path(entry.path), rel + "/")
                elif stat.S_ISREG(mode):
                    found.append(rel)
                else:
                    raise LeRobotFormatError(f"{rel} in {root} is not a regular file")

    walk(root, "")
    return found


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst, follow_symlinks=False)


@contextlib.contextmanager
def _snapshot(root: Path, push_videos: bool) -> Iterator[tuple[Path, list[str]]]:
    """A private staging folder of hard links to the complete files, taken under the writer lock.

    The writer replaces files by renaming new ones into place, so a link keeps the state
    the lock guarded; the folder sits next to ``root`` (same filesystem) and is removed on exit.
    """
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.push-", dir=root.parent))
    except OSError:  # a read-only parent: stage elsewhere (copies instead of links)
        staging = Path(tempfile.mkdtemp(prefix=f"torchstore-{root.name}.push-"))
    try:
        with writer_lock(root, shared=True):
            files = _complete_files(root, push_videos)
            for rel in files:
                _link_or_copy(root / rel, staging / rel)
        for rel in files:
            if rel.endswith(".parquet"):
                check_footer(staging / rel, what=f"{rel} in {root}")
        yield staging, files
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------- card
def _yaml_str(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (no YAML library needed)."""
    out = []
    for ch in str(text):
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= code < 127:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def dataset_card(
    info: Mapping, repo_id: str, *, license: str = "apache-2.0", tags: Sequence[str] = ()
) -> str:
    """The ``README.md`` text for a pushed dataset: Hub metadata, a summary and the full info.json.

    The front matter carries what the Hub and lerobot look for: ``license``, the
    ``LeRobot`` tag, ``task_categories: robotics`` and a ``configs`` entry pointing the
    dataset viewer at ``data/*/*.parquet``.
    """
    if isinstance(tags, str):
        raise TypeError("tags must be a sequence of strings, not one string")
    all_tags = list(dict.fromkeys(["LeRobot", *map(str, tags)]))
    front = [
        "---",
        f"license: {_yaml_str(license)}",
        "tags:",
        *(f"- {_yaml_str(t)}" for t in all_tags),
        "task_categories:",
        "- robotics",
        "configs:",
        "- config_name: default",
        '  data_files: "data/*/*.parquet"',
        "---",
    ]
    body = json.dumps(dict(info), indent=4, ensure_ascii=False)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", body)), default=0))
    version = info.get("codebase_version", CODEBASE_VERSION)
    lines = [
        *front,
        "",
        f"# {repo_id}",
        "",
        "This dataset was made with torchstore in the "
        f"[LeRobot](https://github.com/huggingface/lerobot) {version} format; lerobot loads it "
        f"with `LeRobotDataset({repo_id!r})`.",
        "",
        f"- Robot type: {info.get('robot_type') or 'unknown'}",
        f"- Episodes: {info.get('total_episodes', 'unknown')}",
        f"- Frames: {info.get('total_frames', 'unknown')}",
        f"- Tasks: {info.get('total_tasks', 'unknown')}",
        f"- FPS: {info.get('fps', 'unknown')}",
        "",
        "## Dataset Structure",
        "",
        f"[meta/info.json]({INFO}):",
        f"{fence}json",
        body,
        fence,
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- push
def push_to_hub(
    root: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    branch: str | None = None,
    tags: Sequence[str] = (),
    license: str = "apache-2.0",
    push_videos: bool = True,
    tag_version: bool = True,
    commit_message: str | None = None,
    progress: bool = True,
) -> str:
    """Upload a LeRobot v3.0 folder to a dataset repo in one commit; returns the commit id.

    Scratch (``images/``, dot-files, temporary files) is never uploaded, nor ``videos/``
    with ``push_videos=False``. A ``README.md`` dataset card replaces any local one.
    Files under ``data/``, ``meta/`` (and ``videos/`` when pushed) that the repo holds
    but the folder no longer does are deleted in the same commit, so lerobot's
    ``data/*/*.parquet`` glob never meets a stale file. With ``tag_version`` the
    ``v3.0`` tag is moved to the new commit.

    Raises:
        LeRobotFormatError: not a v3.x dataset, a Parquet file without footer (not
            finalized), a symlink or special file inside ``root``. Nothing is uploaded.
        TransferError: the Hub refused or could not be reached.
    """
    hf = require_huggingface_hub()
    root = Path(root).resolve()
    client = _client(repo_id, endpoint, token)
    api, call = client._api, client._call
    _read_info(root / INFO, str(root))  # fail fast, before waiting for the writer
    with _snapshot(root, push_videos) as (staging, files), _quiet(progress):
        info = _read_info(staging / INFO, str(root))
        card = dataset_card(info, repo_id, license=license, tags=tags).encode()
        what = f"dataset repo {repo_id!r}"
        call(
            f"creating {what}",
            api.create_repo,
            repo_id,
            repo_type="dataset",
            private=private,
            exist_ok=True,
        )
        if branch:
            call(
                f"creating branch {branch!r} of {what}",
                api.create_branch,
                repo_id,
                branch=branch,
                repo_type="dataset",
                exist_ok=True,
            )
        head = call(
            f"reading branch {branch or 'main'!r} of {what}",
            api.repo_info,
            repo_id,
            repo_type="dataset",
            revision=branch,
        ).sha
        remote = call(
            f"listing the files of {what}",
            api.list_repo_files,
            repo_id,
            repo_type="dataset",
            revision=head,
        )
        owned = tuple(p for p in _MANAGED if push_videos or p != "videos/")
        stale = sorted(p for p in set(remote) - set(files) if p.startswith(owned))
        ops = _operations(
            hf, staging, files, card, stale, desc=f"hashing {repo_id}", progress=progress
        )
        message = commit_message or f"Upload LeRobot {info['codebase_version']} dataset"
        commit = call(
            f"committing {len(ops)} changes to {what}",
            api.create_commit,
            repo_id,
            ops,
            commit_message=message,
            repo_type="dataset",
            revision=branch,
            parent_commit=head,
        ).oid
        if tag_version:
            _move_tag(client, repo_id, CODEBASE_VERSION, commit)
    return commit


def _operations(
    hf, staging: Path, files: list[str], card: bytes, stale: list[str], *, desc: str, progress: bool
) -> list[Any]:
    """The commit: every staged file, the card, and deletions of stale files."""
    ops: list[Any] = []
    sizes = {rel: (staging / rel).stat().st_size for rel in files}
    with progress_bar(sum(sizes.values()), desc, enabled=progress) as bar:
        for rel in files:  # CommitOperationAdd reads the file once here, for its sha256
            ops.append(hf.CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(staging / rel)))
            bar.update(sizes[rel])
    ops.append(hf.CommitOperationAdd(path_in_repo=_CARD, path_or_fileobj=card))
    ops += [hf.CommitOperationDelete(path_in_repo=p) for p in stale]
    return ops


def _move_tag(client: HubClient, repo_id: str, tag: str, commit: str) -> None:
    """Point ``tag`` at ``commit``: delete it if present elsewhere, then create it.

    The Hub has no "move tag"; between the two calls the tag is briefly absent.
    """
    api, call = client._api, client._call
    refs = call(
        f"listing the refs of {repo_id!r}", api.list_repo_refs, repo_id, repo_type="dataset"
    )
    target = {t.name: t.target_commit for t in refs.tags}
    if target.get(tag) == commit:  # a no-op push: the tag is already right
        return
    if tag in target:
        try:
            call(
                f"deleting tag {tag!r} of {repo_id!r}",
                api.delete_tag,
                repo_id,
                tag=tag,
                repo_type="dataset",
            )
        except RemoteNotFoundError:  # deleted meanwhile by another push: same outcome
            pass
    call(
        f"tagging {commit[:12]} of {repo_id!r} as {tag!r}",
        api.create_tag,
        repo_id,
        tag=tag,
        revision=commit,
        repo_type="dataset",
    )


# --------------------------------------------------------------------------- revisions
def _version(name: str) -> tuple[int, int] | None:
    match = _VERSION.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def _pick_revision(names: Sequence[str], requested: str, repo_id: str, where: str) -> str:
    """lerobot's rule over ref names: the exact ref, else the highest same-major one below it."""
    if requested in names:
        return requested
    want = _version(requested) or (0, 0)  # callers pass a version
    versions = {n: v for n in names if (v := _version(n)) is not None}
    fitting = [n for n, v in versions.items() if v[0] == want[0] and v <= want]
    if fitting:
        return max(fitting, key=lambda n: (versions[n], n == requested))
    if not versions:
        raise LeRobotFormatError(
            f"dataset {repo_id!r} {where} must be tagged with a codebase version "
            f"(like {CODEBASE_VERSION!r}) for lerobot to load it; it has no version tag or "
            "branch. Push it with tag_version=True, or pass an explicit revision ('main')"
        )
    newest = max(versions, key=versions.__getitem__)
    if versions[newest][0] == 2 and want[0] == 3:
        raise LeRobotFormatError(
            f"dataset {repo_id!r} {where} is LeRobot {newest} (no v3.x tag): import_lerobot "
            f"reads it through its v2.1 path; pass revision={newest!r} (or 'main') to download it"
        )
    raise LeRobotFormatError(
        f"dataset {repo_id!r} {where} has no version <= {requested} with major "
        f"v{want[0]} (its versions: {', '.join(sorted(versions))}); pass revision={newest!r} "
        "to download that one"
    )


def resolve_lerobot_revision(
    repo_id: str,
    revision: str | None = None,
    *,
    endpoint: str | None = None,
    token: str | None = None,
) -> str:
    """The ref to download, chosen like lerobot: ``revision`` (default ``v3.0``) if it exists,
    else the highest ``vX.Y`` branch or tag with the same major and a minor <= the requested one.

    A revision that is not a version (a branch name, a commit id) is returned as is.

    Raises:
        LeRobotFormatError: no version tag at all, only v2.x tags, or only newer ones.
        RemoteNotFoundError: the repo does not exist.
    """
    requested = revision or CODEBASE_VERSION
    if _version(requested) is None:
        return requested
    client = _client(repo_id, endpoint, token)
    refs = client._call(
        f"listing the refs of dataset {repo_id!r}",
        client._api.list_repo_refs,
        repo_id,
        repo_type="dataset",
    )
    names = [r.name for r in (*refs.branches, *refs.tags)]
    return _pick_revision(names, requested, repo_id, "on the Hub")


# --------------------------------------------------------------------------- download
def _hub_cache(cache_dir: str | os.PathLike | None) -> Path:
    """The hub cache: ``cache_dir``, else the environment read now, else huggingface_hub's."""
    if cache_dir is not None:
        return Path(cache_dir)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expanduser(os.environ[var]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    return Path(hub_constants().HF_HUB_CACHE)


def _cached_revision(repo_id: str, revision: str | None, cache: Path) -> tuple[str | None, list]:
    """The revision to read from the cache (same rule over cached refs) and the cached refs.

    None when no cached ref can answer a version request (nothing cached, or only
    non-version refs such as ``main``).
    """
    from huggingface_hub.file_download import repo_folder_name

    refs = cache / repo_folder_name(repo_id=repo_id, repo_type="dataset") / "refs"
    names = sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file())
    requested = revision or CODEBASE_VERSION
    if _version(requested) is None:
        return requested, names
    if not any(_version(n) for n in names):
        return None, names
    return _pick_revision(names, requested, repo_id, f"in the local cache ({cache})"), names


def _regular_files_view(snapshot: Path) -> Path:
    """A folder of regular files mirroring a cached ``snapshots/<sha>`` folder.

    huggingface_hub's snapshot holds symlinks into the repo's ``blobs/``; torchstore's
    readers never follow a symlink out of a dataset folder, so they get this view
    instead: hard links to the same blobs (no extra disk space), next to ``snapshots/``
    in the cache, brought up to date on every call.
    """
    if snapshot.parent.name != "snapshots":  # not huggingface_hub's cache layout
        return snapshot
    repo_folder = snapshot.parent.parent
    view = repo_folder / _VIEWS / snapshot.name
    real_repo = os.path.realpath(repo_folder)
    for dirpath, _dirs, names in os.walk(snapshot):
        for name in names:
            src = Path(dirpath) / name
            real = os.path.realpath(src)
            if os.path.commonpath([real_repo, real]) != real_repo:
                raise TransferError(f"{src} points outside the cached repo ({real})")
            dst = view / src.relative_to(snapshot)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samefile(dst, real) and not dst.is_symlink():
                    continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{name}.{uuid.uuid4().hex}.tmp")
            _link_or_copy(Path(real), tmp)
            os.replace(tmp, dst)  # atomic: a concurrent reader sees the old or new link
    view.mkdir(parents=True, exist_ok=True)
    return view


def _is_offline() -> bool:
    return (
        bool(hub_constants().HF_HUB_OFFLINE)
        or env_flag("HF_HUB_OFFLINE")
        or env_flag("TORCHSTORE_OFFLINE")
    )


def download_lerobot(
    repo_id: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    allow_patterns: str | Sequence[str] | None = None,
    progress: bool = True,
) -> Path:
    """Download a LeRobot dataset repo into huggingface_hub's cache; returns the local folder.

    The revision is resolved by :func:`resolve_lerobot_revision` (default: the ``v3.0``
    tag). With ``HF_HUB_OFFLINE`` set nothing touches the network: the same rule picks
    among the refs already in the cache, and the cached snapshot is returned; the same
    happens, with a warning, when the Hub cannot be reached.

    The returned folder holds regular files, not huggingface_hub's symlinks: hard links
    to the cache's blobs in ``<repo folder>/torchstore-views/<commit>`` (no extra disk
    space), so readers that never follow symlinks out of a dataset (torchstore's) can
    read it. Delete the cached repo folder to free the space of both.

    Raises:
        RemoteNotFoundError: the repo (or the revision) does not exist on the Hub.
        TransferError: offline and not in the cache, or the download failed.
        LeRobotFormatError: the repo has no usable version tag (see resolve_lerobot_revision).
    """
    hf = require_huggingface_hub()
    client = _client(repo_id, endpoint, token)
    cache = _hub_cache(cache_dir)
    patterns = [allow_patterns] if isinstance(allow_patterns, str) else allow_patterns
    patterns = list(patterns) if patterns is not None else None
    if _is_offline():
        return _from_cache(hf, client, repo_id, revision, cache, patterns)
    try:
        ref = resolve_lerobot_revision(repo_id, revision, endpoint=client.endpoint, token=token)
    except RemoteNotFoundError:
        raise
    except TransferError as exc:  # the Hub is unreachable: like huggingface_hub, use the cache
        try:
            folder = _from_cache(hf, client, repo_id, revision, cache, patterns)
        except (TransferError, LeRobotFormatError):
            raise exc from None
        log.warning("%s; using the cached copy at %s", exc, folder)
        return folder
    with _quiet(progress):
        folder = client._call(
            f"downloading dataset {repo_id!r} at {ref!r}",
            hf.snapshot_download,
            repo_id,
            repo_type="dataset",
            revision=ref,
            cache_dir=cache,
            endpoint=client.endpoint,
            token=token,
            allow_patterns=patterns,
        )
    return _regular_files_view(Path(folder))


def _from_cache(hf, client: HubClient, repo_id, revision, cache: Path, patterns) -> Path:
    """The cached snapshot for ``revision``, without any request."""
    ref, cached = _cached_revision(repo_id, revision, cache)
    why = "HF_HUB_OFFLINE is set; download it once with the network on (unset HF_HUB_OFFLINE)"
    if ref is None and cached:
        raise TransferError(
            f"dataset {repo_id!r} has no version ref in the huggingface_hub cache ({cache}), "
            f"only {', '.join(cached)} (pass one as revision=), and {why}"
        )
    if ref is None:
        raise TransferError(
            f"dataset {repo_id!r} is not in the huggingface_hub cache ({cache}) and {why}"
        )
    try:
        folder = hf.snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=ref,
            cache_dir=cache,
            endpoint=client.endpoint,
            local_files_only=True,
            allow_patterns=patterns,
        )
    except hub_errors().LocalEntryNotFoundError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TransferError(
            f"dataset {repo_id!r} at {ref!r} is not (completely) in the huggingface_hub cache "
            f"({cache}) and {why}: {first}"
        ) from None
    return _regular_files_view(Path(folder))
