"""The ``torchstore catalog|pull|push|sync|prune|remote index|datasets|list|project``
subcommands (argparse only).

``torchstore/cli/main.py`` wires them in with ``add_commands(sub)``; every handler parses
nothing itself and calls one library function. Plain ``ValueError``s (a malformed
location, an unknown kind) are re-raised as :class:`~torchstore.errors.TorchstoreError`
so the CLI prints them as one line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import wraps

from torchstore.cli import args as types
from torchstore.errors import TorchstoreError

__all__ = ["add_commands"]


def _one_line_errors(
    fn: Callable[[argparse.Namespace], None],
) -> Callable[[argparse.Namespace], None]:
    @wraps(fn)
    def run(args: argparse.Namespace) -> None:
        try:
            fn(args)
        except TorchstoreError:
            raise
        except ValueError as exc:
            raise TorchstoreError(str(exc)) from exc

    return run


@_one_line_errors
def _catalog(args: argparse.Namespace) -> None:
    from torchstore.remote import RemoteCatalog, format_catalog

    catalog = RemoteCatalog(args.location)
    if args.json:
        print(json.dumps([{**e.to_dict(), "commit": e.commit} for e in catalog], indent=1))
    else:
        print(format_catalog(catalog, files=args.files))


@_one_line_errors
def _pull(args: argparse.Namespace) -> None:
    from torchstore.remote import pull

    offline = True if args.offline else None
    print(
        pull(
            args.location,
            args.name,
            cache_dir=args.cache_dir,
            revision=args.revision,
            offline=offline,
            progress=not args.no_progress,
            timeout=args.timeout,
            deadline_s=args.deadline,
        )
    )


@_one_line_errors
def _push(args: argparse.Namespace) -> None:
    if args.name is None:
        _push_lerobot(args)
        return
    from torchstore.remote.upload import push_folder

    done = push_folder(
        args.dir,
        args.location,
        args.name,
        kind=args.kind,
        replace=args.replace,
        progress=not args.no_progress,
    )
    entry = done.entry
    if done.up_to_date:
        print(
            f"{entry.name} is up to date at {args.location} (revision "
            f"{(entry.commit or entry.revision)[:12]}): nothing sent"
        )
        return
    print(
        f"pushed {entry.name} ({entry.kind}, {len(entry.files)} files, {entry.size} bytes) to "
        f"{args.location} (revision {(entry.commit or entry.revision)[:12]})"
    )


def _push_lerobot(args: argparse.Namespace) -> None:
    from torchstore.lerobot import is_lerobot_dataset, push_to_hub
    from torchstore.remote.location import OfflineError, is_offline

    if is_offline():
        raise OfflineError(
            f"offline mode: pushing to the Hub repo {args.location} needs the network "
            "(HF_HUB_OFFLINE or TORCHSTORE_OFFLINE is set)"
        )
    if not is_lerobot_dataset(args.dir):
        raise TorchstoreError(
            f"{args.dir} is not a LeRobot dataset (no meta/info.json); to push a folder as an "
            "entry, give LOCATION and NAME"
        )
    commit = push_to_hub(
        args.dir,
        args.location,
        private=args.private,
        branch=args.branch,
        progress=not args.no_progress,
    )
    print(
        f"pushed LeRobot dataset {args.dir} to {args.location} (commit {commit[:12]}, tagged v3.0)"
    )


@_one_line_errors
def _sync(args: argparse.Namespace) -> None:
    from torchstore.remote import sync_recording

    result = sync_recording(
        args.dir,
        args.location,
        args.name,
        snapshot_live_stores=not args.no_snapshot,
        min_age_s=args.min_age,
        keep=args.keep,
        progress=not args.no_progress,
    )
    print(
        f"synced {args.name}: {len(result.uploaded)} uploaded, {len(result.unchanged)} unchanged, "
        f"{len(result.skipped)} not complete yet"
    )
    for rel, reason in result.skipped:
        print(f"  waiting: {rel} ({reason})")
    for note in result.notes:
        print(f"  note: {note}")


@_one_line_errors
def _prune(args: argparse.Namespace) -> None:
    from torchstore.remote.upload import prune

    done = prune(args.location, args.name, keep=args.keep)
    if not done.dropped:
        print(
            f"{args.name} has {len(done.entry.revisions)} revision(s) at {args.location}: "
            "nothing to prune"
        )
        return
    print(
        f"pruned {len(done.dropped)} revision(s) of {args.name} at {args.location}: kept "
        f"{len(done.entry.revisions)}, deleted {len(done.deleted)} file(s) no kept revision uses"
    )
    if done.left:  # every one, one a line: what to delete by hand (no listed revision uses it)
        print(
            f"  {len(done.left)} such file(s) left in place ({args.location} did not delete "
            "them; no listed revision uses them, so they are safe to delete by hand):"
        )
        for at in done.left:
            print(f"    {args.name}/{at}")


@_one_line_errors
def _remote_index(args: argparse.Namespace) -> None:
    from torchstore.remote import write_index

    kinds = {}
    for item in args.kind or []:
        name, sep, kind = item.partition("=")
        if not sep or not name:
            raise TorchstoreError(f"--kind ({item!r}) must be NAME=KIND")
        kinds[name] = kind
    print(f"wrote {write_index(args.dir, kinds=kinds)}")


@_one_line_errors
def _datasets(args: argparse.Namespace) -> None:
    from torchstore.datasets import resolve, store_file

    resolved = resolve(
        args.name,
        cache_dir=args.cache_dir,
        offline=True if args.offline else None,
        refresh=args.refresh,
        progress=not args.no_progress,
        timeout=args.timeout,
    )
    path = store_file(resolved, args.file)
    if args.path:
        print(path)
        return
    from torchstore.data.store.store import TrajectoryStore

    with TrajectoryStore(path) as store:
        episodes, rows = store.num_episodes, store.num_rows
    doc = {
        "name": resolved.name,
        "pinned": resolved.pinned,
        "location": resolved.location,
        "from": resolved.source,
        "store": str(path),
        "episodes": episodes,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(
        f"{resolved.name}: {episodes} episodes, {rows} rows in {path}\n"
        f"  from {resolved.location} ({'the cache' if resolved.source == 'cache' else 'pulled'}), "
        f"revision {resolved.revision[:12]}; open with torchstore.load({resolved.pinned!r})"
    )


@_one_line_errors
def _list(args: argparse.Namespace) -> None:
    from torchstore.datasets import format_local, local_datasets

    found = local_datasets(args.cache_dir)
    if args.json:
        print(json.dumps([d.to_dict() for d in found], indent=1))
    else:
        print(format_local(found, args.cache_dir))


@_one_line_errors
def _project_push(args: argparse.Namespace) -> None:
    if args.dry_run:
        _project_push_dry_run(args)
        return
    from torchstore.project import push_project

    done = push_project(
        args.dir,
        args.location,
        args.name,
        datasets=args.dataset or (),
        replace=args.replace,
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
    )
    entry = done.entry
    print("\n".join(done.listing.lines()))
    state = "is up to date" if done.up_to_date else "pushed"
    print(
        f"project {args.name} {state} at {args.location} (revision "
        f"{(entry.commit or entry.revision)[:12]}, {len(entry.files)} files, {entry.size} bytes)"
    )
    for ds in done.manifest.datasets:
        print(f"  dataset {ds.name}@{ds.revision[:12]} from {ds.location}")
    for run in done.manifest.runs:
        print(f"  run {run.path}")


def _project_push_dry_run(args: argparse.Namespace) -> None:
    """What ``project push`` would bundle and leave out; reads the project and cache only."""
    from torchstore.project import plan_project
    from torchstore.remote.location import parse_location

    parse_location(args.location)  # a malformed location fails here as it would in a push
    plan = plan_project(args.dir, args.name, cache_dir=args.cache_dir)
    print("\n".join(plan.listing.lines()))
    print(
        f"dry run: nothing pushed to {args.location}; project {args.name} would be "
        f"{len(plan.listing.bundled)} files ({plan.listing.size} bytes) and its manifest"
    )
    for ds in plan.manifest.datasets:
        print(f"  dataset {ds.name}@{ds.revision[:12]} from {ds.location}")
    for wanted in args.dataset or ():
        print(f"  dataset {wanted} (--dataset: resolved and pinned by the push)")
    for run in plan.manifest.runs:
        print(f"  run {run.path}")


@_one_line_errors
def _project_pull(args: argparse.Namespace) -> None:
    from torchstore.project import pull_project

    done = pull_project(
        args.location,
        args.name,
        args.dest,
        cache_dir=args.cache_dir,
        offline=True if args.offline else None,
        progress=not args.no_progress,
    )
    print(f"pulled project {done.manifest.name} ({done.files} files) into {done.path}")
    for ds in done.manifest.datasets:
        print(f"  dataset {ds.name}@{ds.revision[:12]} in {done.path / 'datasets' / ds.name}")
    for line in done.commands():
        print(f"  reproduce (in {done.path}): {line}")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``catalog``, ``pull``, ``push``, ``sync``, ``prune``, ``remote index``,
    ``datasets``, ``list`` and ``project push|pull`` to a subparser set."""
    p = sub.add_parser(
        "catalog", help="list what a location holds: name, kind, files, size, sha256"
    )
    p.add_argument(
        "location",
        help="hf://datasets/NS, hf://models/NS, http(s)://..., a folder or an fsspec URL",
    )
    p.add_argument("--files", action="store_true", help="also list every file with its sha256")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_catalog)

    p = sub.add_parser("pull", help="download an entry into the cache (resumable, sha256-verified)")
    p.add_argument("location", help="where the entry is (see torchstore catalog --help)")
    p.add_argument(
        "name",
        help="the entry's name (torchstore catalog LOCATION lists them); NAME@REVISION pulls "
        "an earlier revision",
    )
    _cache_dir_option(p)
    p.add_argument(
        "--revision", default=None, help="Hub branch/tag/commit, or an index entry revision prefix"
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="answer network locations from the cache only (local folders are read as usual)",
    )
    _timeout_option(p)
    p.add_argument(
        "--deadline",
        type=types.finite_float(0.0, 365 * 24 * 3600.0),
        default=None,
        metavar="SECONDS",
        help="give up once the whole pull has taken this long (what it fetched is kept, a "
        "later pull resumes); default: no deadline",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_pull)

    p = sub.add_parser(
        "push",
        help=(
            "upload a folder as one entry (index updated last); "
            "DIR REPO_ID pushes a LeRobot dataset"
        ),
    )
    p.add_argument("dir", type=types.existing_folder, help="the folder to upload")
    p.add_argument("location", help="a location; or, for a LeRobot dataset folder, a Hub repo id")
    p.add_argument(
        "name", nargs="?", default=None, help="the entry name (omit for a LeRobot dataset)"
    )
    p.add_argument("--private", action="store_true", help="LeRobot push: create the repo private")
    p.add_argument("--branch", default=None, help="LeRobot push: the branch to push to")
    p.add_argument(
        "--kind",
        default="dataset",
        choices=("dataset", "recording", "assets", "policy"),
        help="what the entry holds (policy: safetensors weights, checked before upload)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="publish over an existing entry of other content, as its new revision (the "
        "replaced one stays pullable as NAME@REVISION until pruned)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_push)

    p = sub.add_parser(
        "sync", help="upload the complete, new files of a recording still being written"
    )
    p.add_argument("dir", type=types.existing_folder, help="the recording folder")
    p.add_argument("location", help="where to upload (see torchstore catalog --help)")
    p.add_argument("name", help="the entry's name at LOCATION")
    p.add_argument(
        "--min-age",
        type=types.finite_float(0.0, 365 * 24 * 3600.0, low_inclusive=True),
        default=0.0,
        help="skip files modified in the last N seconds",
    )
    p.add_argument(
        "--no-snapshot",
        action="store_true",
        help="skip live HDF5 stores instead of uploading a snapshot",
    )
    p.add_argument(
        "--keep",
        type=types.positive_int,
        default=None,
        help="after syncing, prune all but the newest N revisions of the entry (each sync "
        "of a growing store adds one); default: keep every revision",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_sync)

    p = sub.add_parser(
        "prune", help="drop an entry's earlier revisions at an index location (and their bytes)"
    )
    p.add_argument("location", help="an HTTP, folder or fsspec location")
    p.add_argument("name", help="the entry's name at LOCATION")
    p.add_argument(
        "--keep",
        type=types.positive_int,
        default=1,
        help="revisions to keep, newest first, the latest included",
    )
    p.set_defaults(func=_prune)

    p = sub.add_parser(
        "remote",
        help="prepare a folder to be served as a location (over HTTP, fsspec or as a folder): "
        "'remote index DIR' writes the index.json that lists its entries",
    )
    remote = p.add_subparsers(dest="remote_command", required=True, metavar="SUBCOMMAND")
    q = remote.add_parser("index", help="write DIR/index.json listing every sub-folder as an entry")
    q.add_argument("dir", type=types.existing_folder, help="the folder to index")
    q.add_argument(
        "--kind", action="append", metavar="NAME=KIND", help="set an entry's kind (repeatable)"
    )
    q.set_defaults(func=_remote_index)

    _add_dataset_commands(sub)


def _cache_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        type=types.folder_path,
        default=None,
        help="default: $TORCHSTORE_CACHE or ~/.cache/torchstore",
    )


def _timeout_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=types.finite_float(0.0, 24 * 3600.0),
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a server each time",
    )


