"""Lightning callbacks for a run's console, metrics file and checkpoint.

Lightning's progress bar redraws itself thousands of times with carriage returns; in a
terminal that is one line, but a log file or a pipe keeps every redraw. :class:`ProgressLines`
writes the bar's content as about ten plain lines instead (``step 400/2000 (20%): train/loss
0.031, 85.2 steps/s``); :func:`plain_progress_off_a_terminal` picks one or the other for
the current stdout. A terminal that reports no size (a pseudo-terminal of 0x0, as
``script -qc CMD /dev/null`` opens when it has no terminal of its own) counts as no
terminal: tqdm sizes its bar to the terminal's width and draws nothing at width 0, so
such a run would print nothing at all while it trains (:mod:`torchstore.io.console`
sizes a tqdm bar of one's own there).
:class:`MetricsRecorder` copies the metrics a ``LightningModule`` logs into a sink such as
:meth:`torchstore.training.MetricsLog.log`; :class:`LastCheckpoint` keeps one Lightning
checkpoint of a run (``last.ckpt``), rewritten every so many steps, at the end and when
the run is interrupted.

Examples:
    >>> log = MetricsLog(folder)  # doctest: +SKIP
    >>> callbacks, bar = plain_progress_off_a_terminal()  # doctest: +SKIP
    >>> trainer = L.Trainer(callbacks=[MetricsRecorder(log.log), *callbacks],
    ...                     enable_progress_bar=bar)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from lightning.pytorch.callbacks import Callback

from torchstore.io.console import terminal_columns
from torchstore.validation import positive_int

__all__ = [
    "LastCheckpoint",
    "MetricsRecorder",
    "ProgressLines",
    "plain_progress_off_a_terminal",
    "read_checkpoint_state",
]

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
        self.start, self.first, self.total, self.every = 0.0, 0, -1, 100

    def on_train_start(self, trainer, pl_module) -> None:
        # a resumed run starts at its checkpoint's step: the rate counts this run's steps
        self.start, self.first = time.perf_counter(), trainer.global_step
        self.total = trainer.max_steps
        self.every = max(1, self.total // self.lines) if self.total > 0 else 100

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every and step != self.total:
            return
        rate = (step - self.first) / max(time.perf_counter() - self.start, 1e-9)
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
    ``stream`` (stdout by default) is a terminal with a size, :class:`ProgressLines` into
    ``log`` when it is a file, a pipe or a terminal of width 0, neither when not
    ``enabled``."""
    stream = sys.stdout if stream is None else stream
    if not enabled:
        return [], False
    if terminal_columns(stream) > 0:
        return [], True
    return [ProgressLines(log)], False


class LastCheckpoint(Callback):
    """Keeps the run's Lightning checkpoint at ``path`` (``last.ckpt``): written every
    ``every`` training steps, when training ends, and when it stops on one of the
    exceptions in ``on``; ``trainer.fit(..., ckpt_path=path)`` continues from it.

    Each write goes to a temporary file renamed over ``path``, so a run killed while
    writing keeps the previous checkpoint. ``state`` is saved in the checkpoint under this
    callback's entry (``checkpoint["callbacks"]["LastCheckpoint"]``), for a reader that
    must know what wrote it without building the model (:func:`read_checkpoint_state`).

    Args:
        path: the checkpoint file.
        every: training steps between two writes (>= 1).
        on: exception types (an interrupt) at which the state is written as it is; a
            checkpoint is not written at others, which may have left a step half-done.
        state: text or numbers to keep in the checkpoint (``{"recipe": "bc"}``).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        every: int,
        *,
        on: tuple[type[BaseException], ...] = (),
        state: Mapping[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.every = positive_int("every", every)
        self.on = tuple(on)
        self.state = dict(state or {})
        self._saved_at = -1

    @property
    def state_key(self) -> str:
        return "LastCheckpoint"

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def save(self, trainer) -> None:
        """Write ``trainer``'s checkpoint to ``path`` (once per step)."""
        if trainer.global_step == self._saved_at:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        trainer.save_checkpoint(tmp, weights_only=False)  # the whole state: a run goes on from it
        os.replace(tmp, self.path)
        self._saved_at = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            self.save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, self.on) and not trainer.sanity_checking:
            self.save(trainer)


def read_checkpoint_state(path: str | os.PathLike) -> tuple[int, dict[str, Any]]:
    """``(global_step, state)`` of a checkpoint :class:`LastCheckpoint` wrote (``state``
    is empty for one it did not write).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        StoreFormatError: the file is not a readable Lightning checkpoint.
    """
    import torch

    from torchstore.errors import StoreFormatError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        step = int(checkpoint["global_step"])
    except Exception as exc:  # a truncated or foreign file: unpickling errors vary
        raise StoreFormatError(f"{path} is not a readable Lightning checkpoint: {exc}") from exc
    state = checkpoint.get("callbacks", {}).get("LastCheckpoint", {})
    return step, dict(state)
