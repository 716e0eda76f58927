"""Fixtures for transport tests: a loopback HTTP file server, no proxies, no tokens."""

from __future__ import annotations

import os

import pytest

from tests.fileserver import FileServer

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(autouse=True)
def _no_tokens(monkeypatch):
    monkeypatch.delenv("TORCHSTORE_HTTP_TOKEN", raising=False)
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")


@pytest.fixture
def file_server(tmp_path):
    """An HTTP server over ``tmp_path/served`` at ``file_server.url`` (Range, PUT, faults)."""
    with FileServer(tmp_path / "served") as server:
        yield server
