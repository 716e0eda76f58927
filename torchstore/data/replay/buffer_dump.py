"""Replay buffer checkpoints a kill cannot leave mixed: ``dump_buffer`` / ``load_buffer``.

torchrl's ``rb.dumps(folder)`` writes ``folder/storage``, then ``sampler``, ``writer``,
``rng_state``, ``transform.t``, ``buffer_metadata.json`` and ``prefetch.pkl`` one after
another, in place. A process killed in between leaves the new storage beside the old
sampler and writer state: a checkpoint that loads without error and is wrong.

:func:`dump_buffer` runs the same ``rb.dumps`` into a hidden sibling folder
(``.NAME.dump-PID-TOKEN``), adds :data:`MANIFEST` (size and CRC-32 of every file, written
last), fsyncs every file and folder, and only then puts the folder in place: with one
``renameat2(RENAME_EXCHANGE)`` where the kernel and filesystem have it, else by moving the
old folder aside and the new one in, with a marker file (``.NAME.swap``) written first so
that the next dump or load finishes the move. A kill at any moment leaves the previous
checkpoint or the new one, whole. One dump at a time per folder is enforced with the
writer lock of :mod:`torchstore.io.hdf5.writer_lock` (``.NAME.lock``, released by the kernel when
its holder dies), so what a dump finds beside the folder while holding the lock was left by
a dead one, and is removed.

:func:`load_buffer` finishes or removes such leftovers, checks the manifest (a file changed
since the dump, an ``rb.dumps`` run in place over it for instance, is an ``IntegrityError``)
and runs ``rb.loads``. A folder written by a plain ``rb.dumps`` (no manifest) loads as torchrl
loads it. Any torchrl ``ReplayBuffer`` works, whatever its storage, sampler and writer.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import zlib
from pathlib import Path
from typing import Any

from torchstore.errors import (
    ArgumentTypeError,
    CheckpointNotFoundError,
    DestinationError,
    IntegrityError,
    StoreFormatError,
    StoreLockedError,
)
from torchstore.io.durable import fsync_folder
from torchstore.io.hdf5.writer_lock import WriterLock, live_writer, locked_message

__all__ = ["MANIFEST", "dump_buffer", "load_buffer"]

#: Written last into a checkpoint folder: the size and CRC-32 of every other file in it.
MANIFEST = "torchstore_checkpoint.json"
_FORMAT = "torchstore.buffer_checkpoint"
_VERSION = 1
#: What marks a folder as a torchrl replay-buffer checkpoint (``rb.dumps`` writes it).
_TORCHRL_MARK = "buffer_metadata.json"
_READ = 1 << 20
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
#: errnos meaning "no atomic exchange here" (old kernel or libc, or the filesystem lacks it)
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}
#: how many times a load restarts because a dump swapped the folder while it read
_LOAD_ATTEMPTS = 3


def _what(folder: Path) -> str:
    return f"replay buffer checkpoint {folder}"


def _check_buffer(rb: Any) -> None:
    for name in ("dumps", "loads"):
        if not callable(getattr(rb, name, None)):
            raise ArgumentTypeError(
                f"rb must be a torchrl ReplayBuffer (an object with dumps() and loads()), "
                f"got {type(rb).__name__}"
            )


# ----------------------------------------------------------------- names beside the folder
def _leftover_pattern(folder: Path) -> re.Pattern[str]:
    # exact shape only: never matches a folder of another name that shares a prefix
    return re.compile(rf"^\.{re.escape(folder.name)}\.(dump|aside)-\d+-[0-9a-f]{{16}}$")


def _sibling(folder: Path, kind: str) -> Path:
    return folder.with_name(f".{folder.name}.{kind}-{os.getpid()}-{secrets.token_hex(8)}")


def _marker(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}.swap")


def _leftovers(folder: Path) -> list[Path]:
    pattern = _leftover_pattern(folder)
    try:
        names = os.listdir(folder.parent)
    except FileNotFoundError:
        return []
    return [folder.parent / n for n in sorted(names) if pattern.match(n)]


# ----------------------------------------------------------------- durability
def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out.extend(Path(dirpath) / f for f in sorted(filenames))
    return out


def _digest(path: Path, *, sync: bool) -> tuple[int, int]:
    """``(size, crc32)`` of a file; with ``sync``, fsync it through the same descriptor."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_READ):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return size, crc


