"""A short run of benchmarks/torture.py: every section runs and every outcome is on target."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.file_module import load_module

TORTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "torture.py"


@pytest.fixture(scope="module")
def torture():
    return load_module(TORTURE, "torture")


#: trials of each section in the short run (the full counts run in benchmarks/torture.py;
#: tests/formats/test_rlds_hostile.py and tests/remote/test_concurrent_pushes_torture.py run
#: more of the RLDS and push sections on their own)
SHORT = {
    "--kills": 6,
    "--corruptions": 16,
    "--readers": 2,
    "--commits": 300,
    "--dumps": 2,
    "--dump-rows": 5000,
    "--second-writers": 3,
    "--kill-sequences": 5,
    "--disk-full": 3,
    "--concurrent-pushes": 8,  # every race, on a folder and over HTTP
    "--rlds-files": 8,  # every kind of mutation, twice
}


def test_a_short_torture_run_is_all_on_target(torture, tmp_path, capsys):
    from torture_sections import disk_full, kill_sequences

    args = [str(part) for item in SHORT.items() for part in item]
    code = torture.main(["--seed", "1", *args, "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| writer kill, inside commit" in out and "| bit flip: manifest" in out
    assert "| live readers x2, 300 commits" in out and "| dump_buffer killed (whole folder)" in out
    assert "| second writer while one is live" in out
    assert "| kill sequences (2-4 kills)" in out and "| disk full inside HDF5's write" in out
    assert "| concurrent pushes (4-8 pushers) |      8 |" in out
    assert "| hostile RLDS datasets        |      8 |" in out
    assert code == 0, out
    # the newer sections count every trial under a declared outcome, all under the first
    # (the row lists each declared outcome's count, then any undeclared one)
    rows = out.splitlines()
    for module, flag, name in (
        (kill_sequences, "--kill-sequences", "kill sequences (2-4 kills)"),
        (disk_full, "--disk-full", "disk full inside HDF5's write"),
    ):
        assert module.OUTCOMES[0] in module.GOOD and module.GOOD <= set(module.OUTCOMES)
        trials = SHORT[flag]
        all_first = torture._row(
            name, trials, Counter({module.OUTCOMES[0]: trials}), module.OUTCOMES
        )
        assert all_first in rows, out


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
