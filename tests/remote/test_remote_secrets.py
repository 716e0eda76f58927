"""Tokens from the environment are used, and never appear in logs, messages or reprs."""

from __future__ import annotations

import logging

import pytest

from tests.remote.remote_fixtures import make_dataset
from torchstore.remote import RemoteCatalog, RemoteNotFoundError, TransferError, pull, push
from torchstore.remote.backend import open_backend

SECRET = "hf_SeCrEt_tOkEn_0123456789abcdef"


def _texts(caplog, capsys, *objects):
    out = capsys.readouterr()
    return [caplog.text, out.out, out.err, *(str(o) for o in objects), *(repr(o) for o in objects)]


def test_http_token_never_shown(file_server, tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setenv("TORCHSTORE_HTTP_TOKEN", SECRET)
    caplog.set_level(logging.DEBUG)
    push(make_dataset(tmp_path / "local"), file_server.url, "ds", progress=False)
    pull(file_server.url, "ds", cache_dir=tmp_path / "c", progress=False)
    assert {r["authorization"] for r in file_server.requests} == {f"Bearer {SECRET}"}
    catalog = RemoteCatalog(file_server.url)
    errors = []
    with pytest.raises(RemoteNotFoundError) as e:
        pull(file_server.url, "missing", cache_dir=tmp_path / "c", progress=False)
    errors.append(e.value)
    file_server.delay_s = 0.3
    with pytest.raises(TransferError) as e:
        pull(
            file_server.url, "ds", cache_dir=tmp_path / "d", progress=False, timeout=0.05, retries=1
        )
    errors.append(e.value)
    for text in _texts(caplog, capsys, catalog, open_backend(catalog.location), *errors):
        assert SECRET not in text


def test_hub_token_never_shown(hub, tmp_path, monkeypatch, caplog, capsys):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    caplog.set_level(logging.DEBUG)
    push(make_dataset(tmp_path / "local"), hub.location, "ds", progress=False)
    pull(hub.location, "ds", cache_dir=tmp_path / "c", progress=False)
    assert f"Bearer {SECRET}" in {r["authorization"] for r in hub.requests}
    catalog = RemoteCatalog(hub.location)
    with pytest.raises(RemoteNotFoundError) as e:
        pull(hub.location, "missing", cache_dir=tmp_path / "c", progress=False)
    for text in _texts(caplog, capsys, catalog, open_backend(catalog.location), e.value):
        assert SECRET not in text


def test_credentials_in_a_location_are_refused():
    with pytest.raises(
        ValueError, match="must not carry credentials .* set TORCHSTORE_HTTP_TOKEN instead"
    ):
        RemoteCatalog(f"http://user:{SECRET}@127.0.0.1:9/data")
