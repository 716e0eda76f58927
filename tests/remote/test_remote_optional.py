"""Optional dependencies fail with the extra to install; a busy cache fails after its wait."""

from __future__ import annotations

import fcntl
import os
import sys

import pytest

from torchstore.io.remote.hub import HubClient, require_huggingface_hub
from torchstore.remote import TransferError, fetch_policy_weights, pull, push


def test_missing_huggingface_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[hub\]"'):
        require_huggingface_hub()


def test_missing_safetensors_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ImportError, match=r'needs safetensors: pip install -e "\.\[hub\]"'):
        fetch_policy_weights(tmp_path, "p")


def test_missing_fsspec_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ImportError, match="needs fsspec: pip install fsspec"):
        pull("s3://bucket/x", "ds", cache_dir=tmp_path)


def test_hub_repo_type_is_checked():
    with pytest.raises(ValueError, match=r"repo_type \('space'\) must be one of"):
        HubClient("ns", repo_type="space")


def test_a_busy_cache_entry_times_out(file_server, tmp_path, monkeypatch):
    import torchstore.remote.cache as pull_mod

    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "x.txt").write_text("x")
    push(tmp_path / "local", file_server.url, "ds", progress=False)
    got = pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    (got / "x.txt").write_text("tampered")  # so the next pull has something to fetch
    monkeypatch.setattr(pull_mod, "LOCK_TIMEOUT_S", 0.2)
    lock = next((tmp_path / "c").iterdir()) / ".locks" / "ds"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another puller holds the entry (flock: per open file)
        with pytest.raises(
            TransferError, match="another process has been pulling 'ds' into .* for 0.2 s"
        ):
            pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    finally:
        os.close(fd)
