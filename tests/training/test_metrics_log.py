"""A run's metrics.csv as a user reads it: every logged row on disk, even after SIGKILL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from torchstore.errors import StoreFormatError
from torchstore.training import MetricsLog, read_metrics


def test_rows_are_on_disk_as_they_are_logged(tmp_path):
    """A new column rewrites the header; NaN is left out of its row; close draws the PNG."""
    log = MetricsLog(tmp_path)
    log.log(1, {"loss": 0.5})
    log.log(2, {"loss": torch.tensor([0.2, 0.3])})  # a tensor is logged as its mean
    assert [r["loss"] for r in read_metrics(log.csv_path)] == [0.5, 0.25]
    log.log(3, {"eval/return": -3.0})
    rows = read_metrics(tmp_path)  # the folder works as well as the file
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "eval/return" not in rows[0] and rows[2]["eval/return"] == -3.0
    log.log(4, {"loss": float("nan")})
    assert "loss" not in read_metrics(log.csv_path)[-1] and len(log) == 4
    assert not log.png_path.exists()
    log.close()
    assert log.png_path.stat().st_size > 5_000


def test_close_without_plot_writes_only_the_csv(tmp_path):
    log = MetricsLog(tmp_path)
    log.log(1, {"loss": 1.0})
    log.close(plot=False)
    assert read_metrics(tmp_path)[0]["loss"] == 1.0 and not log.png_path.exists()


def test_rows_survive_sigkill(tmp_path):
    code = (
        "import sys, time\n"
        "from torchstore.training import MetricsLog\n"
        "log = MetricsLog(sys.argv[1])\n"
        "for i in range(1, 1_000_000):\n"
        "    log.log(i, {'loss': 1.0 / i}); print(i, flush=True); time.sleep(0.01)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        printed = [proc.stdout.readline() for _ in range(20)]
        assert printed[-1].strip() == "20"
    finally:
        proc.kill()
        proc.wait()
    rows = read_metrics(tmp_path)
    assert len(rows) >= 20  # every row logged before the last print is on disk
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))


def test_read_metrics_refuses_a_file_that_is_not_a_metrics_file(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(StoreFormatError, match=r"other.csv has no 'step' column"):
        read_metrics(other)
    other.write_text("step,loss\n1,0.5\n2,lots\n")
    with pytest.raises(StoreFormatError, match="other.csv line 3"):
        read_metrics(other)
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "missing.csv")


def test_a_resumed_log_keeps_the_rows_up_to_its_step_and_goes_on(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 10, 20, 30):
        log.log(step, {"loss": 1.0 / step})
    log.log(20, {"eval/success": 0.5})
    log.close()
    resumed = MetricsLog.resume(tmp_path, 20)  # a checkpoint at step 20: step 30 is redone
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 10, 20, 20]
    assert len(resumed) == 4
    resumed.log(30, {"loss": 0.03})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 10, 20, 20, 30]
    assert rows[3]["eval/success"] == 0.5 and rows[-1]["loss"] == 0.03
    assert rows[-1]["time_s"] >= rows[3]["time_s"]  # the clock goes on
    with pytest.raises(FileNotFoundError):
        MetricsLog.resume(tmp_path / "nowhere", 0)
