"""The folder torchstore keeps its caches under, one rule for all of them.

``$TORCHSTORE_CACHE`` when set, else ``$XDG_CACHE_HOME/torchstore``, else
``~/.cache/torchstore``. Pulled datasets and entries (``torchstore.remote``) live at its
top; each other cache takes a folder of its own inside it (normalisation statistics in
``stats/``), so one variable moves every cache, and deleting the folder frees them all.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$TORCHSTORE_CACHE``, else ``$XDG_CACHE_HOME/torchstore``, else ``~/.cache/torchstore``."""
    if os.environ.get("TORCHSTORE_CACHE"):
        return Path(os.environ["TORCHSTORE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchstore"
