"""One rule for every output path: never a source, never a file that is not ours to replace.

Every function or command that writes a store or a file at a destination calls
:func:`check_destination` before it writes anything, so a bad destination fails with one
line and leaves the disk as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import h5py

from torchstore.errors import DestinationError, DestinationExistsError, StoreLockedError
from torchstore.io.hdf5.files import MANIFEST_ATTR, open_for_read
from torchstore.io.hdf5.writer_lock import WriterLock, describe_holder, live_writer, locked_message

__all__ = ["check_destination", "is_store_file", "written_beside"]

_WHATS = ("store", "file", "folder")


def is_store_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file whose root carries a torchstore manifest."""
    path = Path(path)
    try:
        if not path.is_file() or not h5py.is_hdf5(path):
            return False
        f = open_for_read(path)  # shares the handle of readers in this process
        try:
            return MANIFEST_ATTR in f.attrs
        finally:
            f.close()
    except Exception:  # noqa: BLE001 - unreadable means "cannot be shown to be ours"
        return False


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(child: Path, folder: Path) -> bool:
    try:
        child_real = Path(os.path.realpath(child))
        folder_real = Path(os.path.realpath(folder))
    except OSError:
        return False
    return child_real != folder_real and folder_real in child_real.parents


def check_destination(
    dest: str | os.PathLike,
    *,
    sources: Iterable[str | os.PathLike] = (),
    overwrite: bool = False,
    what: str = "store",
) -> Path:
    """Check that ``dest`` may be written, create its missing parent folders, return it.

    Args:
        dest: the output path.
        sources: the inputs of the same operation; ``dest`` may be none of them (compared
            as files, by inode, not by name) and may not lie inside a source folder.
        overwrite: whether an existing ``dest`` may be replaced.
        what: ``"store"`` (an existing ``dest`` is replaced only if it is a torchstore
            store no live writer holds), ``"file"`` (any existing file may be replaced) or
            ``"folder"`` (``dest`` is a directory; with ``overwrite`` an existing one is
            replaced).

    Raises:
        DestinationError: ``dest`` is a source or inside one, a directory where a file is
            expected (or a file where a folder is), not a torchstore store, or its parent
            folder cannot be created or written. Also a ``ValueError``.
        DestinationExistsError: ``dest`` exists and ``overwrite`` is false. Also a
            ``FileExistsError``.
        StoreLockedError: a live process is writing the store at ``dest``.
    """
    if what not in _WHATS:
        raise ValueError(f"what ({what!r}) must be one of {_WHATS}")
    dest = Path(dest)
    for source in sources:
        _check_not_a_source(dest, Path(source), what)
    if dest.exists() and what == "folder":
        _check_existing_folder(dest, overwrite)
    elif dest.exists():
        _check_existing_file(dest, overwrite, what)
    _check_parent(dest)
    return dest


def _check_not_a_source(dest: Path, source: Path, what: str) -> None:
    if dest.exists() and _same(dest, source):
        raise DestinationError(f"the output {dest} is the input {source}; write to another path")
    if source.is_dir() and _inside(dest, source):
        raise DestinationError(
            f"the output {dest} lies inside the input folder {source}; write outside it"
        )
    if what == "folder" and source.exists() and (_inside(source, dest) or _same(dest, source)):
        raise DestinationError(
            f"the output folder {dest} holds the input {source}; write to another folder"
        )


def _check_existing_folder(dest: Path, overwrite: bool) -> None:
    if not dest.is_dir():
        raise DestinationError(f"{dest} is a file; the output must be a folder")
    if not overwrite and any(dest.iterdir()):
        raise DestinationExistsError(
            f"{dest} already exists and is not empty; choose another path or overwrite it "
            "explicitly"
        )


def _check_existing_file(dest: Path, overwrite: bool, what: str) -> None:
    if dest.is_dir():
        raise DestinationError(f"{dest} is a directory; the output must be a file path")
    if not overwrite:
        raise DestinationExistsError(
            f"{dest} already exists; choose another path or overwrite it explicitly"
        )
    holder = live_writer(dest)
    if holder is not None:
        raise StoreLockedError(locked_message(dest, holder, "store"))
    if what == "store" and not is_store_file(dest):
        raise DestinationError(
            f"{dest} exists and is not a torchstore store; it is not replaced even when "
            "overwriting (delete it yourself, or choose another path)"
        )


def _check_parent(dest: Path) -> None:
    """Create ``dest``'s parent folder if missing; it must be a writable folder."""
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DestinationError(
            f"cannot create the folder {parent} for {dest}: {exc.strerror or exc}"
        ) from None
    if not parent.is_dir():
        raise DestinationError(f"{parent} is not a folder, so {dest} cannot be written")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(f"the folder {parent} is not writable, so {dest} cannot be written")


#: what a command that writes beside a destination is called, by the tag of its partial file
_COMMANDS = {"importing": "import", "exporting": "export"}


def _claim_partial(dest: Path, tag: str) -> WriterLock:
    """The lock of ``dest``'s partial file ``.NAME.TAG``: one command builds it at a time.

    Its own sidecar (``.NAME.TAG.lock``), neither ``dest``'s writer lock (readers of a
    store being replaced must not wait for it) nor the lock of the store written into the
    partial file (that writer takes it itself).
    """
    command = _COMMANDS.get(tag, "command")
    return WriterLock.acquire(
        dest,
        what=command,
        kind=f"{tag}.lock",
        refused=lambda holder: (
            f"another {command} is writing {dest}: {describe_holder(holder)}; wait for it to "
            "finish or stop it, or write to another path"
        ),
    )


@contextlib.contextmanager
def written_beside(dest: Path, tag: str) -> Iterator[Path]:
    """The hidden path ``.NAME.TAG`` beside ``dest`` to write a whole output to.

    When the block ends normally the output is renamed onto ``dest``; when it raises
    (Ctrl-C and SIGTERM included: the command line delivers both as ``KeyboardInterrupt``)
    it is removed, so ``dest`` never holds half an output. The partial file is locked
    first: a second command writing the same ``dest`` is refused with a
    :class:`~torchstore.errors.StoreLockedError` and touches nothing of the first's. A
    leftover of a killed writer at the same path (no live holder) is removed.
    """
    partial = dest.with_name(f".{dest.name}.{tag}")
    claim = _claim_partial(dest, tag)
    try:
        partial.unlink(missing_ok=True)
        try:
            yield partial
            os.replace(partial, dest)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    finally:
        claim.release()
