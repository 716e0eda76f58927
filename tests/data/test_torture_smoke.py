"""A short run of benchmarks/torture.py: every section runs and every outcome is on target."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TORTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "torture.py"


@pytest.fixture(scope="module")
def torture():
    spec = importlib.util.spec_from_file_location("torture", TORTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_torture_run_is_all_on_target(torture, tmp_path, capsys):
    code = torture.main(
        [
            "--seed",
            "1",
            "--kills",
            "6",
            "--corruptions",
            "16",
            "--readers",
            "2",
            "--commits",
            "300",
            "--dumps",
            "2",
            "--dump-rows",
            "20000",
            "--second-writers",
            "3",
            "--dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert "| writer kill, inside commit" in out and "| bit flip: manifest" in out
    assert "| live readers x2, 300 commits" in out and "| StoreReplay.dumps killed" in out
    assert "| second writer while one is live" in out
    assert code == 0, out


def test_the_region_map_finds_every_region_of_a_store(torture, tmp_path):
    from torture_sections import bit_flips  # on the path once torture.py is loaded

    path = tmp_path / "s.h5"
    bit_flips._pristine_store(path)
    regions = bit_flips.file_regions(path)
    for name in (
        "superblock",
        "object headers",
        "manifest",
        "checksum tables",
        "episode tables",
        "commit record",
        "data",
    ):
        assert regions[name], name
    data = path.read_bytes()
    ((lo, hi),) = regions["manifest"]
    assert data[lo:hi].startswith(b'{"columns"')
    ((lo, hi),) = regions["commit record"]
    assert hi - lo == 32  # three counts and their hash
