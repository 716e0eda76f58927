"""Datasets by name: ``torchstore.load("name")`` and the list of what is local.

``load(name)`` finds a dataset in this order and returns it opened as a
:class:`~torchstore.TrajectoryStore`:

1. **The local cache** (``$TORCHSTORE_CACHE``, else ``~/.cache/torchstore``): an entry
   called ``name`` that an earlier pull left complete and verified, from any location
   (the configured ones first, then the most recently pulled; a Hub id matches only its
   own Hub repo). Nothing is asked of the network.
2. **The configured locations**, in order: the comma-separated locations in
   ``TORCHSTORE_LOCATIONS``, then the lines of ``$XDG_CONFIG_HOME/torchstore/locations``
   (``~/.config/torchstore/locations``; one location per line, ``#`` starts a comment).
   A location is anything ``torchstore pull`` takes: ``http(s)://host/base``, a folder,
   ``s3://...``, ``hf://datasets/NAMESPACE``. The first location that lists ``name``
   wins; one that does not list it is passed over; one that fails (unreachable, no such
   location) is an error, so a name never silently resolves somewhere else.
3. **The Hub**: ``NAMESPACE/NAME`` is the dataset repo of that id.

The pull is :func:`torchstore.remote.pull` (every file checked against its sha256 before
it becomes visible). ``NAME@REVISION`` asks for one revision: the cache answers only if it
holds exactly that one. Offline (``HF_HUB_OFFLINE=1``, ``TORCHSTORE_OFFLINE=1`` or
``offline=True``), network locations and the Hub are skipped: the cache and local
folders answer.

What is returned depends on what the entry holds:

- one torchstore store (``.h5``/``.hdf5``): that store (``file=`` picks one of several);
- a LeRobot dataset (``meta/info.json``, no store) or a Minari dataset
  (``data/metadata.json``): it
  is imported once, with :func:`~torchstore.lerobot.import_lerobot` or
  :func:`~torchstore.minari.import_minari`, into ``<cache>/<location>/.stores/`` (one store
  per revision) and that store is returned; later loads open it at once.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchstore.errors import AmbiguousDatasetError, IntegrityError, TorchstoreError
from torchstore.io.paths import check_name
from torchstore.io.remote.transfer import NoSuchEntryError, TransferError
from torchstore.remote.cache import _Cache, _offline, default_cache_dir, pull_entry, split_revision
from torchstore.remote.index import RemoteEntry
from torchstore.remote.location import is_offline, parse_location

if TYPE_CHECKING:
    from torchstore.data.store.store import TrajectoryStore

__all__ = [
    "load",
    "resolve",
    "Resolved",
    "configured_locations",
    "locations_file",
    "local_datasets",
    "LocalDataset",
    "format_local",
    "AmbiguousDatasetError",
    "LOCATIONS_ENV",
]

log = logging.getLogger(__name__)

#: The environment variable holding comma-separated locations, searched first.
LOCATIONS_ENV = "TORCHSTORE_LOCATIONS"
_STORE_SUFFIXES = (".h5", ".hdf5")


def locations_file() -> Path:
    """``$XDG_CONFIG_HOME/torchstore/locations`` (``~/.config/torchstore/locations``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "torchstore" / "locations"


def configured_locations() -> list[str]:
    """The configured locations, in search order: ``TORCHSTORE_LOCATIONS``, then the file.

    Each is checked like any location (a malformed one is a ``ValueError`` saying where
    it was configured); duplicates are searched once.
    """
    found: list[tuple[str, str]] = []
    for item in os.environ.get(LOCATIONS_ENV, "").split(","):
        if item.strip():
            found.append((item.strip(), LOCATIONS_ENV))
    path = locations_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise TorchstoreError(f"cannot read the locations file {path}: {exc}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            found.append((line, f"{path}:{number}"))
    out: list[str] = []
    for raw, where in found:
        try:
            location = parse_location(raw).raw
        except ValueError as exc:
            raise ValueError(
                f"location {raw!r} (configured in {where}) is malformed: {exc}"
            ) from None
        if location not in out:
            out.append(location)
    return out


@dataclass(frozen=True)
class Resolved:
    """Where a name resolved: the location, the pinned revision, and the local folder."""

    name: str
    location: str
    revision: str  # the index revision (64 hex) or the Hub commit: what NAME@REVISION pins
    root: Path
    entry: RemoteEntry
    source: str  # "cache" | "location" | "hub"

    @property
    def pinned(self) -> str:
        """``NAME@REVISION``: what pulls exactly these bytes again."""
        return f"{self.name}@{self.revision}"


def _split(name: str) -> tuple[str | None, str, str | None]:
    """``[NAMESPACE/]NAME[@REVISION]`` -> (namespace, name, revision)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset name ({name!r}) must be a non-empty string")
    base, revision = split_revision(name, None)
    namespace = None
    if "/" in base:
        namespace, _, base = base.partition("/")
        check_name(namespace, subject=f"Hub namespace in {name!r}")
    check_name(base, subject=f"dataset name in {name!r}")
    return namespace, base, revision


def _pin(entry: RemoteEntry) -> str:
    return entry.commit or entry.revision


def _hub_location(namespace: str) -> str:
    return f"hf://datasets/{namespace}"


def _from_cache(
    cache_dir: Path, name: str, revision: str | None, preferred: list[str], *, hub_id: bool
) -> Resolved | None:
    """A complete, verified cached entry ``name`` (checked without network or writes).

    A Hub id matches only its own namespace's cached repo. A bare name matches an entry
    pulled from any location except a Hub namespace that is not configured; the
    configured locations come first, in order, then the most recently pulled.
    """
    candidates = []
    try:
        slugs = [p for p in cache_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return None
    for slug in slugs:
        record_path = slug / ".records" / f"{name}.json"
        try:
            record = json.loads(record_path.read_text())
            location = record["location"]
            mtime = record_path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(location, str):
            continue
        if location not in preferred and (hub_id or location.startswith("hf://")):
            continue
        rank = preferred.index(location) if location in preferred else len(preferred)
        candidates.append((rank, -mtime, location))
    for _, _, location in sorted(candidates):
        try:
            loc = parse_location(location)
            root, entry = _offline(_Cache(cache_dir, loc, name), revision, None)
        except (TransferError, IntegrityError, ValueError, OSError) as exc:
            log.debug("cache: %s from %s is not usable: %s", name, location, exc)
            continue
        return Resolved(name, location, _pin(entry), root, entry, "cache")
    return None


def resolve(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    refresh: bool = False,
    progress: bool = True,
    timeout: float = 30.0,
) -> Resolved:
    """Find dataset ``name`` (cache, configured locations, Hub) and pull it; see the module.

    Args:
        name: ``NAME``, ``NAME@REVISION``, or a Hub id ``NAMESPACE/NAME[@REVISION]``.
        cache_dir: the cache root (default ``$TORCHSTORE_CACHE``, else ``~/.cache/torchstore``).
        offline: skip network locations and the Hub (default: ``HF_HUB_OFFLINE`` /
            ``TORCHSTORE_OFFLINE``).
        refresh: skip the cache step, so the locations are asked for their latest revision
            (the pull still fetches only files that changed).

    Raises:
        NoSuchEntryError: no configured location (nor the Hub) has ``name``; the message
            says where it looked (a ``KeyError`` too).
        TransferError: a location failed (unreachable, no such location); pulls that fail
            verification raise as :func:`torchstore.remote.pull` does.
    """
    namespace, base, revision = _split(name)
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    locations = [] if namespace else configured_locations()
    hub = _hub_location(namespace) if namespace else None
    preferred = locations + ([parse_location(hub).raw] if hub else [])
    if not refresh:
        hit = _from_cache(cache_root, base, revision, preferred, hub_id=namespace is not None)
        if hit is not None:
            log.info("%s: from the cache (%s)", name, hit.root)
            return hit
    offline_now = is_offline(offline)
    looked = [f"not in the cache {cache_root}" if not refresh else "cache skipped (refresh)"]
    searched = [(loc, "location") for loc in locations] + ([(hub, "hub")] if hub else [])
    for location, source in searched:
        loc = parse_location(location)
        if offline_now and loc.is_network:
            looked.append(f"{location} skipped (offline)")
            continue
        try:
            root, entry = pull_entry(
                loc.raw,
                base,
                cache_dir=cache_root,
                revision=revision,
                offline=offline,
                progress=progress,
                timeout=timeout,
            )
        except NoSuchEntryError as exc:
            # the location lists the name but not that revision: say which it has
            looked.append(str(exc) if revision and "revision" in str(exc) else f"not at {location}")
            log.debug("%s", exc)
            continue
        except TransferError as exc:
            raise type(exc)(f"dataset {name!r}: {location} failed: {exc}") from exc
        return Resolved(base, loc.raw, _pin(entry), root, entry, source)
    if not namespace:
        looked.append("a name without NAMESPACE/ is not a Hub id")
    if not locations and not namespace:
        looked.append(
            f"no locations configured (set {LOCATIONS_ENV}, or list them in {locations_file()})"
        )
    raise NoSuchEntryError(f"no dataset {name!r}: " + "; ".join(looked))


def _is_lerobot(entry: RemoteEntry) -> bool:
    return entry.file("meta/info.json") is not None


def _is_minari(entry: RemoteEntry) -> bool:
    return entry.file("data/metadata.json") is not None or entry.file("metadata.json") is not None


def store_file(resolved: Resolved, file: str | None = None) -> Path:
    """The store file :func:`load` opens for ``resolved`` (importing LeRobot/Minari once)."""
    entry, root = resolved.entry, resolved.root
    if file is not None:
        if entry.file(file) is None:
            listed = [f.path for f in entry.files][:10]
            raise NoSuchEntryError(f"{resolved.name!r} has no file {file!r} (its files: {listed})")
        return root / file
    stores = [f.path for f in entry.files if f.path.lower().endswith(_STORE_SUFFIXES)]
    if _is_lerobot(entry) and not stores or _is_minari(entry):
        return _imported(resolved)
    if len(stores) == 1:
        return root / stores[0]
    if not stores:
        listed = [f.path for f in entry.files][:10]
        raise TorchstoreError(
            f"{resolved.name!r} holds no store (.h5), LeRobot or Minari dataset; its files: "
            f"{listed}; it is pulled to {root}"
        )
    raise AmbiguousDatasetError(
        f"{resolved.name!r} holds {len(stores)} stores ({', '.join(stores[:10])}); say which "
        f"with file= (--file)"
    )


def _imported(resolved: Resolved) -> Path:
    from torchstore.remote.cache import _writing

    cache_dir = resolved.root.parent.parent
    dest = resolved.root.parent / ".stores" / f"{resolved.name}-{resolved.revision[:16]}.h5"
    if dest.is_file():
        return dest
    with _writing(cache_dir, f"importing {resolved.name!r} into a store"):
        dest.parent.mkdir(exist_ok=True)
        try:
            if _is_lerobot(resolved.entry):
                from torchstore.lerobot import import_lerobot

                import_lerobot(resolved.root, dest, progress=False)
            else:
                from torchstore.minari import import_minari

                import_minari(resolved.root, dest, progress=False)
        except FileExistsError:  # another process imported it meanwhile
            if not dest.is_file():
                raise
    return dest


def load(
    name: str,
    *,
    file: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    refresh: bool = False,
    progress: bool = True,
    timeout: float = 30.0,
) -> TrajectoryStore:
    """Open dataset ``name``, pulling it first if it is not in the cache (see the module).

    Args:
        name: ``NAME``, ``NAME@REVISION`` or a Hub id ``NAMESPACE/NAME[@REVISION]``.
        file: the store inside the entry, when it holds several.
        cache_dir, offline, refresh, progress, timeout: as for :func:`resolve`.

    Returns:
        The opened :class:`~torchstore.TrajectoryStore` (a LeRobot or Minari dataset is
        imported once into a store beside the cache, and that store is returned).

    Examples:
        >>> store = torchstore.load("reach-demo")  # doctest: +SKIP
        >>> store = torchstore.load("lerobot/pusht@v3.0")  # doctest: +SKIP
    """
    from torchstore.data.store.store import TrajectoryStore

    resolved = resolve(
        name,
        cache_dir=cache_dir,
        offline=offline,
        refresh=refresh,
        progress=progress,
        timeout=timeout,
    )
    return TrajectoryStore(store_file(resolved, file))


# ----------------------------------------------------------------- local list
@dataclass(frozen=True)
class LocalDataset:
    """One entry in the cache: where it came from, how big it is, how many episodes."""

    name: str
    location: str
    revision: str
    path: Path
    size: int
    episodes: int | None  # None: not a dataset with episodes, or unreadable
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "location": self.location,
            "revision": self.revision,
            "path": str(self.path),
            "size": self.size,
            "episodes": self.episodes,
            "note": self.note,
        }


def _episodes(root: Path, entry: RemoteEntry) -> tuple[int | None, str]:
    stores = [f.path for f in entry.files if f.path.lower().endswith(_STORE_SUFFIXES)]
    try:
        if _is_lerobot(entry) and not stores:
            info = json.loads((root / "meta" / "info.json").read_text())
            return int(info["total_episodes"]), "LeRobot"
        if _is_minari(entry):
            meta = root / "data" / "metadata.json"
            if not meta.is_file():
                meta = root / "metadata.json"
            return int(json.loads(meta.read_text())["total_episodes"]), "Minari"
        if stores:
            from torchstore.data.store.store import TrajectoryStore

            total = 0
            for rel in stores:
                with TrajectoryStore(root / rel) as store:
                    total += store.num_episodes
            return total, "" if len(stores) == 1 else f"{len(stores)} stores"
    except Exception as exc:  # noqa: BLE001 - a listing reports a damaged entry, it does not stop
        return None, f"unreadable: {str(exc).splitlines()[0][:80]}"
    return None, f"{entry.kind}, no store"


def local_datasets(cache_dir: str | os.PathLike | None = None) -> list[LocalDataset]:
    """Every complete entry in the cache, by name (``torchstore list``); nothing is fetched."""
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = []
    try:
        slugs = sorted(p for p in cache_root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    for slug in slugs:
        records = slug / ".records"
        if not records.is_dir():
            continue
        for record_path in sorted(records.glob("*.json")):
            try:
                record = json.loads(record_path.read_text())
                loc = parse_location(record["location"])
                name = check_name(record["name"], subject="cached entry")
                root, entry = _offline(_Cache(cache_root, loc, name), None, None)
            except Exception as exc:  # noqa: BLE001 - incomplete or damaged: not listed as local
                log.debug("cache: %s is not complete: %s", record_path, exc)
                continue
            episodes, note = _episodes(root, entry)
            out.append(LocalDataset(name, loc.raw, _pin(entry), root, entry.size, episodes, note))
    return sorted(out, key=lambda d: (d.name, d.location))


def format_local(datasets: list[LocalDataset], cache_dir: str | os.PathLike | None = None) -> str:
    """A table of :func:`local_datasets` (``torchstore list``)."""
    from torchstore.remote.catalog import _human

    if not datasets:
        where = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        return f"no datasets in the cache {where} (torchstore datasets NAME pulls one)"
    lines = [f"{'name':<28} {'episodes':>8} {'size':>10}  {'revision':<12}  location"]
    for d in datasets:
        episodes = "-" if d.episodes is None else str(d.episodes)
        note = f"  ({d.note})" if d.note else ""
        lines.append(
            f"{d.name:<28} {episodes:>8} {_human(d.size):>10}  {d.revision[:12]:<12}  "
            f"{d.location}{note}"
        )
    return "\n".join(lines)
