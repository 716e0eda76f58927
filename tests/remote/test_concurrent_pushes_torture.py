"""The torture section for racing pushes runs, and counts every trial under an outcome."""

from __future__ import annotations

import random
from pathlib import Path

from tests.file_module import load_module

SECTION = Path(__file__).parents[2] / "benchmarks" / "torture_sections" / "concurrent_pushes.py"


def test_the_concurrent_pushes_section_counts_every_trial_as_consistent(tmp_path):
    module = load_module(SECTION, "concurrent_pushes")
    assert module.OUTCOMES[0] in module.GOOD and module.GOOD <= set(module.OUTCOMES)
    trials = 2 * len(module.RACES)  # every race, on a folder and over HTTP
    counts, notes = module.run_section(tmp_path, trials, random.Random(5))
    assert sum(counts.values()) == trials and set(counts) <= set(module.OUTCOMES)
    assert counts["consistent"] + counts["consistent, told to retry"] == trials, notes
