"""Lazy package attributes (PEP 562): a public name is imported the first time it is used.

``import torchstore`` used to import torch, tensordict (which imports ``torch._dynamo``)
and torchrl, about 3 s before the first line of user code ran; ``torchstore --help`` paid
the same. Each package ``__init__`` now names where its public names live and imports
the module only when one of them is read, so ``from torchstore import TrajectoryStore``
and ``torchstore.TrajectoryStore`` work as before and cost only what they use.

Examples:
    >>> __getattr__, __dir__ = lazy_exports(__name__, {"Path": "pathlib"})  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` that import ``exports[name]`` on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module defining it (absolute, or relative to
            ``package`` when it starts with a dot).

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level. A name, once
        imported, is stored on the package, so later reads are plain attribute reads.
        A submodule (``torchstore.data.store``) is imported on first attribute access
        too, as it was when the package imported everything eagerly.
    """

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            # ``torchstore.data.store`` after a bare ``import torchstore``: eager package
            # imports used to load every submodule, so keep submodules reachable too.
            if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            if name in getattr(sys.modules[package], "__all__", ()):
                raise AttributeError(
                    f"{package}.__all__ lists {name!r} but its _EXPORTS does not say which "
                    "module defines it; add it there"
                )
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
