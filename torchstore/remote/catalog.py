"""``RemoteCatalog``: what a location holds (name, kind, size, files with their sha256)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from torchstore.io.remote.transfer import NoSuchEntryError
from torchstore.remote.backend import Backend, open_backend
from torchstore.remote.index import RemoteEntry
from torchstore.remote.location import Location, check_online, parse_location

__all__ = ["RemoteCatalog", "format_catalog"]


class RemoteCatalog:
    """The entries at a location: Hub repos under a namespace, or an ``index.json``.

    The listing is read once, on first use (``refresh()`` reads it again).

    Args:
        location: ``hf://datasets/NS``, ``hf://models/NS``, ``http(s)://...``, a folder or
            an fsspec URL (see ``torchstore.remote.location``).
        offline: refuse to list a network location; default from
            ``HF_HUB_OFFLINE``/``TORCHSTORE_OFFLINE``. Local folders list offline too.

    Raises (on first use):
        NoSuchLocationError: nothing was ever published there (a mistyped location).
        OfflineError: offline mode and a network location.

    ``catalog[name]`` raises :class:`~torchstore.io.remote.transfer.NoSuchEntryError`, which is
    also a ``KeyError``.

    Examples:
        >>> catalog = RemoteCatalog("http://127.0.0.1:8000/data")  # doctest: +SKIP
        >>> [(e.name, e.kind, e.size) for e in catalog]  # doctest: +SKIP
        [('pusht-demo', 'dataset', 10262)]
    """

    def __init__(
        self,
        location: str | os.PathLike,
        *,
        offline: bool | None = None,
        timeout: float = 30.0,
        retries: int = 5,
    ):
        self.location: Location = parse_location(location)
        self._offline = offline
        self._backend: Backend = open_backend(
            self.location, timeout=timeout, retries=retries, offline=False
        )
        self._entries: dict[str, RemoteEntry] | None = None

    def __repr__(self) -> str:
        return f"RemoteCatalog({self.location.raw!r})"

    def refresh(self) -> dict[str, RemoteEntry]:
        check_online(self.location, "listing", self._offline)
        self._entries = self._backend.entries()
        return self._entries

    def entries(self) -> dict[str, RemoteEntry]:
        """Entries by name."""
        return self._entries if self._entries is not None else self.refresh()

    def names(self) -> list[str]:
        return sorted(self.entries())

    def __iter__(self) -> Iterator[RemoteEntry]:
        return iter(sorted(self.entries().values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self.entries())

    def __contains__(self, name: object) -> bool:
        return name in self.entries()

    def __getitem__(self, name: str) -> RemoteEntry:
        entries = self.entries()
        if name not in entries:
            have = ", ".join(sorted(entries)[:20]) or "none"
            raise NoSuchEntryError(f"{self.location} has no entry {name!r} (its entries: {have})")
        return entries[name]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def format_catalog(catalog: RemoteCatalog, *, files: bool = False) -> str:
    """A table of the catalog (``torchstore catalog``); ``files`` adds one line per file."""
    lines = [f"{'name':<32} {'kind':<10} {'files':>6} {'size':>10}  revision"]
    for e in catalog:
        lines.append(
            f"{e.name:<32} {e.kind:<10} {len(e.files):>6} {_human(e.size):>10}  "
            f"{(e.commit or e.revision)[:12]}"
        )
        if files:
            for f in e.files:
                digest = f"sha256:{f.sha256}" if f.sha256 else f"git-sha1:{f.blob_sha1}"
                lines.append(f"    {f.path}  {f.size}  {digest}")
    return "\n".join(lines)
