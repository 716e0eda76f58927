"""The Hub commands with ``HF_ENDPOINT`` unset: the code path of a default install.

Every other Hub test sets ``HF_ENDPOINT``; here huggingface_hub's own default endpoint is
pointed at the loopback Hub and each command runs in a fresh interpreter, where
huggingface_hub has loaded none of its submodules yet (``huggingface_hub.constants`` used
as an attribute crashed there).
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.hubserver import run_cli_default_endpoint
from tests.remote.remote_fixtures import make_dataset, tree_bytes

pytest.importorskip("huggingface_hub")


def _ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_push_catalog_pull_with_the_default_endpoint(hub_server, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    location = "hf://datasets/defaultep"
    local = make_dataset(tmp_path / "local")
    out = _ok(
        run_cli_default_endpoint(
            hub_server.endpoint, "push", str(local), location, "ds", "--no-progress"
        )
    )
    assert "pushed ds" in out
    assert ("dataset", "defaultep/ds") in hub_server.repos
    out = _ok(run_cli_default_endpoint(hub_server.endpoint, "catalog", location))
    assert "ds" in out.split() and "dataset" in out.split()
    cache = tmp_path / "cache"
    out = _ok(
        run_cli_default_endpoint(
            hub_server.endpoint, "pull", location, "ds", "--cache-dir", str(cache), "--no-progress"
        )
    )
    pulled = out.strip().splitlines()[-1]
    assert tree_bytes(tmp_path / pulled) == tree_bytes(local)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "command", [["catalog", "hf://datasets/nowhere"], ["pull", "hf://datasets/nowhere", "ds"]]
)
def test_an_unreachable_hub_is_one_line(tmp_path, command):
    # huggingface_hub retries a refused listing 5 times with 23 s of backoff: the retries
    # run (quietly, as a user gets them), their waits return at once
    waits = tmp_path / "waits.json"
    proc = run_cli_default_endpoint(
        f"http://127.0.0.1:{_closed_port()}",
        *command,
        env={"TORCHSTORE_CACHE": str(tmp_path / "c"), "HF_HUB_ETAG_TIMEOUT": "2"},
        waits_to=waits,
    )
    assert command[0] != "catalog" or len(json.loads(waits.read_text())) == 5
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"torchstore {command[0]}: "), proc.stderr
    assert "127.0.0.1" in lines[0] or "connect" in lines[0].lower()


@pytest.mark.parametrize(
    "command", [["catalog", "hf://datasets/ns"], ["pull", "hf://datasets/ns", "ds"]]
)
def test_offline_hub_is_one_line_and_sends_nothing(hub_server, tmp_path, command):
    before = len(hub_server.requests)
    proc = run_cli_default_endpoint(
        hub_server.endpoint,
        *command,
        env={"HF_HUB_OFFLINE": "1", "TORCHSTORE_CACHE": str(tmp_path / "c")},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "offline" in proc.stderr
    assert len(hub_server.requests) == before
