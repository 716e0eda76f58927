"""Lightning callbacks for a run's console and metrics file.

Lightning's progress bar redraws itself thousands of times with carriage returns; in a
terminal that is one line, but a log file or a pipe keeps every redraw. :class:`ProgressLines`
writes the bar's content as about ten plain lines instead (``step 400/2000 (20%): train/loss
0.031, 85.2 steps/s``); :func:`plain_progress_off_a_terminal` picks one or the other for
the current stdout. :class:`MetricsRecorder` copies the metrics a ``LightningModule``
logs into a sink such as :meth:`torchstore.training.MetricsLog.log`.

Examples:
    >>> log = MetricsLog(folder)  # doctest: +SKIP
    >>> callbacks, bar = plain_progress_off_a_terminal()  # doctest: +SKIP
    >>> trainer = L.Trainer(callbacks=[MetricsRecorder(log.log), *callbacks],
    ...                     enable_progress_bar=bar)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from lightning.pytorch.callbacks import Callback

from torchstore.validation import positive_int

__all__ = ["MetricsRecorder", "ProgressLines", "plain_progress_off_a_terminal"]

#: where :class:`ProgressLines` writes when given no logger
PROGRESS_LOGGER = "torchstore.progress"


class ProgressLines(Callback):
    """Logs ``step k/N (p%): metrics, steps/s`` about ``lines`` times over a run.

    ``N`` is the trainer's ``max_steps``; the last step is always reported. Without a
    ``max_steps`` (``-1``) a line is written every 100 steps, without the total. Scalar
    metrics of ``trainer.callback_metrics`` are shown, sorted by name.

    Args:
        log: the logger written to (INFO); ``logging.getLogger("torchstore.progress")``
            when omitted.
        lines: about how many lines a run writes.
    """

    def __init__(self, log: logging.Logger | None = None, lines: int = 10):
        self.logger = log if log is not None else logging.getLogger(PROGRESS_LOGGER)
        self.lines = positive_int("lines", lines)
        self.start, self.total, self.every = 0.0, -1, 100

    def on_train_start(self, trainer, pl_module) -> None:
        self.start, self.total = time.perf_counter(), trainer.max_steps
        self.every = max(1, self.total // self.lines) if self.total > 0 else 100

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every and step != self.total:
            return
        rate = step / max(time.perf_counter() - self.start, 1e-9)
        shown = [
            f"{k} {float(v):.4g}"
            for k, v in sorted(trainer.callback_metrics.items())
            if v.numel() == 1
        ]
        total = f"/{self.total} ({100 * step // self.total}%)" if self.total > 0 else ""
        self.logger.info(f"step {step}{total}: {', '.join(shown)}, {rate:.1f} steps/s")


class MetricsRecorder(Callback):
    """Hands the logged metrics to ``sink(step, metrics)``.

    Training metrics (every name not starting with ``val``) go at step 1 and every
    ``every`` steps; validation metrics once per validation run (not the sanity check).

    Args:
        sink: called with ``(global_step, {name: tensor})``, e.g. ``MetricsLog(...).log``.
        every: training steps between two training rows.
    """

    def __init__(self, sink: Callable[[int, Mapping[str, Any]], None], every: int = 10):
        self.sink = sink
        self.every = positive_int("every", every)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every == 0 or step == 1:
            metrics = {k: v for k, v in trainer.callback_metrics.items() if not k.startswith("val")}
            self.sink(step, metrics)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        if metrics and not trainer.sanity_checking:
            self.sink(trainer.global_step, metrics)


def plain_progress_off_a_terminal(
    log: logging.Logger | None = None,
    *,
    enabled: bool = True,
    stream: IO[str] | None = None,
) -> tuple[list[Callback], bool]:
    """``(callbacks, enable_progress_bar)`` for a ``Trainer``: Lightning's bar when
    ``stream`` (stdout by default) is a terminal, :class:`ProgressLines` into ``log`` when
    it is a file or a pipe, neither when not ``enabled``."""
    stream = sys.stdout if stream is None else stream
    if not enabled:
        return [], False
    if stream.isatty():
        return [], True
    return [ProgressLines(log)], False
