"""Project bundles: a training project pushed and pulled as one verified entry.

A project folder (``DIR``) is laid out like this repository's training side::

    DIR/configs/...                  the Hydra config tree          (bundled, required)
    DIR/recipes/...                  the recipe scripts             (bundled, required)
    DIR/outputs/<recipe>/<time>/     recipe runs: config.yaml, metrics.csv, loss.png,
                                     <recipe>.log, policy.safetensors (bundled: every
                                     folder under outputs/ holding config.yaml)
    DIR/datasets/<name>/             the datasets, as ``project pull`` places them
                                     (never bundled: they travel by name and revision);
    DIR/datasets/<name>.h5           for a LeRobot or Minari dataset, also the store
                                     ``torchstore.load`` imports it into

    DIR/**/*.safetensors             weights anywhere else in the project, e.g.
                                     ``weights/policy.safetensors`` (bundled)

Nothing else in ``DIR`` is bundled: other folders and files, hidden ones (``.git/``), a
run's ``.hydra/`` record, ``__pycache__``, scratch files and virtual environments are
left out, and :class:`ProjectListing` (what ``torchstore project push`` prints, and
``--dry-run`` prints without pushing) names each with the rule that left it out.
Datasets are named, not copied: the bundle pins each one by location, name and revision,
so ``project pull`` fetches exactly the bytes the runs were trained on (verified by
sha256, like any pull).

**Which datasets.** Every path into the torchstore cache that a run's ``config.yaml``
holds (a recipe run on ``store.path=$(torchstore datasets NAME --path)``, or on
``torchstore.load("NAME").path``) names its dataset: the cache record says where it came
from and the revision is pinned. ``--dataset NAME[@REVISION]`` (``datasets=``) adds
others. In the bundled ``config.yaml`` files and run commands those paths become
project-relative, ``datasets/<name>/<file>`` (``datasets/<name>.h5`` for the store
``torchstore.load`` imported from a LeRobot or Minari dataset), which is where
``project pull`` places them;
recipes resolve relative paths against the project, so the pulled runs roll out and the
recorded commands run as they are.

**The manifest** (``torchstore-project.json`` at the bundle's root; the one place the
format is defined)::

    {
      "format": "torchstore-project",
      "version": 1,
      "name": "reach-bc",
      "datasets": [
        {"name": "reach-demo", "location": "http://host/base",
         "revision": "<the index revision (64 hex) or Hub commit (40 hex)>"}
      ],
      "runs": [
        {"path": "outputs/bc/2026-01-01_12-00-00", "recipe": "bc",
         "command": ["python", "recipes/bc.py", "trainer.max_steps=20", "..."]}
      ]
    }

``command`` is the recipe and the run's Hydra overrides (from ``.hydra/overrides.yaml``),
or null when the run folder does not say them. Unknown keys are ignored; a higher
``version`` is refused.

**Rules** (the remote-dataset rules, plus): no pickle-based file (``.pt``, ``.pth``,
``.bin``, ``.pkl``, ``.pickle``, ``.ckpt``) is bundled or pulled, since loading one runs code
(in ``configs/``, ``recipes/`` or ``outputs/`` one refuses the push; elsewhere it is left
out, and listed; so is a recipe run's resume checkpoint, ``outputs/**/last.ckpt``);
policy weights are safetensors, each checked fully
(:func:`~torchstore.remote.weights.check_safetensors`) on push and again on pull; HDF5
stores are refused in the bundled folders (push them as datasets); symlinks are refused;
every path is checked to stay inside the project. The bundle is an ``assets`` entry at
the location: pushing a name that holds other content needs ``replace=True`` and keeps
the old revision pullable (``NAME@REVISION``). Pull fetches everything into the cache
first and builds the project next to ``DEST``, renaming it into place only when
complete: a failed pull leaves no ``DEST``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchstore.errors import (
    DestinationExistsError,
    ProjectError,
    StoreFormatError,
)
from torchstore.io.paths import check_name, check_relpath, make_dirs_inside, resolve_inside
from torchstore.io.remote.checksum import sha256_file
from torchstore.io.remote.transfer import progress_bar
from torchstore.project.survey import (
    DATASETS_DIR,
    MANIFEST_NAME,
    WEIGHTS_SUFFIX,
    ProjectListing,
    project_refusal,
    survey,
)
from torchstore.remote.backend import open_backend
from torchstore.remote.cache import _Cache, _offline, default_cache_dir, pull_entry, split_revision
from torchstore.remote.index import RemoteEntry, RemoteFile
from torchstore.remote.location import parse_location
from torchstore.remote.weights import check_safetensors
from torchstore.validation import positive_int

__all__ = [
    "push_project",
    "plan_project",
    "pull_project",
    "ProjectListing",
    "ProjectPlan",
    "ProjectManifest",
    "ProjectDataset",
    "ProjectRun",
    "PulledProject",
    "PushedProject",
    "ProjectError",
    "MANIFEST_NAME",
    "PROJECT_FORMAT",
    "PROJECT_VERSION",
]

log = logging.getLogger(__name__)

PROJECT_FORMAT = "torchstore-project"
PROJECT_VERSION = 1
REQUIRED = ("configs", "recipes")
STORES_DIR = ".stores"  # where torchstore.load keeps stores imported from LeRobot/Minari entries
IMPORTED = "\0imported"  # marks a path to such a store
_REVISION = re.compile(r"[0-9a-f]{7,64}")
_MAX_MANIFEST = 16 << 20


@dataclass(frozen=True)
class ProjectDataset:
    """A dataset a project was trained on, pinned: ``location``, ``name@revision``."""

    name: str
    location: str
    revision: str

    @property
    def pinned(self) -> str:
        return f"{self.name}@{self.revision}"


@dataclass(frozen=True)
class ProjectRun:
    """A recipe run in the bundle: its folder, recipe and the command that made it."""

    path: str
    recipe: str | None
    command: tuple[str, ...] | None


@dataclass(frozen=True)
class ProjectManifest:
    """The parsed ``torchstore-project.json``."""

    name: str
    datasets: tuple[ProjectDataset, ...] = ()
    runs: tuple[ProjectRun, ...] = ()

    def to_json(self) -> bytes:
        doc = {
            "format": PROJECT_FORMAT,
            "version": PROJECT_VERSION,
            "name": self.name,
            "datasets": [
                {"name": d.name, "location": d.location, "revision": d.revision}
                for d in self.datasets
            ],
            "runs": [
                {
                    "path": r.path,
                    "recipe": r.recipe,
                    "command": list(r.command) if r.command is not None else None,
                }
                for r in self.runs
            ],
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, *, source: str = MANIFEST_NAME) -> ProjectManifest:
        """Check a manifest from anywhere (a remote is untrusted) and return it."""

        def bad(why: str) -> StoreFormatError:
            return StoreFormatError(f"{source}: {why}")

        if len(data) > _MAX_MANIFEST:
            raise bad(f"{len(data)} bytes, more than a manifest may have")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise bad(f"not valid JSON ({str(exc)[:80]})") from None
        if not isinstance(doc, dict) or doc.get("format") != PROJECT_FORMAT:
            raise bad(f"format must be {PROJECT_FORMAT!r}")
        version = doc.get("version")
        positive_int(f"{source}: version", version, error=StoreFormatError)
        if version > PROJECT_VERSION:
            raise bad(
                f"version {version}; this torchstore reads up to {PROJECT_VERSION}: "
                "upgrade torchstore"
            )
        name = check_name(doc.get("name"), subject=f"{source} name")
        raw_datasets, raw_runs = doc.get("datasets", []), doc.get("runs", [])
        if not isinstance(raw_datasets, list) or not isinstance(raw_runs, list):
            raise bad("datasets and runs must be lists")
        datasets = [_parse_dataset(d, i, source, bad) for i, d in enumerate(raw_datasets)]
        if len({d.name for d in datasets}) != len(datasets):
            raise bad("a dataset is listed twice")
        runs = [_parse_run(r, i, source, bad) for i, r in enumerate(raw_runs)]
        return cls(name, tuple(datasets), tuple(runs))


def _parse_dataset(d: Any, i: int, source: str, bad: Callable[[str], Exception]) -> ProjectDataset:
    """Manifest entry ``i`` of ``datasets``, checked."""
    if not isinstance(d, dict):
        raise bad(f"dataset {i} must be an object")
    ds_name = check_name(d.get("name"), subject=f"{source} dataset {i} name")
    location, revision = d.get("location"), d.get("revision")
    if not isinstance(location, str):
        raise bad(f"dataset {ds_name!r}: location must be a string")
    try:
        location = parse_location(location).raw
    except ValueError as exc:
        raise bad(f"dataset {ds_name!r}: {exc}") from None
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision):
        raise bad(f"dataset {ds_name!r}: revision ({revision!r}) must be 7-64 lowercase hex")
    return ProjectDataset(ds_name, location, revision)


def _parse_run(r: Any, i: int, source: str, bad: Callable[[str], Exception]) -> ProjectRun:
    """Manifest entry ``i`` of ``runs``, checked."""
    if not isinstance(r, dict):
        raise bad(f"run {i} must be an object")
    path = check_relpath(r.get("path"), subject=f"{source} run {i} path")
    recipe = r.get("recipe")
    if recipe is not None:
        recipe = check_name(recipe, subject=f"{source} run {i} recipe")
    command = r.get("command")
    if command is not None and (
        not isinstance(command, list) or not all(isinstance(a, str) for a in command)
    ):
        raise bad(f"run {path!r}: command must be a list of strings or null")
    return ProjectRun(path, recipe, tuple(command) if command is not None else None)


# ----------------------------------------------------------------- push
def _cached_dataset(cache_root: Path, value: str) -> tuple[ProjectDataset, str] | None:
    """``(dataset, path inside the entry)`` if ``value`` is a path into an entry in the cache."""
    if not value.startswith("/"):
        return None
    try:
        rel = Path(os.path.abspath(value)).relative_to(os.path.abspath(cache_root))
    except ValueError:
        return None
    parts = rel.parts
    if len(parts) == 3 and parts[1] == STORES_DIR:
        return _imported_dataset(cache_root, parts[0], parts[2])
    if len(parts) < 3 or parts[1].startswith("."):
        return None
    slug, name, inner = parts[0], parts[1], "/".join(parts[2:])
    try:
        record = json.loads((cache_root / slug / ".records" / f"{name}.json").read_text())
        loc = parse_location(record["location"])
        cache = _Cache(cache_root, loc, name)
        if cache.base.name != slug:
            return None
        _, entry = _offline(cache, None, None)
    except Exception as exc:  # noqa: BLE001 - not a complete cached entry: not a dataset reference
        log.debug("%s is not a complete cached entry: %s", value, exc)
        return None
    return ProjectDataset(name, loc.raw, entry.commit or entry.revision), inner


def _imported_dataset(
    cache_root: Path, slug: str, filename: str
) -> tuple[ProjectDataset, str] | None:
    """The dataset behind a store ``torchstore.load`` imported (``.stores/<name>-<rev>.h5``)."""
    stem, dot, suffix = filename.rpartition(".")
    name, dash, rev = stem.rpartition("-")
    if not (dot and dash and suffix == "h5"):
        return None
    try:
        record = json.loads((cache_root / slug / ".records" / f"{name}.json").read_text())
        loc = parse_location(record["location"])
        cache = _Cache(cache_root, loc, name)
        if cache.base.name != slug:
            return None
        _, entry = _offline(cache, None, None)
    except Exception:  # noqa: BLE001 - not a complete cached entry: not a dataset reference
        return None
    ds = ProjectDataset(name, loc.raw, entry.commit or entry.revision)
    if not ds.revision.startswith(rev):
        return None
    return ds, IMPORTED


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ProjectError(f"{path} is not readable YAML: {str(exc).splitlines()[0]}") from None


@dataclass
class _Plan:
    files: list[tuple[str, Path]] = field(default_factory=list)
    datasets: dict[str, ProjectDataset] = field(default_factory=dict)
    runs: list[ProjectRun] = field(default_factory=list)
    rewrites: dict[str, str] = field(default_factory=dict)  # absolute cache path -> relative
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, rule)

    def add_dataset(self, ds: ProjectDataset, why: str) -> None:
        have = self.datasets.get(ds.name)
        if have is not None and (have.location, have.revision) != (ds.location, ds.revision):
            raise ProjectError(
                f"dataset {ds.name!r} is named twice with different sources: "
                f"{have.pinned} from {have.location}, and {ds.pinned} from {ds.location} ({why})"
            )
        self.datasets[ds.name] = ds


def _plan(root: Path, cache_root: Path) -> _Plan:
    for folder in REQUIRED:
        if not (root / folder).is_dir():
            raise ProjectError(
                f"{root} has no {folder}/ folder; a project holds configs/ (the Hydra config "
                "tree), recipes/ and outputs/ (the runs)"
            )
    found = survey(root, cache_root)
    if found.refused:
        listed = "; ".join(f"{rel!r}: {why}" for rel, why in found.refused[:5])
        raise ProjectError(
            f"project {root}: {len(found.refused)} file(s) cannot be bundled ({listed})"
        )
    plan = _Plan(files=found.bundled, left_out=found.left_out)
    for rel, path in plan.files:
        if rel.lower().endswith(WEIGHTS_SUFFIX):
            check_safetensors(path)
    runs = {
        rel.rpartition("/")[0]
        for rel, _ in plan.files
        if rel.startswith("outputs/") and rel.endswith("/config.yaml")
    }
    for run in sorted(runs):
        _add_run(plan, root, root / run, cache_root)
    return plan


def _add_run(plan: _Plan, root: Path, run: Path, cache_root: Path) -> None:
    rel = run.relative_to(root).as_posix()
    config = _read_yaml(run / "config.yaml")
    overrides_path = run / ".hydra" / "overrides.yaml"
    overrides = _read_yaml(overrides_path) if overrides_path.is_file() else None
    for value in _strings(config) + _strings(overrides):
        for candidate in {value, value.partition("=")[2]}:
            found = _cached_dataset(cache_root, candidate)
            if found is not None:
                ds, inner = found
                plan.add_dataset(ds, f"used by {rel}")
                plan.rewrites[candidate] = (
                    f"{DATASETS_DIR}/{ds.name}.h5"
                    if inner == IMPORTED
                    else f"{DATASETS_DIR}/{ds.name}/{inner}"
                )
    recipe = run.parent.name if (root / "recipes" / f"{run.parent.name}.py").is_file() else None
    command = None
    if (
        recipe is not None
        and isinstance(overrides, list)
        and all(isinstance(o, str) for o in overrides)
    ):
        command = (
            "python",
            f"recipes/{recipe}.py",
            *(_rewrite(o, plan.rewrites) for o in overrides),
        )
    plan.runs.append(ProjectRun(rel, recipe, command))


def _rewrite(text: str, rewrites: dict[str, str]) -> str:
    for old in sorted(rewrites, key=len, reverse=True):
        text = text.replace(old, rewrites[old])
    return text


@dataclass(frozen=True)
class PushedProject:
    """What :func:`push_project` published."""

    entry: RemoteEntry
    manifest: ProjectManifest
    up_to_date: bool
    listing: ProjectListing = field(default_factory=ProjectListing)


@dataclass(frozen=True)
class ProjectPlan:
    """What :func:`plan_project` found: what a push would bundle and leave out, sending nothing.

    ``manifest`` has the runs and the datasets their configs trace to; datasets named with
    ``datasets=`` are resolved (and pinned) only by the push itself.
    """

    listing: ProjectListing
    manifest: ProjectManifest


def plan_project(
    project_dir: str | os.PathLike, name: str, *, cache_dir: str | os.PathLike | None = None
) -> ProjectPlan:
    """What :func:`push_project` would bundle (a dry run): reads the project and the cache only.

    Raises:
        ProjectError / StoreFormatError: as :func:`push_project` would, before sending anything.
    """
    check_name(name, subject="project name")
    root = Path(project_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no project folder {root}")
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    plan = _plan(root, cache_root)
    return ProjectPlan(
        _listing(plan), ProjectManifest(name, tuple(plan.datasets.values()), tuple(plan.runs))
    )


def _listing(plan: _Plan) -> ProjectListing:
    return ProjectListing(
        tuple((rel, path.stat().st_size) for rel, path in plan.files), tuple(plan.left_out)
    )


def push_project(
    project_dir: str | os.PathLike,
    location: str | os.PathLike,
    name: str,
    *,
    datasets: list[str] | tuple[str, ...] = (),
    replace: bool = False,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
) -> PushedProject:
    """Bundle ``project_dir`` and publish it as entry ``name`` at ``location`` (see the module).

    Args:
        datasets: more datasets the project uses, ``NAME[@REVISION]`` (resolved as
            :func:`torchstore.load` does, pulled if needed, and pinned).
        replace: publish over an entry of other content (as its new revision).
        cache_dir: the cache that runs' dataset paths point into (default: the default cache).

    The result's ``listing`` says what was bundled and what was left out, and why;
    :func:`plan_project` says the same without pushing.

    Raises:
        ProjectError: no configs/ or recipes/, a pickle file or a store in the bundled
            folders, a symlink where a file would be bundled, or a dataset named with two
            revisions.
        StoreFormatError: a ``.safetensors`` file is not complete and consistent.
        EntryExistsError / EntryKindError: as for :func:`torchstore.remote.push`.
    """
    from torchstore.datasets import resolve

    check_name(name, subject="project name")
    root = Path(project_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no project folder {root}")
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    loc = parse_location(location)
    backend = open_backend(loc, timeout=timeout, offline=offline, doing="pushing to")
    plan = _plan(root, cache_root)
    for wanted in datasets:
        got = resolve(
            wanted, cache_dir=cache_root, offline=offline, progress=progress, timeout=timeout
        )
        plan.add_dataset(ProjectDataset(got.name, got.location, got.revision), "--dataset")
    manifest = ProjectManifest(name, tuple(plan.datasets.values()), tuple(plan.runs))
    with tempfile.TemporaryDirectory(prefix="torchstore-project-") as tmp:
        staged: list[tuple[str, Path]] = []
        for rel, path in plan.files:
            if rel.endswith("/config.yaml") and plan.rewrites and rel.startswith("outputs/"):
                text = path.read_text()
                new = _rewrite(text, plan.rewrites)
                if new != text:
                    path = Path(tmp) / f"{len(staged)}.yaml"
                    path.write_text(new)
            staged.append((rel, path))
        manifest_path = Path(tmp) / MANIFEST_NAME
        manifest_path.write_bytes(manifest.to_json())
        staged.append((MANIFEST_NAME, manifest_path))
        files = [(RemoteFile(rel, p.stat().st_size, sha256_file(p)), p) for rel, p in staged]
        with progress_bar(sum(f.size for f, _ in files), f"push {name}", enabled=progress) as bar:
            published = backend.publish(name, "assets", files, replace=replace, progress=bar.update)
    return PushedProject(published.entry, manifest, published.up_to_date, _listing(plan))


# ----------------------------------------------------------------- pull
@dataclass(frozen=True)
class PulledProject:
    """Where :func:`pull_project` put the project, and what it holds."""

    path: Path
    manifest: ProjectManifest
    revision: str
    files: int

    def commands(self) -> list[str]:
        """The runs' commands, as shell lines to run in :attr:`path`."""
        import shlex

        return [shlex.join(r.command) for r in self.manifest.runs if r.command]


