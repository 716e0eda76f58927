"""Resumable HTTP(S) transport over the standard library (``http.client``), no extra dependency.

- Downloads append to a partial file and continue with ``Range: bytes=N-`` after a dropped
  connection, a timeout or a 5xx, within one call (up to ``retries`` more attempts) and
  across calls (the partial file stays). A ``200`` answer to a range request restarts the
  file; a ``206`` whose start is not ``N`` is refused and restarted.
- A body larger than the declared size is refused as soon as the extra byte arrives.
- Uploads are ``PUT`` of the whole file; ``write_bytes`` can be conditional (``If-Match`` /
  ``If-None-Match: *``), so can ``upload(..., exclusive=True)`` (``If-None-Match: *``), and
  a server answering ``412`` raises :class:`RemoteChangedError`. Concurrent pushers are
  only safe on a server that honours those headers on ``PUT`` and sends an ``ETag`` on
  ``GET``; one that ignores them gives "last writer wins".
- ``delete`` sends ``DELETE``; a server that does not allow it (``405``, ``501``, ``403``)
  raises :class:`TransferError`, and ``404`` (gone already) is success.
- A ``429`` or ``503`` with ``Retry-After: <seconds>`` waits that long (at most
  ``MAX_RETRY_AFTER_S``) before the next attempt; other retries back off exponentially.
- Redirects are followed by hand (at most 5), and the ``Authorization`` header is sent to
  the base URL's origin only.
- Token: ``token=`` or the ``TORCHSTORE_HTTP_TOKEN`` environment variable, sent as
  ``Authorization: Bearer ...``. It never appears in a message, a log line or a ``repr``.
- ``timeout`` bounds each wait for the server; ``deadline`` (a ``time.monotonic()``
  instant, set by a caller such as ``pull(deadline_s=...)``) bounds a whole download,
  checked before each attempt and after each read, so a server dripping bytes just
  inside ``timeout`` cannot hold it for ever (:class:`DeadlineError`; it may overrun by
  up to one ``timeout``).
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from torchstore.errors import IntegrityError, RemoteChangedError
from torchstore.io.paths import check_relpath
from torchstore.io.remote.transfer import (
    DeadlineError,
    Progress,
    RemoteNotFoundError,
    TransferError,
    redact,
)
from torchstore.validation import non_negative_int, positive_number

__all__ = ["HttpClient", "RemoteChangedError", "TOKEN_ENV"]

log = logging.getLogger(__name__)

TOKEN_ENV = "TORCHSTORE_HTTP_TOKEN"
_CHUNK = 1 << 20
_MAX_REDIRECTS = 5
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or ""), parts.port


def _shown(url: str) -> str:
    """The URL without user info or query (either may hold a credential)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


#: The longest ``Retry-After`` honoured before the next attempt (a longer one is cut to it).
MAX_RETRY_AFTER_S = 30.0


class _Retry(Exception):
    """An attempt failed in a way another attempt may fix (``after``: the server's
    ``Retry-After``, in seconds, when it sent one)."""

    def __init__(self, text: str, after: float | None = None):
        super().__init__(text)
        self.after = after


def _retry_after(resp: http.client.HTTPResponse) -> float | None:
    """The seconds a ``Retry-After`` header asks for (delta-seconds form), None without one."""
    value = (resp.getheader("Retry-After") or "").strip()
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S) if value else None
    except ValueError:
        return None  # an HTTP date: fall back to the backoff


