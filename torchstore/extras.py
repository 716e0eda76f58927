"""The optional extras of this project, and the one way a message tells a user to install one.

The ``torchstore`` on PyPI is an unrelated project: an extra asked of it by name installs
someone else's package. An extra is installed from a checkout of this repository,
``pip install -e ".[video]"``; every message that names an extra is built by
:func:`install_hint`, so they all say it the same way (the docs use the same form, and
``tests/test_install_hints.py`` holds both to it).

Examples:
    >>> install_hint("video")
    'pip install -e ".[video]" in a checkout of the torchstore repository'
    >>> install_hint("video", "lerobot").split(" in a checkout")[0]
    'pip install -e ".[video]" (or ".[lerobot]", which has it)'
"""

from __future__ import annotations

__all__ = ["EXTRAS", "install_hint"]

#: every extra ``setup.cfg`` declares (the test above checks they agree)
EXTRAS = (
    "bench",
    "dev",
    "docs",
    "formats",
    "gcs",
    "hub",
    "interop",
    "lerobot",
    "ray",
    "s3",
    "train",
    "video",
)


def install_hint(extra: str, *also: str) -> str:
    """``pip install -e ".[extra]"``, said as installed from this repository.

    Args:
        extra: the smallest extra that provides what is missing.
        also: larger extras that provide it too (named so a hint agrees with the docs of
            the feature that needs it, e.g. ``"lerobot"`` for PyAV).

    Raises:
        ValueError: an extra this project does not declare.
    """
    unknown = [name for name in (extra, *also) if name not in EXTRAS]
    if unknown:
        raise ValueError(f"no extra {unknown[0]!r}; the extras are {list(EXTRAS)}")
    others = "".join(f' (or ".[{name}]", which has it)' for name in also)
    return f'pip install -e ".[{extra}]"{others} in a checkout of the torchstore repository'
