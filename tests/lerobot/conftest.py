"""Shared fixtures of the LeRobot tests: the loopback Hub with an isolated huggingface_hub."""

from __future__ import annotations

import itertools

import pytest

from tests.hubserver import HubServer

_NAMESPACES = itertools.count()


@pytest.fixture(scope="session")
def hub_server():
    with HubServer() as server:
        yield server


@pytest.fixture
def hub(hub_server, tmp_path, monkeypatch):
    """The loopback Hub as the endpoint, a fresh namespace, and an isolated huggingface_hub."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    for var in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    patched = {
        "ENDPOINT": hub_server.endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub_server.endpoint
        + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
    }
    for name, value in patched.items():
        monkeypatch.setattr(constants, name, value)
    hub_server.namespace = f"lerobot{next(_NAMESPACES)}"
    hub_server.home = home
    return hub_server