class HttpClient:
    """Byte transport relative to an ``http(s)://`` base URL.

    Args:
        base: the base URL; files live at ``base/<rel>``.
        timeout: seconds to wait for the server to connect, answer or send more bytes.
        retries: further attempts after a dropped connection, a timeout or a 5xx.
        token: bearer token; defaults to the ``TORCHSTORE_HTTP_TOKEN`` environment variable.

    Examples:
        >>> client = HttpClient("http://127.0.0.1:8000/datasets")
        >>> client.url("pusht/index.json")
        'http://127.0.0.1:8000/datasets/pusht/index.json'
    """

    def __init__(
        self, base: str, *, timeout: float = 30.0, retries: int = 5, token: str | None = None
    ):
        scheme, host, _ = _origin(base)
        if scheme not in ("http", "https") or not host:
            raise ValueError(f"base URL ({_shown(base)!r}) must be http:// or https:// with a host")
        positive_number("timeout", timeout, finite=False, hint=" (seconds)")
        non_negative_int("retries", retries)
        self.base = base.rstrip("/")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.deadline: float | None = None  # time.monotonic() past which downloads stop
        self._token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)

    def __repr__(self) -> str:
        token = "set" if self._token else "none"
        return f"HttpClient({_shown(self.base)!r}, timeout={self.timeout}, token={token})"

    def url(self, rel: str) -> str:
        return f"{self.base}/{quote(check_relpath(rel))}"

    # ----------------------------------------------------------------- plumbing
    def _headers(self, url: str, extra: dict[str, str] | None) -> dict[str, str]:
        headers = {"User-Agent": "torchstore", "Accept-Encoding": "identity"}
        if self._token and _origin(url) == _origin(self.base):
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    def _message(self, text: str) -> str:
        return redact(text, [self._token])

    def _open(self, method: str, url: str, *, headers=None, body=None) -> http.client.HTTPResponse:
        """Send one request (following same-method redirects); the caller closes the response."""
        for _ in range(_MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            conn = self._connect(parts)
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            try:
                conn.request(method, target, body=body, headers=self._headers(url, headers))
                resp = conn.getresponse()
            except TimeoutError as exc:
                conn.close()
                raise _Retry(
                    f"{method} {_shown(url)}: timed out after {self.timeout:g} s with no answer"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _Retry(f"{method} {_shown(url)}: {type(exc).__name__}: {exc}") from exc
            if resp.status in (301, 302, 303, 307, 308) and method in ("GET", "HEAD"):
                location = resp.getheader("Location")
                resp.read()
                conn.close()
                if not location:
                    raise TransferError(
                        self._message(f"{method} {_shown(url)}: redirect without a Location")
                    )
                url = (
                    location
                    if "://" in location
                    else urlunsplit((parts.scheme, parts.netloc, location, "", ""))
                )
                continue
            resp.torchstore_connection = conn  # for a client that keeps connections
            return resp
        raise TransferError(
            self._message(f"{method} {_shown(url)}: more than {_MAX_REDIRECTS} redirects")
        )

    def _connect(self, parts) -> http.client.HTTPConnection:
        """A connection to ``parts``' origin: a new one for each request here."""
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.timeout, blocksize=_CHUNK)

    def _fail(self, method: str, url: str, resp: http.client.HTTPResponse) -> None:
        """Raise for a non-success status: retryable ones as :class:`_Retry`."""
        status = resp.status
        resp.read(4096)
        text = f"{method} {_shown(url)}: HTTP {status} {resp.reason}"
        if status in _RETRY_STATUS:
            raise _Retry(text, _retry_after(resp))
        if status == 404:
            raise RemoteNotFoundError(self._message(text))
        if status == 412:
            raise RemoteChangedError(self._message(f"{text}: it changed since it was read"))
        if status in (401, 403):
            text += f"; set {TOKEN_ENV} to a token with access"
        raise TransferError(self._message(text))

    def _attempts(self, what: str, fn):
        """Run ``fn`` until it succeeds, retrying :class:`_Retry` failures with backoff."""
        last = ""
        for attempt in range(self.retries + 1):
            self._check_deadline(what)
            try:
                return fn()
            except _Retry as exc:
                last, after = str(exc), exc.after
                log.debug(
                    "%s failed (attempt %d of %d): %s",
                    what,
                    attempt + 1,
                    self.retries + 1,
                    self._message(last),
                )
                if attempt < self.retries:
                    backoff = min(0.05 * 2**attempt, 2.0)
                    time.sleep(backoff if after is None else max(after, backoff))
        raise TransferError(self._message(f"{last} (gave up after {self.retries + 1} attempts)"))

    def _check_deadline(self, what: str) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineError(
                self._message(
                    f"{what}: past the overall deadline; the partial download is kept, a later "
                    "pull resumes it"
                )
            )

    # ----------------------------------------------------------------- reading
    def read_bytes(self, rel: str, *, limit: int) -> tuple[bytes, str | None] | None:
        """``(content, etag)`` of ``rel``, or ``None`` on 404; refuses more than ``limit`` bytes."""
        url = self.url(rel)

        def once():
            resp = self._open("GET", url)
            try:
                if resp.status == 404:
                    resp.read(4096)
                    return None
                if resp.status != 200:
                    self._fail("GET", url, resp)
                try:
                    data = resp.read(limit + 1)
                except (OSError, http.client.HTTPException) as exc:
                    raise _Retry(f"GET {_shown(url)}: {type(exc).__name__}: {exc}") from exc
                if len(data) > limit:
                    raise TransferError(
                        f"GET {_shown(url)}: more than {limit} bytes; refusing to read it"
                    )
                return data, resp.getheader("ETag")
            finally:
                resp.close()

        return self._attempts(f"GET {_shown(url)}", once)

    def download(
        self, rel: str, partial: Path, *, size: int, progress: Progress | None = None
    ) -> None:
        """Append the bytes of ``rel`` to ``partial`` from its current length until it has ``size``.

        Raises :class:`IntegrityError` if the server has more (or fewer) bytes than ``size``.
        """
        url = self.url(rel)
        partial = Path(partial)
        self._attempts(
            f"GET {_shown(url)}", lambda: self._download_once(url, partial, size, progress)
        )

    def _download_once(self, url: str, partial: Path, size: int, progress: Progress | None) -> None:
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:
            partial.unlink()
            have = 0
        if have == size:
            partial.touch()  # a 0-byte file has nothing to fetch, but must exist
            return
        resp = self._open("GET", url, headers={"Range": f"bytes={have}-"} if have else None)
        try:
            if resp.status == 416:
                partial.unlink(missing_ok=True)  # our partial no longer fits the remote file
                resp.read(4096)
                raise _Retry(
                    f"GET {_shown(url)}: range from byte {have} not satisfiable; restarting"
                )
            if resp.status == 206:
                match = _CONTENT_RANGE.fullmatch(resp.getheader("Content-Range", ""))
                if not match or int(match.group(1)) != have:
                    partial.unlink(missing_ok=True)
                    raise _Retry(
                        f"GET {_shown(url)}: answered a range other than from byte {have}; "
                        "restarting"
                    )
                total = None if match.group(3) == "*" else int(match.group(3))
                mode = "ab"
            elif resp.status == 200:
                length = resp.getheader("Content-Length")
                total = int(length) if length and length.isdigit() else None
                have, mode = 0, "wb"
            else:
                self._fail("GET", url, resp)
            if total is not None and total != size:
                rule = "larger than" if total > size else "smaller than"
                raise IntegrityError(
                    f"{_shown(url)}: the server has {total} bytes, {rule} the {size} bytes declared"
                )
            self._copy_body(resp, partial, mode, size - have, size, url, progress)
        finally:
            resp.close()

    def _copy_body(
        self, resp, partial: Path, mode: str, remaining: int, size: int, url: str, progress
    ) -> None:
        with open(partial, mode) as f:
            try:
                while remaining > 0:
                    # read1: what has arrived, so the deadline is checked while bytes drip in
                    chunk = resp.read1(min(_CHUNK, remaining))
                    if not chunk:
                        break
                    f.write(chunk)
                    remaining -= len(chunk)
                    if progress is not None:
                        progress(len(chunk))
                    if remaining:
                        self._check_deadline(f"GET {_shown(url)}")
                if remaining == 0 and resp.read(1):
                    raise IntegrityError(
                        f"{_shown(url)}: the server sent more bytes than the {size} declared"
                    )
            except DeadlineError:
                raise
            except TimeoutError as exc:
                raise _Retry(
                    f"GET {_shown(url)}: timed out after {self.timeout:g} s mid-body"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise _Retry(
                    f"GET {_shown(url)}: connection lost mid-body ({type(exc).__name__})"
                ) from exc
        if remaining:
            raise _Retry(f"GET {_shown(url)}: connection closed with {remaining} bytes to go")

    # ----------------------------------------------------------------- writing
    def upload(
        self, src: Path, rel: str, *, progress: Progress | None = None, exclusive: bool = False
    ) -> None:
        """``PUT`` the whole of ``src`` to ``rel``; ``exclusive`` only if nothing is there yet
        (``If-None-Match: *``; :class:`RemoteChangedError` when the server says it is)."""
        url = self.url(rel)
        src = Path(src)
        headers = {"If-None-Match": "*"} if exclusive else {}

        def once():
            size = src.stat().st_size
            with open(src, "rb") as f:
                body = _Counted(f, progress)
                self._put(url, body, size, headers)

        self._attempts(f"PUT {_shown(url)}", once)

    def write_bytes(
        self, rel: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> None:
        """``PUT`` ``data`` to ``rel``, if its ETag is ``if_match`` or (``if_absent``) it is new."""
        url = self.url(rel)
        headers = {"Content-Type": "application/json"}
        if if_match is not None:
            headers["If-Match"] = if_match
        elif if_absent:
            headers["If-None-Match"] = "*"
        self._attempts(f"PUT {_shown(url)}", lambda: self._put(url, data, len(data), headers))

    def delete(self, rel: str) -> None:
        """``DELETE`` ``rel`` (already gone is fine); :class:`TransferError` if refused."""
        url = self.url(rel)

        def once():
            resp = self._open("DELETE", url)
            try:
                if resp.status in (200, 202, 204, 404):
                    resp.read(4096)
                    return
                if resp.status in (405, 501):
                    resp.read(4096)
                    raise TransferError(
                        self._message(
                            f"DELETE {_shown(url)}: HTTP {resp.status} {resp.reason}: the server "
                            "does not delete files"
                        )
                    )
                self._fail("DELETE", url, resp)
            finally:
                resp.close()

        self._attempts(f"DELETE {_shown(url)}", once)

    def _put(self, url: str, body, size: int, headers: dict[str, str]) -> None:
        resp = self._open("PUT", url, headers={**headers, "Content-Length": str(size)}, body=body)
        try:
            if resp.status not in (200, 201, 204):
                self._fail("PUT", url, resp)
            resp.read()
        finally:
            resp.close()


class _Counted:
    """A file object that reports each block ``http.client`` reads from it."""

    def __init__(self, f, progress: Progress | None):
        self._f = f
        self._progress = progress

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if data and self._progress is not None:
            self._progress(len(data))
        return data
