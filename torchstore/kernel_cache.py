"""Where the compiled CPU kernels (numba) are kept between processes.

Every kernel is compiled with ``cache=True``: the first process compiles it (seconds for
the sampling kernels), every later one loads the machine code from disk (milliseconds).
numba keeps it in ``NUMBA_CACHE_DIR`` when that is set, else in the ``__pycache__`` beside
the module, else in the user's cache folder (``~/.cache/numba``). When none of them is
writable (a read-only install run by a user without a writable home: a container as
``nobody``, say) numba refuses to define the function at all ("cannot cache function
...: no locator available"), and importing the module would fail. :func:`cached_njit`
then keeps the kernels in a private folder of the temporary directory instead, and where
even that cannot be had compiles them in each process, uncached but working.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

import numba

__all__ = ["cached_njit", "fallback_cache_dir"]


def fallback_cache_dir() -> str | None:
    """A folder of the temporary directory only this user can write (created if missing),
    for numba's cache; None when there is none to be had.

    The cache holds pickled code that numba loads: a folder another user could write to
    (made there first, or a link to one) would let them run code in this process, so such
    a folder is refused, not used.
    """
    uid = os.getuid() if hasattr(os, "getuid") else None
    name = f"torchstore-numba-{uid if uid is not None else 'user'}"
    path = os.path.join(tempfile.gettempdir(), name)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    if uid is not None and st.st_uid != uid:
        return None
    return path


def _no_cache_location(exc: RuntimeError) -> bool:
    return "no locator available" in str(exc)


def cached_njit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(cache=True, **options)`` that never fails for want of a cache folder
    (see the module docstring)."""

    def decorate(fn: Callable) -> Any:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError as exc:
            if not _no_cache_location(exc):
                raise
        folder = fallback_cache_dir()
        if folder is not None:
            # numba reads its setting when each function is defined: every kernel defined
            # from here on, in any module, is kept there
            numba.config.CACHE_DIR = folder
            try:
                return numba.njit(cache=True, **options)(fn)
            except RuntimeError as exc:
                if not _no_cache_location(exc):
                    raise
        return numba.njit(**options)(fn)

    return decorate
