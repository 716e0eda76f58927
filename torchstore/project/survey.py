"""Which files and folders of a project a push bundles, and why each other one stays out.

:func:`survey` walks a project once and sorts every item into bundled, left out (with the
rule that left it out) or refused (a file the bundle may not carry); :class:`ProjectListing`
is what ``torchstore project push`` (and ``--dry-run``) prints of it, grouped by folder.
:mod:`torchstore.project.bundle` builds the bundle from the survey.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from torchstore.remote.safe_upload import is_scratch, upload_refusal
from torchstore.remote.weights import PICKLE_SUFFIXES

__all__ = [
    "BUNDLED",
    "DATASETS_DIR",
    "MANIFEST_NAME",
    "ProjectListing",
    "Survey",
    "WEIGHTS_SUFFIX",
    "project_refusal",
    "survey",
]

MANIFEST_NAME = "torchstore-project.json"
BUNDLED = ("configs", "recipes", "outputs")
DATASETS_DIR = "datasets"
_STORE_SUFFIXES = (".h5", ".hdf5")


def project_refusal(rel: str) -> str | None:
    lower = rel.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        return (
            "a pickle-based file (loading it runs code): save weights with "
            "safetensors.torch.save_file, or move it out of the project"
        )
    if lower.endswith(_STORE_SUFFIXES):
        return (
            "a dataset store: datasets travel by name and revision (push it with "
            "`torchstore push`, then name it with --dataset)"
        )
    return None


# What push bundles, and the rule behind everything it leaves out (ProjectListing says both).
#
# ``*.safetensors`` files are bundled wherever they sit in the project (a
# ``weights/policy.safetensors`` beside ``configs/``), not refused: the bundle is an
# ``assets`` entry, whose format carries any project-relative path with its size and sha256
# (RemoteFile), and pull already checks every ``.safetensors`` file a bundle holds, wherever
# it is (``_check_bundle``), refusing only pickles, stores and ``datasets/``. So such weights
# get the checks a run's policy gets (complete, header matching the bytes: on push and on
# pull), and refusing them would only make users move files the format already carries.
# They are not looked for in ``datasets/`` (a bundle may hold nothing there: datasets travel
# by name), in hidden folders or in virtual environments, which are left out whole.
_VCS = frozenset({".git", ".hg", ".svn", ".jj"})
WEIGHTS_SUFFIX = ".safetensors"
RULE_VCS = "version control"
RULE_HIDDEN = "hidden"
RULE_HYDRA = "Hydra's record: the manifest keeps the run's command"
RULE_CACHE = "the torchstore cache"
RULE_PYCACHE = "interpreter caches, rebuilt where the recipes run"
RULE_SCRATCH = "scratch, lock or temporary"
RULE_DATASETS = "datasets travel by name and revision: pinned in the manifest, placed by pull"
RULE_VENV = "a virtual environment"
RULE_SYMLINK = "a symlink (never followed)"
RULE_MANIFEST = "push writes the bundle's own manifest"
RULE_STORE = (
    "stores travel as dataset entries: torchstore push DIR LOCATION NAME, then --dataset NAME"
)
RULE_PICKLE = "pickle-based, loading it runs code: save weights with safetensors.torch.save_file"
RULE_OTHER = "only configs/, recipes/, outputs/ and *.safetensors files are bundled"
RULE_RESUME = (
    "a run's resume checkpoint (a pickle): the run's policy.safetensors travels, and a run "
    "resumes where it was written"
)
#: what a recipe run keeps to resume from (torchstore.lightning.progress.LastCheckpoint)
_RESUME_CHECKPOINT = "last.ckpt"
#: rules that, below a folder push does not bundle, give way to that folder's (RULE_OTHER)
_INCIDENTAL = frozenset(
    {RULE_VCS, RULE_HIDDEN, RULE_HYDRA, RULE_PYCACHE, RULE_SCRATCH, RULE_SYMLINK, RULE_VENV}
)


def _in_bundled(rel: str) -> bool:
    top, sep, _ = rel.partition("/")
    return bool(sep) and top in BUNDLED


def _folder_rule(path: Path, rel: str) -> str | None:
    """Why folder ``rel`` is left out whole (never searched), or None to search it."""
    name = path.name
    if name.startswith("."):
        return RULE_VCS if name in _VCS else RULE_HYDRA if name == ".hydra" else RULE_HIDDEN
    if name == "__pycache__":
        return RULE_PYCACHE
    if rel == DATASETS_DIR:
        return RULE_DATASETS
    if path.is_symlink():
        return RULE_SYMLINK
    if (path / "pyvenv.cfg").is_file():
        return RULE_VENV
    return None


def _outside_rule(rel: str, path: Path) -> str:
    """Why file ``rel``, outside the bundled folders and not weights, is left out."""
    lower = rel.lower()
    if path.is_symlink():
        return RULE_SYMLINK
    if rel == MANIFEST_NAME:
        return RULE_MANIFEST
    if lower.endswith(PICKLE_SUFFIXES):
        return RULE_PICKLE
    if lower.endswith(_STORE_SUFFIXES):
        return RULE_STORE
    return RULE_OTHER


@dataclass
class Survey:
    bundled: list[tuple[str, Path]] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # a folder's path ends in /
    refused: list[tuple[str, str]] = field(default_factory=list)
    cache: str = ""  # the cache's absolute path: left out whole if it is in the project

    def leave(self, rel: str, rule: str) -> None:
        """Leave ``rel`` out by ``rule``; inside a folder push does not bundle, the folder's
        own rule (not its ``__pycache__`` or hidden files) is the one to say."""
        top = _top(rel)
        if top and top not in BUNDLED and rule in _INCIDENTAL:
            rule = RULE_OTHER
        self.left_out.append((rel, rule))

    def folders(self, here: Path, prefix: str, dirnames: list[str]) -> None:
        """Sort out the sub-folders of ``here``; ``dirnames`` keeps those to search."""
        keep = []
        for d in sorted(dirnames):
            rel = prefix + d
            why = _folder_rule(here / d, rel)
            if why is None and os.path.abspath(here / d) == self.cache:
                why = RULE_CACHE
            if why is None:
                keep.append(d)
            elif why == RULE_SYMLINK and (rel in BUNDLED or _in_bundled(rel)):
                self.refused.append((rel, why))
            else:
                self.leave(f"{rel}/", why)
        dirnames[:] = keep

    def file(self, root: Path, rel: str, path: Path) -> None:
        if path.name.startswith("."):
            self.leave(rel, RULE_HIDDEN)
        elif is_scratch(rel):
            self.leave(rel, RULE_SCRATCH)
        elif rel.startswith("outputs/") and path.name == _RESUME_CHECKPOINT:
            self.leave(rel, RULE_RESUME)
        elif _in_bundled(rel) or rel.lower().endswith(WEIGHTS_SUFFIX):
            why = upload_refusal(path, root=root)
            own = project_refusal(rel)  # the project's own rule says more than "incomplete"
            if why is not None and why.startswith("a symlink"):
                self.refused.append((rel, why))
            elif why is not None or own is not None:
                self.refused.append((rel, own or why))
            else:
                self.bundled.append((rel, path))
        else:
            self.leave(rel, _outside_rule(rel, path))


def survey(root: Path, cache_root: Path) -> Survey:
    """Every file and folder of the project: bundled, left out (and why), or refused."""
    found = Survey(cache=os.path.abspath(cache_root))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        prefix = "" if here == root else here.relative_to(root).as_posix() + "/"
        found.folders(here, prefix, dirnames)
        for name in sorted(filenames):
            found.file(root, prefix + name, here / name)
    return found


def _top(rel: str) -> str:
    """The project-level folder ``rel`` is in ("" for a file or folder at the top)."""
    top, sep, _ = rel.rstrip("/").partition("/")
    return top if sep else ""


def _count(paths: list[str]) -> str:
    folders = sum(p.endswith("/") for p in paths)
    files = len(paths) - folders
    words = [f"{files} file{'s' * (files != 1)}"] if files else []
    return ", ".join(words + ([f"{folders} folder{'s' * (folders != 1)}"] if folders else []))


@dataclass(frozen=True)
class ProjectListing:
    """What a project push bundles, and what it leaves out with the rule that left it out.

    ``bundled`` holds ``(path, bytes)`` for every file sent (the manifest aside);
    ``left_out`` holds ``(path, rule)``, a folder's path ending in ``/`` (left out whole).
    :meth:`lines` is what ``torchstore project push`` prints: grouped by folder.
    """

    bundled: tuple[tuple[str, int], ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return sum(size for _, size in self.bundled)

    def lines(self, most: int = 3) -> list[str]:
        """One line per bundled folder (or file), one per left-out item or group of them.

        A folder a push bundles is one line (``bundle: configs/ (12 files, 4.1 KiB)``);
        left-out items are grouped by project-level folder and rule once there are more
        than ``most`` of them (``left out: 40 files in notes/ (RULE)``).
        """
        return self._bundled_lines(most) + self._left_out_lines(most)

    def _bundled_lines(self, most: int) -> list[str]:
        from torchstore.data.store.summary import format_size

        groups: dict[str, list[tuple[str, int]]] = {}
        for rel, size in self.bundled:
            groups.setdefault(_top(rel), []).append((rel, size))
        tops = {_top(rel) or rel for rel, _ in self.left_out}
        order = [t for t in BUNDLED if t in groups] + sorted(t for t in groups if t not in BUNDLED)
        out = []
        for top in order:
            items = groups[top]
            total = format_size(sum(size for _, size in items))
            if len(items) == 1 or (top not in BUNDLED and len(items) <= most):
                out += [f"bundle: {rel} ({format_size(size)})" for rel, size in items]
            elif not top:
                out.append(f"bundle: {len(items)} *{WEIGHTS_SUFFIX} files at the top ({total})")
            elif top in BUNDLED or top not in tops:
                out.append(f"bundle: {top}/ ({len(items)} files, {total})")
            else:
                out.append(f"bundle: {len(items)} *{WEIGHTS_SUFFIX} files in {top}/ ({total})")
        return out

    def _left_out_lines(self, most: int) -> list[str]:
        groups: dict[tuple[str, str], list[str]] = {}
        for rel, rule in self.left_out:
            groups.setdefault((_top(rel), rule), []).append(rel)
        shared = {_top(rel) for rel, _ in self.bundled}
        rules: dict[str, int] = {}
        for top, _ in groups:
            rules[top] = rules.get(top, 0) + 1
        out = []
        for (top, rule), paths in sorted(groups.items(), key=lambda kv: kv[1][0]):
            if len(paths) <= most:
                out += [f"left out: {rel} ({rule})" for rel in paths]
            elif not top:
                out.append(f"left out: {paths[0]}, {paths[1]} and {len(paths) - 2} more ({rule})")
            elif rules[top] == 1 and top not in shared:
                out.append(f"left out: {top}/ ({_count(paths)}; {rule})")
            else:
                out.append(f"left out: {_count(paths)} in {top}/ ({rule})")
        return out
