"""Hugging Face Hub transport: repos under one namespace, through ``huggingface_hub``.

``huggingface_hub`` is imported lazily; without it a Hub location fails with an
``ImportError`` that names the pip extra (``pip install -e ".[hub]"``).

The endpoint is ``endpoint=``, else ``HF_ENDPOINT`` read at call time (so a test or a
mirror can set it after ``huggingface_hub`` was imported); it is passed explicitly to
every call. The token is whatever ``huggingface_hub`` finds (``HF_TOKEN``, the stored
login, or ``token=``); this module only uses it to scrub messages, never prints it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchstore.extras import install_hint
from torchstore.io.paths import check_relpath, resolve_inside
from torchstore.io.remote.transfer import Progress, RemoteNotFoundError, TransferError, redact

__all__ = [
    "HubClient",
    "HubFile",
    "REPO_TYPES",
    "require_huggingface_hub",
    "hub_constants",
    "hub_errors",
    "default_endpoint",
]

log = logging.getLogger(__name__)

REPO_TYPES = ("dataset", "model")


def require_huggingface_hub():
    """The ``huggingface_hub`` module, or an ImportError naming the extra to install."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError(
            f"Hub locations need huggingface_hub: {install_hint('hub', 'lerobot')}"
        ) from exc
    return huggingface_hub


def hub_constants():
    """``huggingface_hub.constants``, imported explicitly.

    huggingface_hub loads its submodules lazily: ``huggingface_hub.constants`` is not an
    attribute of the package until something imports it, so ``hf.constants`` fails in a
    fresh interpreter. ``import_module`` always returns the loaded submodule.
    """
    require_huggingface_hub()
    return importlib.import_module("huggingface_hub.constants")


def hub_errors():
    """``huggingface_hub.errors``, imported explicitly (see :func:`hub_constants`)."""
    require_huggingface_hub()
    return importlib.import_module("huggingface_hub.errors")


def default_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``HF_ENDPOINT`` read now, else huggingface_hub's (huggingface.co)."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or hub_constants().ENDPOINT).rstrip("/")


@dataclass(frozen=True, slots=True)
class HubFile:
    """One file of a repo at a commit, as the Hub lists it."""

    path: str
    size: int
    blob_sha1: str | None
    lfs_sha256: str | None


