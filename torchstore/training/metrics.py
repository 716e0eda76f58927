"""A training run's metrics as a CSV file that survives a killed process, and its curves.

``metrics.csv`` has a ``step`` and a ``time_s`` column (seconds since the log was opened)
plus one column per metric ever logged; a row leaves a cell empty for a metric it did not
log. Every row is appended and flushed as it is logged, so the file holds every logged row
even after a SIGKILL. A metric not seen before rewrites the file with the new column (a
temporary file, then a rename), so a reader never sees a header shorter than a row.
A resumed run continues its log (:meth:`MetricsLog.resume`): the rows up to the step it
resumes from are kept, and new rows follow them.

Examples:
    >>> log = MetricsLog("outputs/run")  # doctest: +SKIP
    >>> log.log(1, {"train/loss": 0.5})  # doctest: +SKIP
    >>> log.close()  # the CSV whole, and loss.png  # doctest: +SKIP
    >>> read_metrics("outputs/run/metrics.csv")  # doctest: +SKIP
    [{'step': 1, 'time_s': 0.0, 'train/loss': 0.5}]

A run's summary line names its validation loss with :func:`describe_validation`:

    >>> describe_validation(2e-7), describe_validation(0.031249), describe_validation(None)
    ('validation loss 2e-07', 'validation loss 0.03125', 'no validation ran')
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchstore.errors import StoreFormatError

__all__ = ["METRICS_FILE", "PLOT_FILE", "MetricsLog", "describe_validation", "read_metrics"]

METRICS_FILE = "metrics.csv"
PLOT_FILE = "loss.png"
_FIXED = ("step", "time_s")


class MetricsLog:
    """``metrics.csv`` in ``folder``, written through as rows are logged; ``loss.png`` at close.

    Opening a log starts a fresh file (a header only); :meth:`resume` continues one.
    Values may be numbers or tensors (a tensor is logged as its mean); NaN and infinite
    values are left out of their row.

    Args:
        folder: where ``metrics.csv`` and ``loss.png`` go (created if missing).
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.folder / METRICS_FILE
        self.png_path = self.folder / PLOT_FILE
        self._rows: list[dict[str, float]] = []
        self._keys: list[str] = list(_FIXED)
        self._start = time.perf_counter()
        self._rewrite()

    @classmethod
    def resume(cls, folder: str | os.PathLike, step: int) -> MetricsLog:
        """The log of ``folder`` continued by a run resumed at ``step``.

        The rows logged up to ``step`` are kept, in their order, and the columns with
        them; rows past ``step`` (logged by training a resumed run does again: the steps
        after its checkpoint) are dropped. ``time_s`` goes on from the last kept row.

        Raises:
            FileNotFoundError: ``folder`` has no ``metrics.csv``.
            StoreFormatError: the file is not a metrics file.
        """
        log = cls.__new__(cls)
        log.folder = Path(folder)
        log.csv_path = log.folder / METRICS_FILE
        log.png_path = log.folder / PLOT_FILE
        with open(log.csv_path, newline="") as f:
            header = next(csv.reader(f), [])
        kept = [row for row in read_metrics(log.csv_path) if row["step"] <= step]
        log._rows = kept
        log._keys = list(_FIXED) + [k for k in header if k not in _FIXED]
        log._start = time.perf_counter() - (kept[-1].get("time_s", 0.0) if kept else 0.0)
        log._rewrite()
        return log

    def __len__(self) -> int:
        return len(self._rows)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one row: ``step``, the time since the log was opened, and ``metrics``."""
        row: dict[str, float] = {
            "step": int(step),
            "time_s": round(time.perf_counter() - self._start, 3),
        }
        new_key = False
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().float().mean().item()
            value = float(value)
            if math.isfinite(value):
                row[key] = value
                if key not in self._keys:
                    self._keys.append(key)
                    new_key = True
        self._rows.append(row)
        if new_key:
            self._rewrite()
        else:
            with open(self.csv_path, "a", newline="") as f:
                f.write(self._format([row], header=False))
                f.flush()

    def _format(self, rows: list[dict[str, float]], *, header: bool) -> str:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self._keys, restval="")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return text.getvalue()

    def _rewrite(self) -> None:
        tmp = self.csv_path.with_name(self.csv_path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            f.write(self._format(self._rows, header=True))
            f.flush()
        os.replace(tmp, self.csv_path)

    def flush(self) -> None:
        """Rewrite ``metrics.csv`` from every row logged so far."""
        self._rewrite()

    def close(self, *, plot: bool = True) -> None:
        """Write the CSV whole and, with ``plot``, the curves as ``loss.png`` (matplotlib)."""
        self._rewrite()
        if plot:
            from torchstore.viz import plot_metrics

            keys = [k for k in self._keys if k not in _FIXED]
            plot_metrics(self.csv_path, self.png_path, keys=keys)


def read_metrics(path: str | os.PathLike) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv`` (a file, or the folder holding one), empty cells left out.

    ``step`` comes back as an ``int``, every other value as a ``float``.

    Raises:
        FileNotFoundError: there is no such file.
        StoreFormatError: the file has no ``step`` column, or a cell is not a number.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if "step" not in (reader.fieldnames or []):
            raise StoreFormatError(
                f"{path} has no 'step' column (columns: {reader.fieldnames}); "
                "not a metrics file written by MetricsLog"
            )
        rows = []
        for line, raw in enumerate(reader, start=2):
            try:
                row: dict[str, float] = {"step": int(raw["step"])}
                row.update({k: float(v) for k, v in raw.items() if k != "step" and v})
            except (TypeError, ValueError) as exc:
                raise StoreFormatError(f"{path} line {line}: {exc}") from exc
            rows.append(row)
    return rows


def describe_validation(loss: float | torch.Tensor | None) -> str:
    """``"validation loss 2e-07"``: a run's last validation loss to four significant digits,
    or ``"no validation ran"`` when ``loss`` is None (a run shorter than its
    ``val_check_interval``, or with no validation episodes).

    Significant digits, not decimals: a converged behaviour-cloning loss of 2e-7 printed
    as ``0.0000`` with ``:.4f``. A loss that is NaN is a diverged run and prints ``nan``.
    """
    if loss is None:
        return "no validation ran"
    return f"validation loss {float(loss):.4g}"
