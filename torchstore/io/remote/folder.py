"""Folder transport: a local directory (``/path``, ``file://``) or any fsspec URL (``s3://``...).

Local folders get atomic writes (a hidden temporary name in the same folder, then
``os.replace``); fsspec targets get one ``put``/``pipe`` per file, which object stores apply
atomically per object. fsspec is imported only for non-local URLs.

Concurrent writers (several pushes at once): a local folder's conditional write holds an
exclusive ``flock`` on ``.<name>.lock`` beside the file while it compares and replaces
(the kernel drops it if the process dies, so no lock is ever stale), and an exclusive
upload (``upload(..., exclusive=True)``) is a hard link of the finished temporary file,
which fails if the name exists. fsspec has neither: its conditional write and exclusive
upload check first and write after, so two writers at the same instant can still collide
there (one pusher at a time per fsspec location).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

from torchstore.errors import IntegrityError
from torchstore.io.paths import check_relpath, resolve_inside
from torchstore.io.remote.http import RemoteChangedError
from torchstore.io.remote.transfer import Progress, RemoteNotFoundError, TransferError

__all__ = ["LocalFolderClient", "FsspecClient", "folder_client"]

_CHUNK = 1 << 20


def _etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


def _copy(src, dst, remaining: int, progress: Progress | None) -> int:
    while remaining > 0:
        chunk = src.read(min(_CHUNK, remaining))
        if not chunk:
            break
        dst.write(chunk)
        remaining -= len(chunk)
        if progress is not None:
            progress(len(chunk))
    return remaining


def _size_rule(rel: str, got: int, size: int) -> None:
    if got != size:
        rule = "larger than" if got > size else "smaller than"
        raise IntegrityError(
            f"'{rel}': the remote file has {got} bytes, {rule} the {size} bytes declared"
        )


def _check_unchanged(
    client, rel: str, if_match: str | None, if_absent: bool, *, where: str
) -> None:
    """The conditional-write rule both folder clients share: refuse if ``rel`` changed."""
    if if_match is None and not if_absent:
        return
    current = client.read_bytes(rel, limit=1 << 62)
    if (if_absent and current is not None) or (
        if_match is not None and (current is None or current[1] != if_match)
    ):
        raise RemoteChangedError(f"{where} changed since it was read")


def _link_or_claim(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the name ``path`` only if no file has it (``FileExistsError`` if one does)."""
    try:
        os.link(tmp, path)
        return
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    # no hard links here: claim the name (O_EXCL), then fill it; nothing lists it yet
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    os.replace(tmp, path)


class LocalFolderClient:
    """Byte transport relative to a local folder."""

    def __init__(self, base: str | os.PathLike):
        self.root = Path(base)
        self.base = str(self.root)

    def __repr__(self) -> str:
        return f"LocalFolderClient({self.base!r})"

    def _path(self, rel: str) -> Path:
        return self.root / check_relpath(rel)

    def read_bytes(self, rel: str, *, limit: int) -> tuple[bytes, str | None] | None:
        path = self._path(rel)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        if size > limit:
            raise TransferError(f"{path} has {size} bytes, more than {limit}; refusing to read it")
        data = path.read_bytes()
        return data, _etag(data)

    def download(
        self, rel: str, partial: Path, *, size: int, progress: Progress | None = None
    ) -> None:
        path = self._path(rel)
        try:
            src = open(path, "rb")
        except FileNotFoundError:
            raise RemoteNotFoundError(f"no file {path}") from None
        with src:
            _size_rule(rel, os.fstat(src.fileno()).st_size, size)
            have = partial.stat().st_size if partial.exists() else 0
            if have > size:
                partial.unlink()
                have = 0
            src.seek(have)
            with open(partial, "ab") as dst:
                if _copy(src, dst, size - have, progress):
                    raise TransferError(f"{path} shrank while it was read")

    def _replace(self, rel: str, write, *, exclusive: bool = False) -> None:
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if not exclusive:
                os.replace(tmp, path)
                return
            try:  # a link never replaces: the name appears complete, or the call fails
                _link_or_claim(tmp, path)
            except FileExistsError:
                raise RemoteChangedError(f"{path} exists already; not replacing it") from None
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self, rel: str):
        """Hold the exclusive lock of ``rel`` (a ``flock`` on ``.<name>.lock`` beside it)."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks: held only to compare and replace
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def upload(
        self, src: Path, rel: str, *, progress: Progress | None = None, exclusive: bool = False
    ) -> None:
        """Copy ``src`` to ``rel``; ``exclusive``: :class:`RemoteChangedError` if ``rel`` exists."""

        def write(f):
            with open(src, "rb") as s:
                _copy(s, f, os.fstat(s.fileno()).st_size, progress)

        self._replace(rel, write, exclusive=exclusive)

    def write_bytes(
        self, rel: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> None:
        """Write ``rel``, if its ETag is ``if_match`` or (``if_absent``) it is new; compared
        and replaced under the file's lock, so two writers never both pass the check."""
        if if_match is None and not if_absent:
            self._replace(rel, lambda f: f.write(data))
            return
        with self._locked(rel):
            _check_unchanged(self, rel, if_match, if_absent, where=str(self._path(rel)))
            self._replace(rel, lambda f: f.write(data))

    def delete(self, rel: str) -> None:
        """Remove ``rel`` (gone already is fine), then the folders that leaves empty."""
        path = resolve_inside(self.root, rel, subject="file to delete")
        path.unlink(missing_ok=True)
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


