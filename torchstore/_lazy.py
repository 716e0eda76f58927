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
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports", "alias_moved_modules"]


def lazy_exports(
    package: str, exports: Mapping[str, str], moved: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` that import ``exports[name]`` on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module defining it (absolute, or relative to
            ``package`` when it starts with a dot).
        moved: names that used to be public here -> the module that defines them now; a
            read still gives the object, with a ``DeprecationWarning`` naming its new place.

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level. A name, once
        imported, is stored on the package, so later reads are plain attribute reads.
        A submodule (``torchstore.data.store.store``) is imported on first attribute access
        too, as it was when the package imported everything eagerly.
    """

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None and moved and name in moved:
            warnings.warn(
                f"{package}.{name} moved to {moved[name]}.{name}; import it from there",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        if module_name is None:
            # ``torchstore.data.store.store`` after a bare ``import torchstore``: eager package
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


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old dotted name as the module at its new place (the same object)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = self.moved[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # the module at the new place is already run
        pass


def alias_moved_modules(moved: Mapping[str, str]) -> None:
    """Keep old import paths of moved modules working: ``import old`` gives the module now at
    ``moved[old]`` (one object, so its classes are the same classes) with a
    ``DeprecationWarning`` naming the new place. Installed once, by ``torchstore/__init__``."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(moved))
