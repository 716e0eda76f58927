"""verify: every checksum read once, damage named by column and rows, exit 0/1; info says it
has not verified."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.damage import flip_chunk_byte
from torchstore.cli import main
from torchstore.data.store.verify import verify_store
from torchstore.demo import write_demo_store


@pytest.fixture
def store(tmp_path):
    return write_demo_store(tmp_path / "demo.h5", episodes=30, steps=400, seed=0)


def _flip_chunk(path, column: str, chunk: int) -> int:
    """Flip one byte inside chunk ``chunk`` of ``column``; returns the rows per chunk."""
    return flip_chunk_byte(path, f"columns/{column}", chunk, 7, mask=0x01)


def test_a_healthy_store_verifies_with_progress(store):
    calls = []
    report = verify_store(store, progress=lambda done, total: calls.append((done, total)))
    assert report.ok and report.problems == []
    assert report.rows == 12000 and report.episodes == 30 and report.columns == 6
    assert calls and calls[-1][0] == calls[-1][1] == report.bytes_checked
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert report.verdict().startswith(f"{store}: OK (6 columns, 12,000 rows, 30 episodes")


def test_damage_names_every_column_and_its_rows(store):
    obs_rows = _flip_chunk(store, "obs", 0)
    reward_rows = _flip_chunk(store, "reward", 0)  # one chunk holds every reward
    assert reward_rows > 12000 and obs_rows < 12000
    report = verify_store(store, progress=False)
    assert not report.ok
    assert f"column 'obs' rows 0..{obs_rows - 1} fail their checksum" in report.problems
    assert "column 'reward' rows 0..11999 fail their checksum" in report.problems
    assert len(report.problems) == 2
    assert report.verdict().startswith(f"{store}: DAMAGED: ")


def test_a_truncated_store_is_damaged_not_an_exception(store):
    size = os.path.getsize(store)
    with open(store, "r+b") as f:
        f.truncate(size // 2)
    report = verify_store(store, progress=False)
    assert not report.ok and report.problems[0]
    assert report.verdict().count(str(store)) == 1


def test_cli_verify_exit_status_and_one_line_verdict(store, capsys, monkeypatch):
    monkeypatch.setenv("TORCHSTORE_DISABLE_PROGRESS", "1")
    assert main(["verify", str(store)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [out.strip()] and ": OK (" in out
    rows = _flip_chunk(store, "next/obs", 1)
    assert main(["verify", str(store), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"DAMAGED: column 'next/obs' rows {rows}..11999 fail their checksum" in err


def test_cli_verify_in_a_subprocess(store, capsys):
    # The clean store through main() in-process (the status the command exits with); the
    # damaged one through a real process: its exit status, and no traceback on its stderr.
    assert main(["verify", str(store)]) == 0, capsys.readouterr().err
    _flip_chunk(store, "action", 0)
    bad = subprocess.run(
        [sys.executable, "-m", "torchstore.cli", "verify", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        bad.returncode == 1
        and "column 'action' rows 0.." in bad.stderr
        and "Traceback" not in bad.stderr
    )


def test_info_says_the_data_is_not_verified(store, capsys):
    _flip_chunk(store, "obs", 0)
    assert main(["info", str(store)]) == 0  # opening does not read column data...
    out = capsys.readouterr().out
    assert "checksums  not verified" in out and f"torchstore verify {store}" in out
    assert main(["info", str(store), "--json"]) == 0
    assert '"verified": false' in capsys.readouterr().out
