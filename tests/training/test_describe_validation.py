"""A run's summary line shows its validation loss in significant digits, and says so when
no validation ran instead of printing ``nan``."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

from torchstore.training import describe_validation

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("loss", "text"),
    [
        (2e-7, "validation loss 2e-07"),  # :.4f printed 0.0000
        (torch.tensor(3.2e-5), "validation loss 3.2e-05"),
        (0.031249, "validation loss 0.03125"),
        (12.5, "validation loss 12.5"),
        (None, "no validation ran"),
        (math.nan, "validation loss nan"),  # a diverged run, which must show
    ],
)
def test_a_validation_loss_in_significant_digits(loss, text):
    assert describe_validation(loss) == text


def test_bc_robomimic_says_no_validation_ran(preloaded, tmp_path):
    """6 steps, fewer than the shipped val_check_interval: no validation, and the line says so."""
    from tests.formats.robomimic_files import write_robomimic
    from torchstore.formats import import_robomimic

    store = tmp_path / "lift.h5"
    import_robomimic(
        write_robomimic(tmp_path / "lift.hdf5", lengths=[12] * 6), store, progress=False
    )
    cmd = [
        sys.executable,
        str(ROOT / "recipes" / "bc_robomimic.py"),
        "trainer.max_steps=6",
        f"store.path={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = preloaded.run(cmd, cwd=tmp_path, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = [line for line in proc.stdout.splitlines() if "gradient steps" in line]
    assert summary and summary[-1].endswith("6 gradient steps, no validation ran"), proc.stdout
    assert "nan" not in proc.stdout
