"""Verified ``Range`` requests for one remote object over HTTP(S) or the Hugging Face Hub.

:func:`locate` reads an object's size and version (ETag or Hub commit) in one request and
returns a fetcher whose :meth:`~_HttpFetcher.fetch` gets bytes ``[start, stop)`` under the
rules :mod:`torchstore.io.remote.ranged` states: a ``206`` with exactly that range and body,
the version seen at open, retries within a bound, then one :class:`TransferError`.
:class:`~torchstore.io.remote.ranged.RangedFile` builds pages, blocks and caching on top of
any fetcher (this module's, or :mod:`.object_store`'s for ``s3://``/``gs://``).
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from torchstore.errors import RemoteChangedError
from torchstore.io.remote.http import _CONTENT_RANGE, HttpClient, _Retry, _shown
from torchstore.io.remote.transfer import TransferError

__all__ = ["RemoteObject", "RangeFetcher", "HttpRangeFetcher", "locate", "is_url", "list_folder"]

#: The slowest transfer rate a request is allowed beyond ``timeout`` (a dripping server).
_MIN_RATE = 64 * 1024
_SCHEMES = ("http://", "https://", "hf://", "s3://", "gs://")


def is_url(path: object) -> bool:
    """Whether ``path`` names a remote object (``http(s)://``, ``hf://``, ``s3://``, ``gs://``)."""
    return isinstance(path, str) and path.startswith(_SCHEMES)


@dataclass(frozen=True, slots=True)
class RemoteObject:
    """One remote object as seen at open.

    Attributes:
        url: where ranges are fetched (for the Hub, the URL at the resolved commit).
        shown: the name used in messages: no user info, no query, no token.
        size: bytes in the object.
        version: the ETag (HTTP) or commit (Hub) every answer must match; None when the
            server sends no ETag (then only the size is checked).
        hub: whether the object is on a Hugging Face Hub.
    """

    url: str
    shown: str
    size: int
    version: str | None
    hub: bool = False

    @property
    def key(self) -> str:
        """What names this version of the object in a cache."""
        return f"{self.shown}\n{self.version}\n{self.size}"


def _etag(value: str | None) -> str | None:
    """An ETag compared as the server means it (a weak ``W/`` prefix dropped)."""
    if not value:
        return None
    return value[2:] if value.startswith("W/") else value


class _PooledClient(HttpClient):
    """An :class:`HttpClient` that keeps one connection per thread and origin between range
    requests (a new TCP and TLS handshake for each 16 KiB page would cost more round trips
    than the pages). A connection goes back to the pool only after an answer whose body was
    read whole; any other ends with it closed. One that the server closed while idle fails
    its next request, which is retried on a new connection like any dropped connection."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._local = threading.local()
        self._pid = os.getpid()

    def _pool(self) -> dict:
        if self._pid != os.getpid():  # a forked child: its parent's sockets are not its own
            self._local, self._pid = threading.local(), os.getpid()
        if not hasattr(self._local, "conns"):
            self._local.conns = {}
        return self._local.conns

    def _connect(self, parts) -> http.client.HTTPConnection:
        key = (parts.scheme, parts.hostname, parts.port)
        conn = self._pool().pop(key, None)
        if conn is None:
            conn = super()._connect(parts)
            conn.torchstore_key = key
        return conn

    def close_connections(self) -> None:
        """Close this thread's kept connections (a pool thread's close when it ends)."""
        for conn in self._pool().values():
            conn.close()
        self._pool().clear()

    def release(self, resp: http.client.HTTPResponse, reusable: bool) -> None:
        """Close ``resp``; keep its connection for the next request if ``reusable``."""
        conn = getattr(resp, "torchstore_connection", None)
        resp.close()
        if conn is None:
            return
        if reusable and not resp.will_close:
            old = self._pool().pop(conn.torchstore_key, None)
            if old is not None and old is not conn:
                old.close()
            self._pool()[conn.torchstore_key] = conn
        else:
            conn.close()


# ----------------------------------------------------------------- locating
def _parse_hf(url: str) -> tuple[str, str, str | None, str]:
    """``(repo_type, repo_id, revision, path)`` of ``hf://datasets/NS/NAME[@REV]/PATH``
    (``hf://NS/NAME/...`` is a model, as in huggingface_hub's file system)."""
    parts = url[len("hf://") :].split("/")
    repo_type = "model"
    if parts and parts[0] in ("datasets", "models"):
        repo_type = "dataset" if parts.pop(0) == "datasets" else "model"
    if len(parts) < 3 or not all(parts):
        raise ValueError(f"Hub URL ({url!r}) must be hf://datasets/NAMESPACE/NAME[@REVISION]/PATH")
    name, _, revision = parts[1].partition("@")
    return repo_type, f"{parts[0]}/{name}", unquote(revision) or None, "/".join(parts[2:])


class RangeFetcher(Protocol):
    """What :class:`~torchstore.io.remote.ranged.RangedFile` fetches through: verified bytes
    of one object as seen at open, and counts of what it sent and received."""

    obj: RemoteObject
    bytes_fetched: int
    requests: int

    def fetch(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)``, verified, retried within a bound, else one error."""
        ...

    def close(self) -> None:
        """Let go of connections (the fetcher is not used after)."""
        ...


def list_folder(url: str, suffixes: Sequence[str], *, token: str | None = None) -> list[str]:
    """The URLs of the files directly in folder ``url`` whose names end in one of
    ``suffixes`` (hidden names skipped), sorted, each pinned to the commit the folder's
    revision names now, so every file comes from one version.

    Only the Hub lists folders (``hf://datasets/NS/NAME[@REV]/DIR/``); a web server has no
    listing to read, so its files are named one by one.
    """
    if not url.startswith("hf://"):
        raise ValueError(
            f"{_shown(url)} is a folder URL, and only hf:// folders can be listed; give the "
            "store files' URLs as a list instead"
        )
    from torchstore.io.remote.hub import HubClient, default_endpoint

    # a "." stands for the file part, so a repo's root folder parses too
    repo_type, repo_id, revision, folder = _parse_hf(url.rstrip("/") + "/.")
    folder = folder[:-1].rstrip("/")
    namespace, name = repo_id.split("/", 1)
    hub = HubClient(namespace, repo_type=repo_type, endpoint=default_endpoint(), token=token)
    commit = hub.resolve(name, revision)
    prefix = f"{folder}/" if folder else ""
    kind = "datasets/" if repo_type == "dataset" else ""
    return sorted(
        f"hf://{kind}{repo_id}@{commit}/{f.path}"
        for f in hub.list_files(name, commit)
        if f.path.startswith(prefix)
        and "/" not in f.path[len(prefix) :]
        and not f.path.rsplit("/", 1)[-1].startswith(".")
        and f.path.endswith(tuple(suffixes))
    )


def locate(
    url: str, *, token: str | None = None, timeout: float = 30.0, retries: int = 5
) -> RangeFetcher:
    """A fetcher for the object at ``url``, its size and version read (one request):
    ``http(s)://`` and ``hf://`` here, ``s3://`` and ``gs://`` through :mod:`.object_store`."""
    if url.startswith(("s3://", "gs://")):
        from torchstore.io.remote.object_store import locate_object

        return locate_object(url, timeout=timeout, retries=retries)
    if url.startswith("hf://"):
        return HttpRangeFetcher(*_locate_hub(url, token=token, timeout=timeout, retries=retries))
    client = _PooledClient(url, timeout=timeout, retries=retries, token=token)
    shown = _shown(url)

    def once() -> RemoteObject:
        resp = client._open("GET", url, headers={"Range": "bytes=0-0"})
        whole = False
        try:
            if resp.status == 200:
                resp.close()
                raise TransferError(
                    f"GET {shown}: the server answered 200 to a Range request; a store is "
                    "opened in place only from a server that answers byte ranges (206)"
                )
            if resp.status != 206:
                client._fail("GET", url, resp)
            match = _CONTENT_RANGE.fullmatch(resp.getheader("Content-Range", ""))
            if not match or match.group(3) == "*":
                raise _Retry(f"GET {shown} bytes 0-0: no usable Content-Range in the answer")
            whole = len(resp.read(2)) == 1
            return RemoteObject(url, shown, int(match.group(3)), _etag(resp.getheader("ETag")))
        finally:
            client.release(resp, reusable=whole)

    return HttpRangeFetcher(client._attempts(f"GET {shown}", once), client)


def _locate_hub(
    url: str, *, token: str | None, timeout: float, retries: int
) -> tuple[RemoteObject, HttpClient]:
    from torchstore.io.remote.hub import HubClient, default_endpoint, require_huggingface_hub

    hf = require_huggingface_hub()
    repo_type, repo_id, revision, path = _parse_hf(url)
    endpoint = default_endpoint()
    hub = HubClient(repo_id.split("/")[0], repo_type=repo_type, endpoint=endpoint, token=token)
    kwargs = {"repo_type": repo_type, "endpoint": endpoint}
    meta = hub._call(
        f"resolve {url}",
        hf.get_hf_file_metadata,
        hf.hf_hub_url(repo_id, path, revision=revision, **kwargs),
        token=token,
        endpoint=endpoint,
    )
    if meta.size is None:
        raise TransferError(f"{url}: the Hub did not say how large the file is")
    commit = meta.commit_hash
    pinned = hf.hf_hub_url(repo_id, path, revision=commit or revision, **kwargs)
    headers = hf.utils.build_hf_headers(token=token)
    auth = headers.get("authorization") or headers.get("Authorization") or ""
    bearer = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
    client = _PooledClient(pinned, timeout=timeout, retries=retries, token=bearer or "")
    version = commit or _etag(meta.etag)
    return RemoteObject(pinned, url, int(meta.size), version, hub=True), client


# ----------------------------------------------------------------- fetching
class HttpRangeFetcher:
    """Verified ``Range`` requests for one :class:`RemoteObject` (a :class:`RangeFetcher`)."""

    def __init__(self, obj: RemoteObject, client: HttpClient):
        self.obj = obj
        self.client = client
        #: body bytes received (every attempt), and requests sent
        self.bytes_fetched = 0
        self.requests = 0
        self._lock = threading.Lock()

    def fetch(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object, verified, retried within the client's bound."""
        if not 0 <= start < stop <= self.obj.size:
            raise ValueError(
                f"byte range [{start}, {stop}) is outside {self.obj.shown} ({self.obj.size} bytes)"
            )
        what = f"GET {self.obj.shown} bytes {start}-{stop - 1}"
        return self.client._attempts(what, lambda: self._once(what, start, stop))

    def _once(self, what: str, start: int, stop: int) -> bytes:
        obj, n = self.obj, stop - start
        with self._lock:
            self.requests += 1
        resp = self.client._open("GET", obj.url, headers={"Range": f"bytes={start}-{stop - 1}"})
        whole = False
        try:
            if resp.status == 200:
                raise _Retry(f"{what}: answered 200 (the whole object) where 206 was asked")
            if resp.status == 416:
                raise RemoteChangedError(
                    f"{what}: range not satisfiable; {obj.shown} changed since it was opened "
                    "(it is shorter now); open it again"
                )
            if resp.status != 206:
                self.client._fail("GET", obj.url, resp)
            self._check_version(what, resp)
            self._check_range(what, resp, start, stop)
            body = self._body(what, resp, n)
            whole = True
            return body
        finally:
            if isinstance(self.client, _PooledClient):
                self.client.release(resp, reusable=whole)
            else:
                resp.close()

    def _check_version(self, what: str, resp: http.client.HTTPResponse) -> None:
        obj = self.obj
        if obj.hub:  # fetched at its commit's URL; the Hub names the commit it served
            got = resp.getheader("X-Repo-Commit")
            if got and obj.version and got != obj.version:
                raise RemoteChangedError(f"{what}: served commit {got}, opened at {obj.version}")
            return
        got = _etag(resp.getheader("ETag"))
        if obj.version is not None and got is not None and got != obj.version:
            raise RemoteChangedError(
                f"{what}: {obj.shown} changed since it was opened (ETag {got}, was "
                f"{obj.version}); open it again to read the new version"
            )

    def _check_range(self, what: str, resp, start: int, stop: int) -> None:
        header = resp.getheader("Content-Range", "")
        match = _CONTENT_RANGE.fullmatch(header)
        if match and match.group(3) not in ("*", str(self.obj.size)):
            raise RemoteChangedError(
                f"{what}: {self.obj.shown} changed since it was opened (now "
                f"{match.group(3)} bytes, was {self.obj.size}); open it again"
            )
        if not match or (int(match.group(1)), int(match.group(2))) != (start, stop - 1):
            raise _Retry(f"{what}: answered the range {header or 'none'!r}")
        length = resp.getheader("Content-Length")
        if length is not None and length.strip() != str(stop - start):
            raise _Retry(f"{what}: declared a body of {length.strip()} bytes, not {stop - start}")

    def _body(self, what: str, resp, n: int) -> bytes:
        """Exactly ``n`` body bytes, within ``timeout + n / _MIN_RATE`` seconds."""
        deadline = time.monotonic() + self.client.timeout + n / _MIN_RATE
        parts, got = [], 0
        try:
            while got < n:
                chunk = resp.read1(n - got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
                with self._lock:
                    self.bytes_fetched += len(chunk)
                if got < n and time.monotonic() > deadline:
                    raise _Retry(f"{what}: {got} of {n} bytes arrived before the time limit")
        except TimeoutError as exc:
            raise _Retry(
                f"{what}: stalled {self.client.timeout:g} s after {got} of {n} bytes"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _Retry(
                f"{what}: connection lost after {got} of {n} bytes ({type(exc).__name__})"
            ) from exc
        if got < n:
            raise _Retry(f"{what}: the body ended after {got} of {n} bytes")
        return b"".join(parts)

    def close(self) -> None:
        if isinstance(self.client, _PooledClient):
            self.client.close_connections()
