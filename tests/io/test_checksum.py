"""SHA-256 and git blob ids of files, and the verification every pulled file goes through."""

from __future__ import annotations

import hashlib

import pytest

from torchstore.errors import IntegrityError
from torchstore.io.remote.checksum import (
    git_blob_sha1_file,
    is_sha1,
    is_sha256,
    sha256_file,
    verify_file,
)


def test_digests_match_known_values(tmp_path):
    p = tmp_path / "hello"
    p.write_bytes(b"hello\n")
    assert sha256_file(p) == hashlib.sha256(b"hello\n").hexdigest()
    assert git_blob_sha1_file(p) == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object
    assert is_sha256(sha256_file(p)) and is_sha1(git_blob_sha1_file(p))
    assert not is_sha256("ABC") and not is_sha1(None)


def test_verify_accepts_the_declared_bytes(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"abc" * 1000)
    verify_file(p, size=3000, sha256=sha256_file(p))
    verify_file(p, size=3000, blob_sha1=git_blob_sha1_file(p))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 10}, r"'x': received 3000 bytes, larger than the 10 bytes declared"),
        ({"size": 5000}, "smaller than the 5000 bytes declared"),
        ({"size": 3000, "sha256": "0" * 64}, "'x': sha256 mismatch, expected 0{64}, got"),
        ({"size": 3000, "blob_sha1": "0" * 40}, "git blob sha1 mismatch"),
        ({"size": 3000}, "no sha256 or git blob sha1 is declared"),
    ],
)
def test_verify_refuses(tmp_path, kwargs, match):
    p = tmp_path / "x"
    p.write_bytes(b"abc" * 1000)
    with pytest.raises(IntegrityError, match=match):
        verify_file(p, subject="'x'", **kwargs)
