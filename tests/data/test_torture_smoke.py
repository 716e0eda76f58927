"""A short run of benchmarks/torture.py: every section runs and every outcome is on target."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.file_module import load_module

TORTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "torture.py"


@pytest.fixture(scope="module")
def torture():
    return load_module(TORTURE, "torture")


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
            "5000",
            "--second-writers",
            "3",
            "--kill-sequences",
            "4",
            "--disk-full",
            "3",
            "--dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert "| writer kill, inside commit" in out and "| bit flip: manifest" in out
    assert "| live readers x2, 300 commits" in out and "| dump_buffer killed (whole folder)" in out
    assert "| second writer while one is live" in out
    assert "| kill sequences (2-4 kills)" in out and "| disk full inside HDF5's write" in out
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


def test_the_new_sections_count_every_trial_under_a_declared_outcome(torture, tmp_path):
    import random

    from torture_sections import disk_full, kill_sequences

    for module, trials in ((kill_sequences, 5), (disk_full, 3)):
        assert module.OUTCOMES[0] in module.GOOD and module.GOOD <= set(module.OUTCOMES)
        counts, notes = module.run_section(tmp_path, trials, random.Random(3))
        assert sum(counts.values()) == trials and set(counts) <= set(module.OUTCOMES)
        assert counts[module.OUTCOMES[0]] == trials, notes