class FsspecClient:
    """Byte transport relative to an fsspec URL (needs ``pip install fsspec`` and its backend)."""

    def __init__(self, base: str):
        try:
            import fsspec
        except ImportError as exc:
            raise ImportError(f"location {base!r} needs fsspec: pip install fsspec") from exc
        self.base = base.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.base)

    def __repr__(self) -> str:
        return f"FsspecClient({self.base!r})"

    def _path(self, rel: str) -> str:
        return f"{self._root.rstrip('/')}/{check_relpath(rel)}"

    def read_bytes(self, rel: str, *, limit: int) -> tuple[bytes, str | None] | None:
        path = self._path(rel)
        if not self._fs.exists(path):
            return None
        size = self._fs.size(path)
        if size is not None and size > limit:
            raise TransferError(
                f"{self.base}/{rel} has {size} bytes, more than {limit}; refusing to read it"
            )
        data = self._fs.cat_file(path)
        return data, _etag(data)

    def download(
        self, rel: str, partial: Path, *, size: int, progress: Progress | None = None
    ) -> None:
        path = self._path(rel)
        if not self._fs.exists(path):
            raise RemoteNotFoundError(f"no file {self.base}/{rel}")
        _size_rule(rel, self._fs.size(path), size)
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:
            partial.unlink()
            have = 0
        with self._fs.open(path, "rb") as src, open(partial, "ab") as dst:
            src.seek(have)
            if _copy(src, dst, size - have, progress):
                raise TransferError(f"{self.base}/{rel} shrank while it was read")

    def upload(
        self, src: Path, rel: str, *, progress: Progress | None = None, exclusive: bool = False
    ) -> None:
        """Copy ``src`` to ``rel``; ``exclusive``: :class:`RemoteChangedError` if ``rel`` exists
        (checked before writing: fsspec has no create-if-absent)."""
        path = self._path(rel)
        if exclusive and self._fs.exists(path):
            raise RemoteChangedError(f"{self.base}/{rel} exists already; not replacing it")
        self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with open(src, "rb") as s, self._fs.open(path, "wb") as d:
            _copy(s, d, os.fstat(s.fileno()).st_size, progress)

    def write_bytes(
        self, rel: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> None:
        _check_unchanged(self, rel, if_match, if_absent, where=f"{self.base}/{rel}")
        path = self._path(rel)
        self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self._fs.pipe_file(path, data)

    def delete(self, rel: str) -> None:
        """Remove ``rel`` (gone already is fine)."""
        path = self._path(rel)
        if self._fs.exists(path):
            self._fs.rm_file(path)


def folder_client(location: str) -> LocalFolderClient | FsspecClient:
    """The client for a folder location: a plain path or ``file://`` URL is local, others fsspec."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"file:// location ({location!r}) must name a local path (file:///path)"
            )
        return LocalFolderClient(unquote(parts.path))
    if parts.scheme == "" or len(parts.scheme) == 1:  # a plain path (or a Windows drive letter)
        return LocalFolderClient(location)
    return FsspecClient(location)
