"""Boolean switches read from the environment (``TORCHSTORE_OFFLINE=1``, ``HF_HUB_OFFLINE=on``)."""

from __future__ import annotations

import os

__all__ = ["env_flag"]

_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """True if the environment variable is set to 1/true/yes/on (any case)."""
    return os.environ.get(name, "").strip().lower() in _TRUE
