"""One writer per file: an OS lock on a hidden sidecar, held for the writer's lifetime.

A store's writer takes an exclusive ``flock`` on ``.NAME.lock`` next to the file and keeps
it until it closes. The kernel drops the lock when the process dies however it dies, so a
lock that is held belongs to a live process, and a killed writer's file can be resumed at
once: no stale-lock timeouts, no guessing from pids. The sidecar holds the holder's pid,
host and start time, so a refused writer can say who holds the file.

The sidecar is removed when its writer closes. It is unlinked while the lock is still held,
and an acquirer checks after locking that the file it locked is still the one at the path
(the same inode), so an unlink racing an acquire cannot give two holders.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from torchstore.errors import DestinationError, StoreLockedError

__all__ = ["lock_path", "live_writer", "locked_message", "describe_holder", "WriterLock"]

#: How long an acquire retries a lock that is busy. A lock held by a writer stays busy for
#: the writer's lifetime; this only rides out :func:`live_writer` probes, which hold a
#: shared lock for microseconds.
_PROBE_GRACE_S = 0.05


def lock_path(path: str | os.PathLike, kind: str = "lock") -> Path:
    """The writer-lock sidecar of ``path``: same folder, hidden, ``.NAME.lock``.

    ``kind`` names other locks of the same path (``"importing.lock"``: the lock of the
    hidden file an import builds before renaming it onto ``path``), so they never meet the
    writer lock of ``path`` itself. Symbolic links are resolved first, so two names of one
    file share one lock.
    """
    real = Path(os.path.realpath(os.fspath(path)))
    return real.with_name(f".{real.name}.{kind}")


def _read_holder(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace")
        info = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    try:
        return {
            "pid": int(info.get("pid", 0)),
            "host": str(info.get("host", "")),
            "since": float(info.get("since", 0.0)),
            "what": str(info.get("what", "store")),
        }
    except (TypeError, ValueError):
        return None


def _holder_or_unknown(fd: int) -> dict:
    # The holder writes its details right after it locks; a probe can land in between.
    for _ in range(20):
        info = _read_holder(fd)
        if info is not None:
            return info
        time.sleep(0.005)
    return {"pid": 0, "host": "", "since": 0.0, "what": "store"}


def live_writer(path: str | os.PathLike) -> dict | None:
    """``{"pid", "host", "since", "what"}`` of the live process holding ``path``'s writer lock.

    ``None`` when no live process holds it: never written by a locking writer, closed, or
    its writer died (the details a killed writer left in the sidecar are ignored). Never
    blocks and never creates a file, so it works on read-only folders.
    """
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_or_unknown(fd)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def describe_holder(info: dict) -> str:
    """``process PID on host HOST (since TIME)`` for a holder :func:`live_writer` returned."""
    if not info.get("pid"):
        return "another process"
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"])) if info["since"] else "?"
    )
    host = info["host"] or "?"
    return f"process {info['pid']} on host {host} (since {when})"


def locked_message(path: str | os.PathLike, info: dict, what: str = "store") -> str:
    """The one-line explanation of a refused writer."""
    return (
        f"{what} {path} is being written by {describe_holder(info)}; one writer per {what}: wait "
        f"for that writer to finish or stop it (a killed writer's {what} can be resumed)"
    )


#: Locks held by this process. A forked child closes its inherited copies at once: an
#: ``flock`` belongs to the open file, so a child (a data-loader worker, say) that outlived
#: a killed writer would otherwise keep its store locked.
_HELD: weakref.WeakSet[WriterLock] = weakref.WeakSet()


def _drop_inherited_locks() -> None:
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


class WriterLock:
    """The exclusive writer lock of one file, held until :meth:`release` (or process death).

    The lock belongs to the process that took it: a forked child does not inherit it.

    Examples:
        >>> with WriterLock.acquire("demo.h5"):
        ...     pass  # write demo.h5; a second writer is refused meanwhile
    """

    def __init__(self, path: Path, sidecar: Path, fd: int):
        self.path = path
        self.sidecar = sidecar
        self._fd: int | None = fd
        self._pid = os.getpid()

    @classmethod
    def acquire(
        cls,
        path: str | os.PathLike,
        *,
        what: str = "store",
        kind: str = "lock",
        refused: Callable[[dict], str] | None = None,
    ) -> WriterLock:
        """Take the writer lock of ``path`` without waiting.

        Args:
            path: the file (or folder) the lock guards.
            what: what ``path`` is, in the messages.
            kind: which lock of ``path`` (see :func:`lock_path`).
            refused: the message of a refusal, from the holder's details (default:
                :func:`locked_message`).

        Raises:
            StoreLockedError: a live process holds it (the message names the path and holder).
            DestinationError: the folder cannot hold the sidecar (read-only, missing), or
                its filesystem has no file locks.
        """
        path = Path(path)
        sidecar = lock_path(path, kind)
        while True:
            try:
                fd = os.open(sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise DestinationError(
                    f"cannot take the writer lock of {what} {path}: {sidecar} cannot be created "
                    f"({exc.strerror}); a {what} is written only in a folder its writer can write"
                ) from None
            try:
                deadline = time.monotonic() + _PROBE_GRACE_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            info = _holder_or_unknown(fd)
                            message = refused(info) if refused else locked_message(path, info, what)
                            raise StoreLockedError(message) from None
                        time.sleep(0.002)
                    except OSError as exc:
                        raise DestinationError(
                            f"cannot take the writer lock of {what} {path}: the filesystem does "
                            f"not support file locks (flock: {exc.strerror}); one writer per "
                            f"{what} is enforced with them, so write it on a filesystem that has "
                            "them"
                        ) from None
                # The previous holder may have unlinked the sidecar between our open and our
                # lock: then we hold a lock on a dead inode, so start over on the path.
                try:
                    now = os.stat(sidecar)
                except FileNotFoundError:
                    now = None
                mine = os.fstat(fd)
                if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                    os.close(fd)
                    continue
                info = {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.time(),
                    "what": what,
                }
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode(), 0)
                lock = cls(path, sidecar, fd)
                _HELD.add(lock)
                return lock
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the sidecar and drop the lock (idempotent; nothing in a forked child)."""
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is None:
            return
        try:
            if os.getpid() == self._pid:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.sidecar)
        finally:
            os.close(fd)

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        return f"WriterLock({str(self.path)!r}, held={self.held})"