def _add_dataset_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "datasets",
        help="find a dataset by name (the cache, then $TORCHSTORE_LOCATIONS and "
        "~/.config/torchstore/locations, then the Hub), pull it and say where it is",
    )
    p.add_argument(
        "name", help="NAME, NAME@REVISION, or a Hub id NAMESPACE/NAME (what torchstore.load takes)"
    )
    p.add_argument("--file", default=None, help="the store in the entry, when it holds several")
    _cache_dir_option(p)
    p.add_argument(
        "--offline", action="store_true", help="only the cache and local folders, no network"
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="ask the locations for the latest revision even when the cache has the name",
    )
    _timeout_option(p)
    p.add_argument("--path", action="store_true", help="print only the store's path")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(
        func=_datasets,
        interrupted_line="interrupted; verified files stay in the cache, run the same command "
        "again to continue",
    )

    p = sub.add_parser(
        "list", help="the datasets in the local cache, with episodes, size and revision"
    )
    _cache_dir_option(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_list)

    p = sub.add_parser(
        "project",
        help="push or pull a training project: configs, recipes, runs with their "
        "safetensors policies, and the datasets they used pinned by revision",
    )
    project = p.add_subparsers(dest="project_command", required=True, metavar="SUBCOMMAND")
    q = project.add_parser(
        "push",
        help="bundle a project folder and publish it as one entry; prints what it bundles "
        "and what it leaves out, with the rule",
    )
    q.add_argument(
        "dir", type=types.existing_folder, help="the project: configs/, recipes/, outputs/"
    )
    q.add_argument("location", help="where to publish (see torchstore catalog --help)")
    q.add_argument("name", help="the project's entry name at LOCATION")
    q.add_argument(
        "--dataset",
        action="append",
        metavar="NAME[@REVISION]",
        help="a dataset the project uses besides those its runs name (repeatable; pinned)",
    )
    q.add_argument(
        "--replace",
        action="store_true",
        help="publish over an existing entry of other content, as its new revision",
    )
    q.add_argument(
        "--dry-run",
        action="store_true",
        help="print what push would bundle and leave out, and push nothing (reads the "
        "project and the cache only)",
    )
    _cache_dir_option(q)
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(
        func=_project_push,
        interrupted_line="interrupted; the index is written last, so the entry is as it was; "
        "run the same command again to continue",
    )

    q = project.add_parser("pull", help="restore a project and the exact dataset revisions it pins")
    q.add_argument("location", help="where the project is")
    q.add_argument("name", help="the project's entry name; NAME@REVISION for an earlier one")
    q.add_argument(
        "dest",
        nargs="?",
        type=types.output_folder,
        default=None,
        help="the folder to create (must not exist, or be empty); default: ./NAME",
    )
    _cache_dir_option(q)
    q.add_argument(
        "--offline", action="store_true", help="answer network locations from the cache only"
    )
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(
        func=_project_pull,
        interrupted_line="interrupted; nothing was placed at the destination, verified files "
        "stay in the cache, run the same command again to continue",
    )
