"""Fixtures for remote tests: loopback HTTP file server and Hub, isolated caches and env.

Hub-related environment variables are set here, at import, before anything imports
huggingface_hub (it reads several of them once, at import time).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile

import pytest

_HF_HOME = tempfile.mkdtemp(prefix="torchstore-test-hf-")
atexit.register(shutil.rmtree, _HF_HOME, True)
os.environ.update(
    HF_HOME=_HF_HOME,
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
    HF_HUB_ETAG_TIMEOUT="5",
    NO_PROXY="127.0.0.1,localhost",
    no_proxy="127.0.0.1,localhost",
)
for _var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
    os.environ.pop(_var, None)

try:  # read its settings now, with the environment above (it reads them once, at import)
    import huggingface_hub.constants  # noqa: E402, F401
except ImportError:
    pass

from tests.fileserver import FileServer  # noqa: E402
from tests.hubserver import HubServer  # noqa: E402

_NAMESPACES = itertools.count()


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Each test: its own HF_HOME and torchstore cache, no tokens, online."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("TORCHSTORE_CACHE", str(tmp_path / "default-cache"))
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    for var in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "TORCHSTORE_HTTP_TOKEN",
        "HF_HUB_OFFLINE",
        "TORCHSTORE_OFFLINE",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def file_server(tmp_path):
    """An HTTP server over ``tmp_path/served`` at ``file_server.url`` (Range, PUT, faults)."""
    with FileServer(tmp_path / "served") as server:
        yield server


@pytest.fixture(scope="session")
def hub_server():
    with HubServer() as server:
        yield server


@pytest.fixture
def hub(hub_server, monkeypatch):
    """The loopback Hub as huggingface_hub's default endpoint, plus a fresh namespace.

    ``HF_ENDPOINT`` is unset, as on a default install: the endpoint comes from
    ``huggingface_hub.constants`` (patched here), the path the LeRobot tests (which set
    ``HF_ENDPOINT``) do not take. ``hub.location`` is ``hf://datasets/<namespace>``.
    """
    from huggingface_hub import constants

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub_server.endpoint)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        hub_server.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    hub_server.namespace = f"tester{next(_NAMESPACES)}"
    hub_server.location = f"hf://datasets/{hub_server.namespace}"
    return hub_server
