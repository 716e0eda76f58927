"""Folder transports: a local folder (atomic writes) and fsspec (memory://) with one contract."""

from __future__ import annotations

import os
import uuid

import pytest

from torchstore.errors import IntegrityError
from torchstore.io.remote.folder import FsspecClient, LocalFolderClient, folder_client
from torchstore.io.remote.http import RemoteChangedError
from torchstore.io.remote.transfer import RemoteNotFoundError, TransferError


@pytest.fixture(params=["local", "memory"])
def client(request, tmp_path):
    if request.param == "local":
        return folder_client(str(tmp_path / "remote"))
    pytest.importorskip("fsspec")
    return folder_client(f"memory://ts-{uuid.uuid4().hex}")


def test_folder_client_contract(client, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(50_000)
    src.write_bytes(data)
    client.upload(src, "ds/a/src.bin")
    partial = tmp_path / "partial"
    partial.write_bytes(data[:20_000])  # an interrupted earlier download
    moved = []
    client.download("ds/a/src.bin", partial, size=len(data), progress=moved.append)
    assert partial.read_bytes() == data
    assert sum(moved) == 30_000  # resumed, not restarted
    with pytest.raises(
        IntegrityError, match="the remote file has 50000 bytes, larger than the 10 bytes declared"
    ):
        client.download("ds/a/src.bin", tmp_path / "q", size=10)
    with pytest.raises(RemoteNotFoundError, match="no file"):
        client.download("ds/none", tmp_path / "r", size=1)
    assert client.read_bytes("index.json", limit=10) is None
    client.write_bytes("index.json", b"{}", if_absent=True)
    _, etag = client.read_bytes("index.json", limit=10)
    with pytest.raises(RemoteChangedError, match="changed since it was read"):
        client.write_bytes("index.json", b"{1}", if_absent=True)
    client.write_bytes("index.json", b"[]", if_match=etag)
    with pytest.raises(RemoteChangedError, match="changed since it was read"):
        client.write_bytes("index.json", b"[1]", if_match=etag)
    with pytest.raises(TransferError, match="more than 1; refusing to read it"):
        client.read_bytes("index.json", limit=1)


def test_local_writes_leave_no_temporary_files(tmp_path):
    client = LocalFolderClient(tmp_path / "remote")
    client.write_bytes("index.json", b"{}")
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == ["index.json"]


def test_location_kinds(tmp_path):
    assert isinstance(folder_client(f"file://{tmp_path}"), LocalFolderClient)
    assert isinstance(folder_client(str(tmp_path)), LocalFolderClient)
    pytest.importorskip("fsspec")
    assert isinstance(folder_client("memory://x"), FsspecClient)
    with pytest.raises(ValueError, match="must name a local path"):
        folder_client("file://otherhost/x")


def test_delete_removes_a_file_and_the_folders_it_empties(tmp_path):
    client = LocalFolderClient(tmp_path / "remote")
    client.write_bytes("ds/a/b/x.bin", b"x")
    client.write_bytes("ds/keep.bin", b"k")
    client.delete("ds/a/b/x.bin")
    assert not (tmp_path / "remote" / "ds" / "a").exists()
    assert (tmp_path / "remote" / "ds" / "keep.bin").read_bytes() == b"k"
    client.delete("ds/a/b/x.bin")  # gone already: fine
    with pytest.raises(ValueError, match=r"'\.\.' segments"):
        client.delete("../outside")
