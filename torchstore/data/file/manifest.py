"""The manifest: what a store file holds, written into the file itself.

The schema part (format, columns, env id, seed, creation time, version, user metadata) is
static and lives in one root attribute written before the file becomes visible. The live
counts come from the ``commit`` record (HDF5 readers never refresh attributes, so counts
kept in an attribute would go stale under a live writer).

Format versions: 2 keeps an xxh3-64 of the manifest text beside it and one in the commit
record, so a flipped bit in either is reported instead of changing what a reader returns.
Version 1 stores (written before) have neither; they still open and append, unverified in
those two places. Version 3 is version 2 plus encoded camera columns (a column ``codec``,
kept as packets: see :mod:`torchstore.data.file.encoded`); a store without one is still
written as version 2, so older torchstore releases keep reading it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from torchstore._version import __version__
from torchstore.errors import ColumnError, StoreFormatError
from torchstore.validation import positive_int

if TYPE_CHECKING:
    from torchstore.data.columns import ColumnSpec

__all__ = [
    "Manifest",
    "parse_manifest_json",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "UNCHECKED_FORMAT_VERSION",
]

FORMAT_NAME = "torchstore.trajectory"
FORMAT_VERSION = 3
#: The newest format version without encoded columns (what a store without one is written as).
PLAIN_FORMAT_VERSION = 2
#: The last format version written without the manifest and commit-record checksums.
UNCHECKED_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything a store file says about itself.

    ``num_rows`` and ``num_episodes`` are the committed counts at the moment the manifest
    was read.
    """

    columns: tuple[ColumnSpec, ...]
    env_id: str | None = None
    seed: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    torchstore_version: str = __version__
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    num_rows: int = 0
    num_episodes: int = 0

    @classmethod
    def new(
        cls,
        columns: Any,
        *,
        env_id: str | None = None,
        seed: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        created: str | None = None,
    ) -> Manifest:
        """A manifest for a new store; checks the columns and that metadata is JSON.

        ``created`` is the creation time to record (ISO 8601); None records now. A fixed
        value makes a generated store byte-reproducible.
        """
        from torchstore.data.columns import validate_columns  # (torch)

        if env_id is not None and not isinstance(env_id, str):
            raise ColumnError(f"env_id must be a string or None, got {env_id!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ColumnError(f"seed must be an int or None, got {seed!r}")
        metadata = dict(metadata or {})
        try:
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ColumnError(f"metadata must be JSON-serialisable: {exc}") from exc
        columns = validate_columns(columns)
        encoded = any(c.codec is not None for c in columns)
        return cls(
            columns=columns,
            format_version=FORMAT_VERSION if encoded else PLAIN_FORMAT_VERSION,
            env_id=env_id,
            seed=seed,
            metadata=metadata,
            created=datetime.now(UTC).isoformat(timespec="seconds") if created is None else created,
        )

    def with_counts(self, rows: int, episodes: int) -> Manifest:
        return replace(self, num_rows=int(rows), num_episodes=int(episodes))

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": self.format,
                "format_version": self.format_version,
                "torchstore_version": self.torchstore_version,
                "created": self.created,
                "env_id": self.env_id,
                "seed": self.seed,
                "columns": [c.to_dict() for c in self.columns],
                "metadata": self.metadata,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "store") -> Manifest:
        """Parse and check a manifest; unknown formats and future versions fail clearly."""
        from torchstore.data.columns import ColumnSpec, validate_columns  # (torch)

        fields = parse_manifest_json(text, source=source)
        version = fields["format_version"]
        try:
            columns = validate_columns(ColumnSpec.from_dict(c) for c in fields["columns"])
            if version < FORMAT_VERSION and any(c.codec is not None for c in columns):
                raise StoreFormatError(
                    f"{source}: store format version {version} has no encoded columns, but the "
                    "manifest gives one a codec"
                )
            return cls(**{**fields, "columns": columns}, format=FORMAT_NAME)
        except (KeyError, TypeError, ValueError, ColumnError) as exc:
            raise StoreFormatError(
                f"{source}: the manifest's column list is malformed ({exc})"
            ) from exc


def parse_manifest_json(text: str | bytes, *, source: str = "store") -> dict[str, Any]:
    """A manifest's fields, checked, with its columns as the dicts it holds (no
    :class:`ColumnSpec` yet, so no torch): what :meth:`Manifest.from_json` builds on, and
    what reading a store's facts without torch (``torchstore info``, ``verify``) reads.

    Returns:
        ``format_version``, ``torchstore_version``, ``created``, ``env_id``, ``seed``,
        ``metadata`` and ``columns`` (a list).
    """
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StoreFormatError(
            f"{source}: the manifest is not valid JSON ({str(exc)[:200]})"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        found = data.get("format") if isinstance(data, dict) else None
        raise StoreFormatError(f"{source}: not a torchstore trajectory store (format {found!r})")
    version = data.get("format_version")
    version = positive_int(f"{source}: manifest format_version", version, error=StoreFormatError)
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{source} uses store format version {version}, written by torchstore "
            f"{data.get('torchstore_version', '?')}; this torchstore ({__version__}) reads "
            f"up to version {FORMAT_VERSION}: upgrade torchstore"
        )
    env_id, seed, metadata = data.get("env_id"), data.get("seed"), data.get("metadata") or {}
    if env_id is not None and not isinstance(env_id, str):
        raise StoreFormatError(f"{source}: the manifest's env_id ({env_id!r:.80}) is not a string")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise StoreFormatError(f"{source}: the manifest's seed ({seed!r:.80}) is not an int")
    if not isinstance(metadata, dict):
        raise StoreFormatError(
            f"{source}: the manifest's metadata ({metadata!r:.80}) is not an object"
        )
    if not isinstance(data.get("columns"), list):
        raise StoreFormatError(f"{source}: the manifest's column list is missing or not a list")
    return {
        "format_version": version,
        "torchstore_version": str(data.get("torchstore_version", "?")),
        "created": str(data.get("created", "")),
        "env_id": env_id,
        "seed": seed,
        "metadata": dict(metadata),
        "columns": data["columns"],
    }