def _check_bundle(entry: RemoteEntry, root: Path, subject: str) -> ProjectManifest:
    if entry.file(MANIFEST_NAME) is None:
        raise ProjectError(f"{subject} is not a project bundle (it has no {MANIFEST_NAME})")
    manifest = ProjectManifest.parse(
        (root / MANIFEST_NAME).read_bytes(), source=f"{MANIFEST_NAME} of {subject}"
    )
    for f in entry.files:
        why = project_refusal(f.path)
        if why is not None or f.path.startswith(f"{DATASETS_DIR}/"):
            raise ProjectError(
                f"{subject} holds {f.path!r}, which a project may not: "
                f"{why or 'datasets travel by name'}"
            )
        if f.path.lower().endswith(WEIGHTS_SUFFIX):
            try:
                check_safetensors(root / f.path)
            except StoreFormatError as exc:
                raise StoreFormatError(f"{subject}: {exc}") from None
    for run in manifest.runs:
        if not any(f.path.startswith(run.path + "/") for f in entry.files):
            raise StoreFormatError(
                f"{subject}: its manifest lists run {run.path!r}, which it lacks"
            )
    return manifest


def _needs_import(entry: RemoteEntry) -> bool:
    """A LeRobot or Minari entry (recipes read stores: ``torchstore.load`` imports it)."""
    has_store = any(f.path.lower().endswith((".h5", ".hdf5")) for f in entry.files)
    lerobot = entry.file("meta/info.json") is not None and not has_store
    return lerobot or entry.file("data/metadata.json") is not None


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def pull_project(
    location: str | os.PathLike,
    name: str,
    dest: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    progress: bool = True,
    timeout: float = 30.0,
) -> PulledProject:
    """Restore project ``name`` (``NAME@REVISION`` for an earlier one) into ``dest``.

    ``dest`` (default ``./NAME``) must not exist, or be an empty folder. The bundle and
    every dataset it pins are pulled (verified) into the cache first; the project is
    built beside ``dest`` and renamed into place when complete, with each dataset's files
    at ``dest/datasets/<name>/`` (hard links into the cache where possible, else copies).

    Raises:
        ProjectError: the entry is not a project bundle, or holds what a project may not.
        DestinationExistsError: ``dest`` exists and is not an empty folder.
        IntegrityError, UnsafePathError, NoSuchEntryError, ...: as for
            :func:`torchstore.remote.pull`.
    """
    base, revision = split_revision(name, None)
    check_name(base, subject="project name")
    target = Path(dest) if dest is not None else Path(base)
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        raise DestinationExistsError(
            f"{target} exists and is not an empty folder; choose another destination"
        )
    subject = f"{base!r} at {location}"
    root, entry = pull_entry(
        location,
        base,
        revision=revision,
        cache_dir=cache_dir,
        offline=offline,
        progress=progress,
        timeout=timeout,
    )
    manifest = _check_bundle(entry, root, subject)
    pulled = []
    for ds in manifest.datasets:
        ds_root, ds_entry = pull_entry(
            ds.location,
            ds.name,
            revision=ds.revision,
            cache_dir=cache_dir,
            offline=offline,
            progress=progress,
            timeout=timeout,
        )
        pulled.append((ds, ds_root, ds_entry))
    parent = target.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # a folder like any other, not mkdtemp's private one
    try:
        with progress_bar(entry.size, f"project {base}", enabled=progress) as bar:
            for f in entry.files:
                if f.path == MANIFEST_NAME:
                    continue
                folder = f.path.rpartition("/")[0]
                if folder:
                    make_dirs_inside(staging, folder, subject=f"file of {subject}")
                shutil.copyfile(
                    resolve_inside(root, f.path, subject=f"file of {subject}"),
                    resolve_inside(staging, f.path, subject=f"file of {subject}"),
                )
                bar.update(f.size)
        shutil.copyfile(root / MANIFEST_NAME, staging / MANIFEST_NAME)
        for ds, ds_root, ds_entry in pulled:
            if _needs_import(ds_entry):
                from torchstore.datasets import Resolved, store_file

                imported = store_file(
                    Resolved(ds.name, ds.location, ds.revision, ds_root, ds_entry, "location")
                )
                make_dirs_inside(staging, DATASETS_DIR, subject="dataset folder")
                _link_or_copy(imported, staging / DATASETS_DIR / f"{ds.name}.h5")
            where = make_dirs_inside(staging, f"{DATASETS_DIR}/{ds.name}", subject="dataset folder")
            for f in ds_entry.files:
                folder = f.path.rpartition("/")[0]
                if folder:
                    make_dirs_inside(where, folder, subject=f"file of dataset {ds.name!r}")
                _link_or_copy(
                    resolve_inside(ds_root, f.path, subject=f"file of dataset {ds.name!r}"),
                    resolve_inside(where, f.path, subject=f"file of dataset {ds.name!r}"),
                )
        if target.is_dir():
            target.rmdir()  # empty (checked above); replaced by the complete project
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PulledProject(target, manifest, entry.commit or entry.revision, len(entry.files))
