"""Every error class lives in torchstore.errors; the modules that raise them still export them."""

from __future__ import annotations

import importlib
import pathlib
import pickle
import re

import pytest

import torchstore
import torchstore.errors as errors
from torchstore.errors import NoSuchEntryError, TorchstoreError

OLD_HOMES = {
    "torchstore.io.remote.transfer": [
        "TransferError",
        "RemoteNotFoundError",
        "NoSuchLocationError",
        "NoSuchEntryError",
        "DeadlineError",
    ],
    "torchstore.io.remote.http": ["RemoteChangedError"],
    "torchstore.remote.upload": ["IncompleteFileError", "UnknownEntryError"],
    "torchstore.remote.backend": ["EntryExistsError", "EntryKindError"],
    "torchstore.remote.location": ["OfflineError"],
    "torchstore.remote.weights": ["DeviceError"],
    "torchstore.remote.cache": ["CacheNotWritableError"],
    "torchstore.distributed.ray_replay": ["RayUnavailableError"],
    "torchstore.project.bundle": ["ProjectError"],
    "torchstore.datasets": ["AmbiguousDatasetError"],
}


@pytest.mark.parametrize("module_name", sorted(OLD_HOMES))
def test_old_import_paths_give_the_same_classes(module_name):
    module = importlib.import_module(module_name)
    for name in OLD_HOMES[module_name]:
        assert getattr(module, name) is getattr(errors, name)


def test_every_error_is_a_torchstore_error_and_a_builtin():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls.__module__ == "torchstore.errors", name
        assert issubclass(cls, TorchstoreError)
        if cls is not TorchstoreError:
            builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and b is not object]
            assert builtin != [Exception, BaseException], f"{name} inherits no specific builtin"


def test_no_public_error_class_is_defined_outside_errors_py():
    root = pathlib.Path(torchstore.__path__[0])
    pattern = re.compile(r"^class [A-Za-z]\w*\(.*(Error|Exception)\b.*\):", re.M)
    found = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "errors.py" and pattern.search(path.read_text())
    ]
    assert found == []


def test_no_such_entry_error_reads_like_an_os_error_and_pickles():
    exc = NoSuchEntryError("no entry 'x' at /tmp/loc")
    assert str(exc) == "no entry 'x' at /tmp/loc"
    assert isinstance(exc, KeyError) and isinstance(exc, FileNotFoundError)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is NoSuchEntryError and str(again) == str(exc)
