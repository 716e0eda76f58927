"""Project tests: their own cache, config home and an online, token-free environment."""

from __future__ import annotations

import pytest

from tests.fileserver import FileServer


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    for var in (
        "TORCHSTORE_LOCATIONS",
        "HF_TOKEN",
        "TORCHSTORE_HTTP_TOKEN",
        "HF_HUB_OFFLINE",
        "TORCHSTORE_OFFLINE",
        "HTTP_PROXY",
        "http_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def file_server(tmp_path):
    with FileServer(tmp_path / "served") as server:
        yield server