def _forwarding_tqdm(progress: Progress | None):
    """A silent tqdm class whose ``update`` feeds ``progress`` (one bar for a whole pull)."""
    from tqdm.auto import tqdm

    class _Forward(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if progress is not None and n:
                progress(int(n))

    return _Forward


class _RetryNotes(logging.Filter):
    """Moves huggingface_hub's per-attempt retry warnings to torchstore's debug log.

    A failure is reported once, as the error torchstore raises; the attempts before it
    ("Retrying in 1s", "... thrown while requesting ...") are not the user's business.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("huggingface_hub: %s", record.getMessage())
        return False


_RETRY_LOGGER = "huggingface_hub.utils._http"


@contextlib.contextmanager
def _retries_logged_quietly():
    logger = logging.getLogger(_RETRY_LOGGER)
    quiet = _RetryNotes()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class HubClient:
    """Repos of one type under one namespace on a Hub endpoint.

    Args:
        namespace: the user or organisation (``"lerobot"``).
        repo_type: ``"dataset"`` or ``"model"``.
        endpoint: the Hub URL; ``HF_ENDPOINT`` or huggingface.co by default.
        token: a token for this client only; by default huggingface_hub's own lookup.
    """

    def __init__(
        self,
        namespace: str,
        *,
        repo_type: str = "dataset",
        endpoint: str | None = None,
        token: str | None = None,
    ):
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type ({repo_type!r}) must be one of {REPO_TYPES}")
        hf = require_huggingface_hub()
        self.namespace = namespace
        self.repo_type = repo_type
        self.endpoint = default_endpoint(endpoint)
        self._token = token
        self._api = hf.HfApi(endpoint=self.endpoint, token=token)

    def __repr__(self) -> str:
        return (
            f"HubClient({self.namespace!r}, repo_type={self.repo_type!r}, "
            f"endpoint={self.endpoint!r})"
        )

    def repo_id(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    # ----------------------------------------------------------------- errors
    def _secrets(self) -> list[str | None]:
        try:
            found = require_huggingface_hub().get_token()
        except Exception:  # a broken token file must not hide the real error
            found = None
        return [self._token, found]

    def _translate(self, exc: Exception, what: str) -> Exception:
        errors = hub_errors()
        text = redact(
            f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            self._secrets(),
        )
        if isinstance(
            exc,
            errors.RepositoryNotFoundError
            | errors.RevisionNotFoundError
            | errors.EntryNotFoundError,
        ):
            return RemoteNotFoundError(text)
        return TransferError(text)

    def _call(self, what: str, fn, *args, **kwargs):
        errors = hub_errors()
        try:
            with _retries_logged_quietly():
                return fn(*args, **kwargs)
        except (
            errors.HfHubHTTPError,
            errors.LocalEntryNotFoundError,
            errors.EntryNotFoundError,
            OSError,
            ConnectionError,
        ) as exc:
            raise self._translate(exc, what) from None
        except Exception as exc:  # httpx errors and friends: still a transfer failure
            if type(exc).__module__.split(".")[0] in (
                "httpx",
                "httpx2",
                "httpcore",
                "httpcore2",
                "huggingface_hub",
            ):
                raise self._translate(exc, what) from None
            raise

    # ----------------------------------------------------------------- reading
    def list_repos(self) -> list[str]:
        """Names of the repos under the namespace (without the namespace)."""
        lister = self._api.list_datasets if self.repo_type == "dataset" else self._api.list_models
        infos = self._call(
            f"listing {self.repo_type} repos of {self.namespace!r}",
            lambda: list(lister(author=self.namespace)),
        )
        prefix = self.namespace + "/"
        return sorted(info.id[len(prefix) :] for info in infos if info.id.startswith(prefix))

    def resolve(self, name: str, revision: str | None) -> str:
        """The 40-hex commit that ``revision`` (default: the main branch) names."""
        info = self._call(
            f"resolving revision {revision or 'main'!r} of {self.repo_id(name)!r}",
            self._api.repo_info,
            self.repo_id(name),
            revision=revision,
            repo_type=self.repo_type,
        )
        return info.sha

    def list_files(self, name: str, commit: str) -> list[HubFile]:
        """Every file of the repo at ``commit`` (paths checked with :func:`check_relpath`)."""
        from huggingface_hub.hf_api import RepoFile

        items = self._call(
            f"listing the files of {self.repo_id(name)!r}",
            lambda: list(
                self._api.list_repo_tree(
                    self.repo_id(name), recursive=True, revision=commit, repo_type=self.repo_type
                )
            ),
        )
        files = []
        for item in items:
            if isinstance(item, RepoFile):
                path = check_relpath(item.path, subject=f"file of Hub repo {self.repo_id(name)!r}")
                lfs = item.lfs.sha256 if item.lfs is not None else None
                files.append(HubFile(path, int(item.size), item.blob_id, lfs))
        return files

    def download(
        self, name: str, path: str, commit: str, staging: Path, *, progress: Progress | None = None
    ) -> Path:
        """Download one file into ``staging`` (a private folder); returns its path there."""
        hf = require_huggingface_hub()
        check_relpath(path, subject=f"file of Hub repo {self.repo_id(name)!r}")
        kwargs: dict[str, Any] = {}
        try:
            kwargs["tqdm_class"] = _forwarding_tqdm(progress)
        except ImportError:
            pass
        got = self._call(
            f"downloading {path!r} of {self.repo_id(name)!r}",
            hf.hf_hub_download,
            self.repo_id(name),
            path,
            repo_type=self.repo_type,
            revision=commit,
            local_dir=staging,
            endpoint=self.endpoint,
            token=self._token,
            **kwargs,
        )
        expected = resolve_inside(staging, path, subject=f"file of Hub repo {self.repo_id(name)!r}")
        if Path(got).resolve() != expected.resolve():
            raise TransferError(f"huggingface_hub put {path!r} at {got}, not at {expected}")
        return expected

    # ----------------------------------------------------------------- writing
    def commit(
        self,
        name: str,
        adds: Mapping[str, Path | bytes],
        deletes: Sequence[str] = (),
        *,
        message: str,
    ) -> str | None:
        """Create the repo if needed, then add/delete files in ONE commit.

        Returns:
            The commit's id, or None when there was nothing to change.
        """
        hf = require_huggingface_hub()
        repo_id = self.repo_id(name)
        self._call(
            f"creating {repo_id!r}",
            self._api.create_repo,
            repo_id,
            repo_type=self.repo_type,
            exist_ok=True,
        )
        ops: list[Any] = [
            hf.CommitOperationAdd(
                path_in_repo=check_relpath(p),
                path_or_fileobj=src if isinstance(src, bytes) else str(src),
            )
            for p, src in adds.items()
        ]
        ops += [hf.CommitOperationDelete(path_in_repo=check_relpath(p)) for p in deletes]
        if not ops:
            return None
        info = self._call(
            f"committing {len(ops)} changes to {repo_id!r}",
            self._api.create_commit,
            repo_id,
            ops,
            commit_message=message,
            repo_type=self.repo_type,
        )
        return info.oid
