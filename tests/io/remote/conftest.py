"""Fixtures for range reads: the loopback file server and Hub of the remote tests, with their
isolated environment (Hub variables set before huggingface_hub is imported)."""

from __future__ import annotations

import os

import pytest

from tests.remote.conftest import _isolated_env, file_server, hub, hub_server  # noqa: F401


@pytest.fixture
def served(request, file_server):  # noqa: F811
    """``(server, url, data)``: random bytes (the test module's ``SIZE`` of them) served as
    ``obj.bin``."""
    data = os.urandom(request.module.SIZE)
    (file_server.root / "obj.bin").write_bytes(data)
    return file_server, f"{file_server.url}/obj.bin", data
