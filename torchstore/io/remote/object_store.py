"""Verified byte ranges of one object in S3 (``s3://BUCKET/KEY``) or Google Cloud Storage
(``gs://BUCKET/KEY``), through the providers' own clients, boto3 and google-cloud-storage.

:func:`locate_object` reads the object's size and version once and returns a
:class:`~torchstore.io.remote.range_requests.RangeFetcher`, so
:class:`~torchstore.io.remote.ranged.RangedFile` reads a store there in place as it reads
one over HTTP, under the same rules:

- **One version.** S3: opening is one ``GetObject`` of byte 0 (the size from its
  ``Content-Range``, and its ETag); every later range is asked with ``If-Match: <ETag>``
  and its answer must carry that ETag and that size, so bytes of two versions are never
  mixed: a replaced object answers 412 and raises :class:`RemoteChangedError`. GCS: opening
  reads the size and generation, and every range is read at that generation; one that no
  longer exists (the object was replaced or deleted) raises :class:`RemoteChangedError`.
- **Every answer is checked.** The ``Content-Range`` must be exactly the range asked and the
  body exactly its length, within ``timeout`` plus the time it takes at 64 KiB/s (GCS: each
  wait for the server within ``timeout``). A short body, a dropped or refused connection, a
  stall, a 5xx or a throttle (``SlowDown``, 429) is retried with backoff ``retries`` more
  times (the clients' own retries are off, so this is the one bound), then raises one
  :class:`TransferError` naming the URL, the byte range and what was wrong. A missing object
  or bucket, or refused credentials, is one line at once.
- **Credentials** come from each client's standard sources, never from the URL: S3 from
  botocore's chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and ``~/.aws``, SSO, container and instance roles; with none at all,
  requests go unsigned, which a public bucket answers), the region from ``AWS_REGION``, and
  an S3-compatible server (MinIO, moto) from ``AWS_ENDPOINT_URL`` or ``endpoint_url=``; GCS
  from ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application default credentials or the
  metadata server (anonymous without any), an emulator from ``STORAGE_EMULATOR_HOST``. No
  key, secret or token appears in a message, a log line or a ``repr``.
- **Threads and processes.** A request runs in the thread that asked for it; one client a
  process (clients are thread-safe and keep connections), made anew in a forked child.

Why these clients. Measured against moto's server (its own process, loopback, one 16 MiB
object) on 2 cores that other work kept busy, so the wall times spread over four runs each;
the CPU time (of the client's process alone) held steady::

    client   open, cold     open, warm      16 KiB range, p50  8 x 1 MiB, 8 threads  forked
             (CPU)          (CPU)           (CPU a request)    (CPU a request)       child
    boto3    0.16-1.4 s     24-58 ms        12-32 ms           42-101 MiB/s          reads
             (0.15 s)       (3.8-4.1 ms)    (3.6-3.8 ms)       (4.3-4.4 ms)
    s3fs     0.75-2.6 s     17-44 ms        15-40 ms           38-78 MiB/s           reads
             (0.55-0.58 s)  (4.4-5.1 ms)    (3.8-4.5 ms)       (4.5-5.7 ms)
    obstore  0.03-0.08 s    7-18 ms         7-16 ms            65-113 MiB/s          hangs
             (0.01-0.02 s)  (0.6-0.7 ms)    (0.6-0.7 ms)       (1.7-2.0 ms)

(open: size and ETag; "cold" makes the client first.) obstore is the fastest and cheapest,
but its Rust runtime does not survive ``fork``: a forked child that makes a new store and
reads hangs for good once the parent has read through obstore, and the parent always has
(it opened the store), while ``DataLoader`` workers fork by default on Linux. s3fs works
there, but runs every request on its event-loop thread while the reading thread waits inside
h5py holding h5py's global lock; a garbage collection on the loop thread that frees an h5py
object (any store left in a reference cycle) then waits for that lock, and neither moves: a
deadlock. (It showed as 30 s stalls while moto's server ran in the tests' own process: its
threads' collections waited for the lock until the client timed out; a loop thread has no
such timeout.)
boto3 (botocore, which s3fs wraps) runs the request in the reading thread itself, works in a
forked child with a client of its own, and makes its first client 4x cheaper than s3fs; it
costs about 4 ms of CPU a request (4 % of a core at 10 requests a second), six times
obstore's. google-cloud-storage is GCS's client of the same kind (synchronous, in the
calling thread).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torchstore.errors import RemoteChangedError
from torchstore.extras import install_hint
from torchstore.io.remote.http import _CONTENT_RANGE, _Retry, _shown
from torchstore.io.remote.range_requests import RemoteObject
from torchstore.io.remote.transfer import RemoteNotFoundError, TransferError, redact
from torchstore.validation import non_negative_int, positive_number

__all__ = [
    "ObjectURL",
    "ObjectRangeFetcher",
    "parse_object_url",
    "locate_object",
    "require_boto3",
    "require_google_cloud_storage",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The slowest transfer rate a request is allowed beyond ``timeout`` (as over HTTP).
_MIN_RATE = 64 * 1024
#: Environment variables that hold a secret (redacted from every message as well).
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
#: S3 error codes that mean "the credentials were refused", and those that mean "retry".
_REFUSED = {
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}
_TRANSIENT = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling"}


def require_boto3():
    """The ``boto3`` module, or an ``ImportError`` that names the extra providing it."""
    try:
        import boto3
    except ImportError as exc:
        raise ImportError(f"s3:// stores need boto3: {install_hint('s3')}") from exc
    return boto3


def require_google_cloud_storage():
    """``google.cloud.storage``, or an ``ImportError`` that names the extra providing it."""
    try:
        storage = importlib.import_module("google.cloud.storage")
    except ImportError as exc:
        raise ImportError(f"gs:// stores need google-cloud-storage: {install_hint('gcs')}") from exc
    return storage


@dataclass(frozen=True, slots=True)
class ObjectURL:
    """``s3://BUCKET/KEY`` or ``gs://BUCKET/KEY``, split.

    Examples:
        >>> parse_object_url("s3://robot-data/pusht/runs.h5")
        ObjectURL(scheme='s3', bucket='robot-data', key='pusht/runs.h5')
    """

    scheme: str
    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


def parse_object_url(url: str) -> ObjectURL:
    """Split an object URL; credentials in it (``s3://KEY:SECRET@...``) are refused unread."""
    scheme, sep, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme not in ("s3", "gs") or not sep or not bucket or not key or key.endswith("/"):
        raise ValueError(
            f"object URL ({_shown(url)!r}) must be s3://BUCKET/KEY or gs://BUCKET/KEY, "
            "naming one object"
        )
    if "@" in bucket or ":" in bucket:
        raise ValueError(
            f"object URL ({scheme}://{bucket.rpartition('@')[2]}/...) must not hold "
            "credentials or a port; they come from the environment (AWS_*, "
            "GOOGLE_APPLICATION_CREDENTIALS) and the endpoint from AWS_ENDPOINT_URL"
        )
    return ObjectURL(scheme, bucket, key)


# ----------------------------------------------------------------- the clients
_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _forget_clients_in_child() -> None:
    """A forked child starts with no clients and a lock no thread of its parent holds."""
    global _CLIENTS_LOCK
    _CLIENTS_LOCK = threading.Lock()
    _CLIENTS.clear()


os.register_at_fork(after_in_child=_forget_clients_in_child)
#: What a client is made from, beside its arguments: a change of any makes a new one.
_S3_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_GCS_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST")


def _client(scheme: str, make: Callable[[], Any], *args: Any) -> Any:
    """One client a process for each set of arguments and environment: clients are
    thread-safe and keep their connections, and a forked child makes its own (its parent's
    sockets are not its to use)."""
    env = _S3_ENV if scheme == "s3" else _GCS_ENV
    seen = hashlib.sha256(repr([os.environ.get(v) for v in env]).encode()).hexdigest()
    key = (scheme, os.getpid(), seen, *args)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = make()
        return _CLIENTS[key]


class _S3Calls:
    """What a fetcher asks of S3, through boto3's client, in the calling thread."""

    def __init__(self, where: ObjectURL, timeout: float, endpoint_url: str | None):
        self.where = where
        self.timeout = timeout
        self.endpoint_url = endpoint_url

    def client(self):
        require_boto3()  # (imported already: a dict look-up)
        return _client("s3", self._make, self.endpoint_url, self.timeout)

    def _make(self):
        boto3 = require_boto3()
        from botocore import UNSIGNED
        from botocore.config import Config

        session = boto3.session.Session()
        # no credentials anywhere: requests go unsigned (a public bucket answers them)
        unsigned = session.get_credentials() is None
        config = Config(
            retries={"total_max_attempts": 1},  # the fetcher's loop retries, one bound
            connect_timeout=self.timeout,
            read_timeout=self.timeout,
            max_pool_connections=16,
            **({"signature_version": UNSIGNED} if unsigned else {}),
        )
        client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        client.torchstore_unsigned = unsigned
        return client

    def _get(self, deadline: float, count: Callable[[int], None], **kwargs) -> tuple[dict, bytes]:
        where = self.where
        resp = self.client().get_object(Bucket=where.bucket, Key=where.key, **kwargs)
        body, parts = resp["Body"], []
        try:
            for chunk in body.iter_chunks(1 << 20):
                parts.append(chunk)
                count(len(chunk))
                if time.monotonic() > deadline:
                    got = sum(map(len, parts))
                    raise _Retry(f"{got} bytes arrived before the time limit")
        finally:
            body.close()
        return resp, b"".join(parts)

    def open(self, deadline: float, count: Callable[[int], None]) -> tuple[int, str | None]:
        """``(size, etag)`` from one ``GetObject`` of byte 0."""
        resp, _ = self._get(deadline, count, Range="bytes=0-0")
        match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange") or "")
        if not match or match.group(3) == "*":
            raise _Retry(f"no usable Content-Range ({resp.get('ContentRange')!r}) in the answer")
        return int(match.group(3)), resp.get("ETag")

    def read(self, start: int, stop: int, obj: RemoteObject, deadline: float, count) -> bytes:
        conditional = {"IfMatch": obj.version} if obj.version else {}
        resp, body = self._get(deadline, count, Range=f"bytes={start}-{stop - 1}", **conditional)
        etag = resp.get("ETag")
        if obj.version and etag and etag != obj.version:
            raise RemoteChangedError(
                f"changed since it was opened (ETag {etag}, was {obj.version})"
            )
        header = resp.get("ContentRange") or ""
        match = _CONTENT_RANGE.fullmatch(header)
        if match and match.group(3) not in ("*", str(obj.size)):
            raise RemoteChangedError(
                f"changed since it was opened (now {match.group(3)} bytes, was {obj.size})"
            )
        if not match or (int(match.group(1)), int(match.group(2))) != (start, stop - 1):
            raise _Retry(f"answered the range {header or 'none'!r}")
        return body

    def classify(self, exc: BaseException, opening: bool) -> BaseException:
        """The error ``exc`` means: ``_Retry`` for a transient fault, else the one to raise
        (its text without the URL and range, which the fetcher adds)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        bucket = self.where.bucket
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return TransferError(f"AWS credentials are incomplete ({type(exc).__name__})")
        if isinstance(exc, BotoCoreError):  # a cut body, a dropped connection, a timeout
            return _Retry(_first_line(exc))
        if not isinstance(exc, ClientError):
            return exc
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        said = f"{code or status}: {error.get('Message') or 'no message'}"
        if code == "PreconditionFailed" or status == 412:
            return RemoteChangedError(f"changed since it was opened (a new ETag; {said})")
        if code == "InvalidRange" or status == 416:
            return RemoteChangedError(f"changed since it was opened (it is shorter now; {said})")
        if code == "NoSuchBucket":
            return RemoteNotFoundError(f"no bucket {bucket!r} ({said})")
        if code == "NoSuchKey" or status == 404:
            if opening:
                return RemoteNotFoundError(f"no such object in bucket {bucket!r} ({said})")
            return RemoteChangedError(f"deleted since it was opened ({said})")
        if code in _REFUSED or status in (401, 403):
            if getattr(self.client(), "torchstore_unsigned", False):
                return TransferError(
                    f"access refused ({said}); no AWS credentials were found, so the request "
                    "went unsigned: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                    "AWS_PROFILE"
                )
            return TransferError(
                f"access refused ({said}); the credentials botocore found (AWS_* variables, "
                f"AWS_PROFILE, ~/.aws) must allow s3:GetObject on bucket {bucket!r}"
            )
        if code in _TRANSIENT or status == 429 or status >= 500:
            return _Retry(said)
        return TransferError(said)


class _GcsCalls:
    """What a fetcher asks of Google Cloud Storage, through google-cloud-storage's client, in
    the calling thread. Reads the object at the generation seen at open; not run against a
    server in this project's tests (no GCS emulator installs from PyPI)."""

    def __init__(self, where: ObjectURL, timeout: float, endpoint_url: str | None):
        self.where = where
        self.timeout = timeout
        self.endpoint_url = endpoint_url

    def client(self):
        require_google_cloud_storage()
        return _client("gs", self._make, self.endpoint_url)

    def _make(self):
        storage = require_google_cloud_storage()
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError

        options = {"api_endpoint": self.endpoint_url} if self.endpoint_url else None
        try:
            return storage.Client(client_options=options)
        except DefaultCredentialsError as exc:
            if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
                raise TransferError(
                    "the credentials GOOGLE_APPLICATION_CREDENTIALS names cannot be used "
                    f"({_first_line(exc)})"
                ) from None
            # none found anywhere: anonymous requests (a public bucket answers them)
            return storage.Client(
                project="<none>", credentials=AnonymousCredentials(), client_options=options
            )

    def open(self, deadline: float, count: Callable[[int], None]) -> tuple[int, str | None]:
        bucket = self.client().bucket(self.where.bucket)
        blob = bucket.get_blob(self.where.key, timeout=self.timeout, retry=None)
        if blob is None:
            if not bucket.exists(timeout=self.timeout, retry=None):
                raise RemoteNotFoundError(f"no bucket {self.where.bucket!r}")
            raise RemoteNotFoundError(f"no such object in bucket {self.where.bucket!r}")
        return int(blob.size), None if blob.generation is None else str(blob.generation)

    def read(self, start: int, stop: int, obj: RemoteObject, deadline: float, count) -> bytes:
        generation = None if obj.version is None else int(obj.version)
        bucket = self.client().bucket(self.where.bucket)
        blob = bucket.blob(self.where.key, generation=generation)
        body = blob.download_as_bytes(
            start=start,
            end=stop - 1,
            raw_download=True,
            checksum=None,
            timeout=(self.timeout, self.timeout),
            retry=None,
        )
        count(len(body))
        return body

    def classify(self, exc: BaseException, opening: bool) -> BaseException:
        from google.api_core import exceptions as api
        from google.auth.exceptions import GoogleAuthError, TransportError

        bucket = self.where.bucket
        said = _first_line(exc)
        if isinstance(exc, TransportError):  # the token's server unreachable: a network fault
            return _Retry(said)
        if isinstance(exc, api.NotFound):
            if opening:
                return RemoteNotFoundError(f"no such object or bucket ({said})")
            return RemoteChangedError(f"replaced or deleted since it was opened ({said})")
        if isinstance(exc, api.PreconditionFailed):
            return RemoteChangedError(f"changed since it was opened ({said})")
        if isinstance(exc, api.Unauthorized | api.Forbidden | GoogleAuthError):
            return TransferError(
                f"access refused ({said}); the credentials google-auth found "
                "(GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials) "
                f"must allow reading bucket {bucket!r}"
            )
        if isinstance(exc, api.TooManyRequests | api.ServerError):
            return _Retry(said)
        if isinstance(exc, api.GoogleAPICallError):
            return TransferError(said)
        return _transient(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _transient(exc: BaseException) -> BaseException:
    """A connection-level failure (refused, dropped, reset, timed out) as ``_Retry``;
    anything else is raised as it is."""
    import requests

    if isinstance(exc, requests.RequestException | OSError):
        return _Retry(_first_line(exc))
    return exc


# ----------------------------------------------------------------- the fetcher
class ObjectRangeFetcher:
    """Verified ranges of one object in S3 or GCS (a
    :class:`~torchstore.io.remote.range_requests.RangeFetcher`; see the module's rules).

    Made by :func:`locate_object`, which reads the object's size and version."""

    def __init__(self, where: ObjectURL, calls, *, timeout: float, retries: int):
        self.where = where
        self.timeout = float(timeout)
        self.retries = int(retries)
        #: body bytes received (every attempt), and requests sent
        self.bytes_fetched = 0
        self.requests = 0
        self._calls = calls
        self._lock = threading.Lock()
        self.obj = self._open()

    def __repr__(self) -> str:
        return f"ObjectRangeFetcher({self.where.url!r}, size={self.obj.size})"

    def _open(self) -> RemoteObject:
        url = self.where.url

        def once() -> RemoteObject:
            size, version = self._call(lambda d: self._calls.open(d, self._got), 1, True)
            return RemoteObject(url, url, size, version)

        return self._attempts(f"GET {url}", once)

    def fetch(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object, verified, retried within the bound."""
        obj = self.obj
        if not 0 <= start < stop <= obj.size:
            raise ValueError(
                f"byte range [{start}, {stop}) is outside {obj.shown} ({obj.size} bytes)"
            )
        n = stop - start

        def once() -> bytes:
            body = self._call(lambda d: self._calls.read(start, stop, obj, d, self._got), n, False)
            if len(body) != n:
                raise _Retry(f"the body held {len(body)} bytes, not {n}")
            return body

        return self._attempts(f"GET {obj.shown} bytes {start}-{stop - 1}", once)

    def close(self) -> None:
        """Nothing to let go of: the client is the process's, shared by its fetchers."""

    # ----------------------------------------------------------------- plumbing
    def _got(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_fetched += nbytes

    def _call(self, request: Callable[[float], T], nbytes: int, opening: bool) -> T:
        """One request, in this thread, given ``timeout`` plus the time its body takes at
        64 KiB/s; what the client raised as the error it means."""
        with self._lock:
            self.requests += 1
        try:
            return request(time.monotonic() + self.timeout + nbytes / _MIN_RATE)
        except (_Retry, TransferError):  # (RemoteChangedError, RemoteNotFoundError too)
            raise
        except Exception as exc:  # what the client raised: sorted into retry / refuse
            meant = self._calls.classify(exc, opening)
            if meant is exc:
                raise
            raise meant from exc

    def _attempts(self, what: str, fn: Callable[[], T]) -> T:
        """``fn`` until it succeeds, retrying ``_Retry`` with backoff, ``retries`` more
        times; any error raised carries ``what`` (the URL and range) and no secret."""
        last = ""
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except _Retry as exc:
                last = str(exc)
                log.debug(
                    "%s failed (attempt %d of %d): %s",
                    what,
                    attempt + 1,
                    self.retries + 1,
                    self._redact(last),
                )
                if attempt < self.retries:
                    time.sleep(min(0.05 * 2**attempt, 2.0))
            except (RemoteNotFoundError, RemoteChangedError, TransferError) as exc:
                cls = type(exc)
                raise cls(self._redact(f"{what}: {exc}")) from None
        raise TransferError(
            self._redact(f"{what}: {last} (gave up after {self.retries + 1} attempts)")
        )

    def _redact(self, text: str) -> str:
        return redact(text, [os.environ.get(name) for name in _SECRET_ENV])


def locate_object(
    url: str, *, timeout: float = 30.0, retries: int = 5, endpoint_url: str | None = None
) -> ObjectRangeFetcher:
    """A fetcher for the object at ``s3://BUCKET/KEY`` or ``gs://BUCKET/KEY``, its size and
    version read (one request).

    Args:
        url: the object.
        timeout: seconds to wait to connect or for more bytes; a whole request may take that
            plus its length at 64 KiB/s.
        retries: further attempts after a transient fault.
        endpoint_url: an S3-compatible server (MinIO, moto) or a GCS endpoint; by default
            the client's own setting (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``).
    """
    where = parse_object_url(url)
    positive_number("timeout", timeout, finite=False, hint=" (seconds)")
    non_negative_int("retries", retries)
    calls_class = _S3Calls if where.scheme == "s3" else _GcsCalls
    calls = calls_class(where, float(timeout), endpoint_url)
    # a missing package's install hint before anything else
    require_boto3() if where.scheme == "s3" else require_google_cloud_storage()
    return ObjectRangeFetcher(where, calls, timeout=timeout, retries=retries)