def _seal(folder: Path) -> None:
    """Write :data:`MANIFEST` and make the whole folder durable (files, then folders)."""
    files = {}
    for path in _files(folder):
        size, crc = _digest(path, sync=True)
        files[path.relative_to(folder).as_posix()] = {"size": size, "crc32": crc}
    manifest = {"format": _FORMAT, "version": _VERSION, "files": files}
    with open(folder / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    for dirpath, _, _ in sorted(os.walk(folder), key=lambda t: -len(t[0])):
        fsync_folder(Path(dirpath))


def _verify(folder: Path) -> None:
    """Raise ``IntegrityError`` unless every file matches :data:`MANIFEST` and none was added."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        listed = manifest["files"]
        if manifest.get("format") != _FORMAT or not isinstance(listed, dict):
            raise ValueError("not a checkpoint manifest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{_what(folder)}: {MANIFEST} is unreadable ({exc})") from None
    present = {p.relative_to(folder).as_posix() for p in _files(folder)} - {MANIFEST}
    hint = (
        "; it was changed after dump_buffer wrote it (an rb.dumps run in place over it "
        "mixes two checkpoints): load it with rb.loads(folder) only if that was on purpose"
    )
    if present != set(listed):
        added, missing = sorted(present - set(listed)), sorted(set(listed) - present)
        raise IntegrityError(f"{_what(folder)}: files added {added}, missing {missing}{hint}")
    for name, want in listed.items():
        size, crc = _digest(folder / name, sync=False)
        if size != want.get("size") or crc != want.get("crc32"):
            raise IntegrityError(
                f"{_what(folder)}: {name} holds {size} bytes with CRC-32 {crc:#010x}, the "
                f"manifest says {want.get('size')} bytes, {want.get('crc32', 0):#010x}{hint}"
            )


# ----------------------------------------------------------------- the swap
def _renameat2(src: Path, dst: Path, flags: int) -> int:
    """0, or the errno of ``renameat2``; ENOSYS when libc has no such function."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return errno.ENOSYS
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def _exchange(new: Path, folder: Path) -> bool:
    """Atomically swap two folders' names; False where the system cannot."""
    err = _renameat2(new, folder, _RENAME_EXCHANGE)
    if err in _NO_EXCHANGE:
        return False
    if err:
        raise OSError(err, f"renameat2(RENAME_EXCHANGE) {new} <-> {folder}: {os.strerror(err)}")
    return True


def _swap_in(new: Path, folder: Path) -> None:
    """Put the sealed folder ``new`` at ``folder``; the old one (if any) is removed after."""
    parent = folder.parent
    if not os.path.lexists(folder):
        os.rename(new, folder)
        fsync_folder(parent)
        return
    if _exchange(new, folder):
        fsync_folder(parent)
        shutil.rmtree(new)  # now the old checkpoint
        return
    aside = _sibling(folder, "aside")
    marker = _marker(folder)
    with open(marker, "w") as f:
        json.dump({"new": new.name, "aside": aside.name}, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_folder(parent)
    os.rename(folder, aside)
    os.rename(new, folder)
    fsync_folder(parent)
    os.unlink(marker)
    fsync_folder(parent)
    shutil.rmtree(aside)


def _recover(folder: Path) -> list[str]:
    """Finish a move a killed dump began, then remove what killed dumps left beside
    ``folder``. The caller holds the folder's writer lock. Returns the names removed."""
    marker = _marker(folder)
    if marker.exists():
        try:
            move = json.loads(marker.read_text())
            new, aside = folder.parent / move["new"], folder.parent / move["aside"]
        except (OSError, ValueError, KeyError, TypeError):
            new = aside = None  # torn: written before either rename, so nothing moved
        if new is not None and not os.path.lexists(folder):
            # killed between the two renames: the new checkpoint was sealed before the
            # marker was written, so it is complete; put it in place (else the old one)
            os.rename(new if new.is_dir() else aside, folder)
            fsync_folder(folder.parent)
        marker.unlink()
        fsync_folder(folder.parent)
    removed = []
    for path in _leftovers(folder):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def _is_checkpoint(folder: Path) -> bool:
    return (folder / _TORCHRL_MARK).is_file() or (folder / MANIFEST).is_file()


# ----------------------------------------------------------------- public
def dump_buffer(rb: Any, folder: str | os.PathLike) -> None:
    """Write ``rb.dumps`` output to ``folder`` so that a kill leaves the old or the new
    checkpoint there, never a mix of both.

    The checkpoint is written whole into a hidden sibling folder, sealed with
    :data:`MANIFEST`, fsynced, and swapped in; the previous checkpoint is removed after.
    Leftovers of an earlier killed dump are removed first.

    Args:
        rb: any torchrl ``ReplayBuffer`` (any storage, sampler and writer).
        folder: the checkpoint folder; created (with its parents) if missing.

    Raises:
        DestinationError: ``folder`` is a file, or a folder holding files that are not a
            replay buffer checkpoint (they are not replaced).
        StoreLockedError: another live process is dumping into ``folder``.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict(obs=torch.arange(4.0), batch_size=[4]))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     dump_buffer(rb, f"{tmp}/ckpt")
        ...     back = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
        ...     load_buffer(back, f"{tmp}/ckpt")
        ...     len(back)
        4
    """
    _check_buffer(rb)
    folder = Path(os.path.realpath(os.fspath(folder)))  # a link: replace what it names
    if os.path.lexists(folder) and not folder.is_dir():
        raise DestinationError(f"{folder} is a file; a replay buffer checkpoint is a folder")
    if folder.is_dir() and any(folder.iterdir()) and not _is_checkpoint(folder):
        raise DestinationError(
            f"{folder} holds files that are not a replay buffer checkpoint (no "
            f"{_TORCHRL_MARK}); dump_buffer replaces only a checkpoint: choose another folder"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    with WriterLock.acquire(folder, what="replay buffer checkpoint"):
        _recover(folder)
        new = _sibling(folder, "dump")
        try:
            rb.dumps(new)
            _seal(new)
            _swap_in(new, folder)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise


def _load_once(rb: Any, folder: Path, verify: bool) -> bool:
    """Load ``folder`` into ``rb``; False when a dump swapped it in meanwhile (load again)."""
    try:
        before = os.stat(folder)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no replay buffer checkpoint at {folder}") from None
    if not folder.is_dir() or not _is_checkpoint(folder):
        raise StoreFormatError(
            f"{folder} is not a replay buffer checkpoint (no {_TORCHRL_MARK} or {MANIFEST})"
        )
    try:
        if verify and (folder / MANIFEST).exists():
            _verify(folder)
        rb.loads(folder)
    except Exception:
        if _same_folder(folder, before):
            raise
        return False  # the folder was replaced under the load: that error is not the user's
    return _same_folder(folder, before)


def _same_folder(folder: Path, before: os.stat_result) -> bool:
    try:
        now = os.stat(folder)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino)


def load_buffer(rb: Any, folder: str | os.PathLike, *, verify: bool = True) -> None:
    """Load a checkpoint written by :func:`dump_buffer` (or by ``rb.dumps``) into ``rb``.

    What a killed dump left beside ``folder`` is finished or removed first, so the folder
    holds the last checkpoint that was swapped in, whole. With ``verify`` (the default),
    every file is checked against :data:`MANIFEST` before anything is loaded. A dump by
    another process that swaps the folder in while this loads makes the load start again.

    Args:
        rb: a torchrl ``ReplayBuffer`` built with the same kind of components as the one
            dumped (torchrl's ``loads`` rule).
        folder: the checkpoint folder.
        verify: check sizes and CRC-32s first (reads every file once more).

    Raises:
        CheckpointNotFoundError: no checkpoint at ``folder`` (nor a complete one to recover).
        StoreFormatError: ``folder`` is not a replay buffer checkpoint.
        IntegrityError: a file differs from what the dump wrote.
        StoreLockedError: a dump by another live process is moving the folder right now.
    """
    _check_buffer(rb)
    folder = Path(os.path.realpath(os.fspath(folder)))
    if _marker(folder).exists() or _leftovers(folder):
        if live_writer(folder) is None:
            with (
                # busy, or a read-only folder: load what is in place (it is whole)
                contextlib.suppress(StoreLockedError, DestinationError),
                WriterLock.acquire(folder, what="replay buffer checkpoint"),
            ):
                _recover(folder)
        elif not os.path.lexists(folder):
            info = live_writer(folder) or {}
            raise StoreLockedError(locked_message(folder, info, "replay buffer checkpoint"))
    for _ in range(_LOAD_ATTEMPTS):
        if _load_once(rb, folder, verify):
            return
    raise StoreLockedError(
        f"{_what(folder)} was replaced {_LOAD_ATTEMPTS} times while it loaded; another "
        "process dumps into it continuously"
    )
