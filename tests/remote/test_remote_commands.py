"""The catalog/pull/push/sync/remote-index subcommands, wired as torchstore/cli/main.py does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.remote.remote_fixtures import make_dataset, parquet_bytes, tree_bytes
from torchstore.cli.remote import add_commands
from torchstore.errors import TorchstoreError


def run(argv):
    parser = argparse.ArgumentParser(prog="torchstore")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv])
    args.func(args)


def test_push_catalog_pull_sync_commands(file_server, tmp_path, capsys):
    local = make_dataset(tmp_path / "local")
    run(["push", local, file_server.url, "ds", "--no-progress"])
    assert "pushed ds (dataset, 3 files" in capsys.readouterr().out
    run(["catalog", file_server.url, "--files"])
    out = capsys.readouterr().out
    assert "ds" in out and "sha256:" in out and "meta/info.json" in out
    run(["catalog", file_server.url, "--json"])
    assert json.loads(capsys.readouterr().out)[0]["name"] == "ds"
    run(["pull", file_server.url, "ds", "--cache-dir", tmp_path / "c", "--no-progress"])
    path = capsys.readouterr().out.strip()
    assert tree_bytes(Path(path)) == tree_bytes(local)
    run(["pull", file_server.url, "ds", "--cache-dir", tmp_path / "c", "--offline"])
    assert capsys.readouterr().out.strip() == path
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "a.parquet").write_bytes(parquet_bytes())
    (rec / "b.parquet").write_bytes(b"PAR1")
    run(["sync", rec, file_server.url, "rec", "--no-progress"])
    out = capsys.readouterr().out
    assert "1 uploaded, 0 unchanged, 1 not complete yet" in out and "waiting: b.parquet" in out


def test_remote_index_command(file_server, tmp_path, capsys):
    make_dataset(file_server.root / "ds")
    run(["remote", "index", file_server.root, "--kind", "ds=recording"])
    assert "index.json" in capsys.readouterr().out
    run(["catalog", file_server.url])
    assert "recording" in capsys.readouterr().out
    with pytest.raises(TorchstoreError, match=r"--kind \('ds'\) must be NAME=KIND"):
        run(["remote", "index", file_server.root, "--kind", "ds"])


def test_bad_location_is_one_line_error():
    with pytest.raises(TorchstoreError, match="must be hf://NAMESPACE"):
        run(["catalog", "hf://a/b/c"])
