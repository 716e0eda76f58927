"""Fixtures for range reads: the loopback file server and Hub of the remote tests, with their
isolated environment (Hub variables set before huggingface_hub is imported)."""

from __future__ import annotations

from tests.remote.conftest import _isolated_env, hub, hub_server  # noqa: F401
