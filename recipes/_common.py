"""What every recipe shares: paths, the sampler's ERE switch, the run folder and saved policies.

Recipes import this as ``from _common import ...``: running ``python recipes/bc.py`` puts
``recipes/`` first on ``sys.path``.

A run (:func:`recipe_run`) writes into its Hydra run folder, ``outputs/<recipe>/<time>/``:

- ``config.yaml``: the resolved config of the run (every default and override applied);
- ``metrics.csv``: one row per logged step, written through as it is logged;
- ``loss.png``: the curves of ``metrics.csv``, drawn when the run ends, interrupted or not;
- ``policy.safetensors``: the trained policy's tensors (:func:`load_policy` rebuilds it);
- ``<recipe>.log``: what the run printed, with timestamps.

Ctrl-C (SIGINT) or SIGTERM ends a run cleanly: the files above are completed (the policy
as trained so far), one line says where they are, and the process exits with 130 (143
for SIGTERM).
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import logging
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = Path(__file__).resolve().parent
DEFAULT_DEMO = REPO_ROOT / "data" / "reach_demo.h5"
CONFIG_FILE = "config.yaml"
POLICY_FILE = "policy.safetensors"
#: Recipes whose runs save a policy :func:`load_policy` can rebuild.
RECIPE_NAMES = ("bc", "bc_robomimic", "offline_rl", "sac", "distributed_sac")


def filter_third_party_warnings() -> None:
    """Hide warnings about libraries' code, not the recipe's, by message and category.

    Lightning's pytree helper builds torch's deprecated ``LeafSpec`` on every batch.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
    )


filter_third_party_warnings()


def repo_path(path: str | os.PathLike) -> Path:
    """An absolute path: as given, else relative to the cwd if it exists there, else to the repo."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return REPO_ROOT / path


def open_demo_store(store_cfg: DictConfig):
    """Instantiate the store config with its path resolved; rebuild the default data if missing."""
    path = repo_path(store_cfg.path)
    if not path.exists() and path == DEFAULT_DEMO:
        from torchstore.tasks import write_demo_data

        print(f"{path} is missing: regenerating it (torchstore demo-data)")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_demo_data(path)
    return instantiate(store_cfg, path=str(path))


def make_sampler(sampler_cfg: DictConfig, ere_cfg: DictConfig | None) -> Any:
    """Instantiate a sampler config; ``ere: true`` means the top-level ``ere`` schedule.

    ``ere`` may be null (no ERE), ``true`` / ``false`` (switch the recipe's ``ere``
    schedule on or off, so ``sampler.ere=true`` on the command line is enough), or a
    node with its own ``_target_: torchstore.ERE``.
    """
    ere = sampler_cfg.get("ere", None)
    if not isinstance(ere, bool):
        return instantiate(sampler_cfg)
    if ere and ere_cfg is None:
        raise ValueError("sampler.ere=true needs a top-level `ere` schedule in the config")
    # an ERE object passed through instantiate() would be turned into a config node (it is a
    # dataclass), so the sampler is built as a partial and called with it
    node = OmegaConf.to_container(sampler_cfg, resolve=True)
    node.pop("ere")
    return instantiate(node, _partial_=True)(ere=instantiate(ere_cfg) if ere else None)


def output_dir() -> Path:
    """The Hydra run's output folder (the cwd when not under Hydra)."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def result_line(name: str, result: Mapping[str, float]) -> str:
    """One row of a recipe's rollout table: success rate, mean return, mean length."""
    return (
        f"{name:<10}{result['success_rate']:>9.0%}{result['mean_return']:>9.2f}"
        f"{result['mean_length']:>8.1f}"
    )


RESULT_HEADER = f"{'policy':<10}{'success':>9}{'return':>9}{'length':>8}"


# --------------------------------------------------------------------------- metrics
class MetricsLog:
    """``metrics.csv`` (a ``step`` and a ``time_s`` column plus one per metric) and ``loss.png``.

    Every row is written through to the file as it is logged (one write, flushed), so the
    CSV holds every logged row even if the process is killed. A row with a metric not seen
    before rewrites the file with the new column (write a temporary file, rename).
    :meth:`close` rewrites the file whole and draws ``loss.png``.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.folder / "metrics.csv"
        self.png_path = self.folder / "loss.png"
        self._rows: list[dict[str, float]] = []
        self._keys: list[str] = ["step", "time_s"]
        self._start = time.perf_counter()
        self._rewrite()

    def __len__(self) -> int:
        return len(self._rows)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
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

    def close(self) -> None:
        """Write the CSV whole and the loss-curve PNG."""
        from torchstore.viz import plot_metrics

        self._rewrite()
        keys = [k for k in self._keys if k not in ("step", "time_s")]
        plot_metrics(self.csv_path, self.png_path, keys=keys)


def lightning_metrics_callback(log: MetricsLog, every: int = 10):
    """A Lightning callback copying the logged metrics into ``log`` every ``every`` steps."""
    from lightning.pytorch.callbacks import Callback

    class _CopyMetrics(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step % every == 0 or trainer.global_step == 1:
                metrics = {
                    k: v for k, v in trainer.callback_metrics.items() if not k.startswith("val")
                }
                log.log(trainer.global_step, metrics)

        def on_validation_epoch_end(self, trainer, pl_module) -> None:
            metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val")}
            if metrics and not trainer.sanity_checking:
                log.log(trainer.global_step, metrics)

    return _CopyMetrics()


def progress_lines_callback(log: logging.Logger, lines: int = 10):
    """A Lightning callback logging ``step k/N (p%): metrics, steps/s`` about ``lines``
    times over a run of ``max_steps`` (and at its last step): the progress bar's content
    for a log file or a pipe."""
    from lightning.pytorch.callbacks import Callback

    class _ProgressLines(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.start, self.total = time.perf_counter(), trainer.max_steps
            self.every = max(1, self.total // lines) if self.total > 0 else 100

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
            log.info(f"step {step}{total}: {', '.join(shown)}, {rate:.1f} steps/s")

    return _ProgressLines()


# --------------------------------------------------------------------------- the run
class _Advert(logging.Filter):
    """Drops Lightning's advertising tip (it names a cloud service, not the run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def _quiet_lightning() -> None:
    """Lightning's messages: no advertising, and through the root logger (console and log file)."""
    if "lightning.pytorch" not in sys.modules:
        return
    from lightning_utilities.core import rank_zero

    names = {"lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"}
    for logger in {rank_zero.log, *map(logging.getLogger, names)}:
        if not any(isinstance(f, _Advert) for f in logger.filters):
            logger.addFilter(_Advert())
    if logging.getLogger().handlers:  # under Hydra's logging: one place for every message
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


class RunInterrupted(BaseException):
    """Raised in the main thread by SIGINT or SIGTERM during a :func:`recipe_run`.

    A ``BaseException`` but not a ``KeyboardInterrupt``: Lightning turns a
    ``KeyboardInterrupt`` into ``sys.exit(1)``, while other exceptions pass through its
    teardown unchanged.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Run:
    """A running recipe: its folder, metrics, logger, how to save its policy, and signals.

    SIGINT and SIGTERM raise :class:`RunInterrupted` at once, except inside
    :meth:`interrupts_at_checks`: there the signal is noted and raised at the next
    :meth:`check` (a training step's end), so no library is cut off half-way through an
    update; a second signal raises at once.
    """

    name: str
    folder: Path
    metrics: MetricsLog
    log: logging.Logger
    step: int = 0
    #: set by the recipe once the policy exists: returns ``(tensors, step)`` to save
    policy_tensors: Callable[[], tuple[dict[str, torch.Tensor], int]] | None = None
    _pending: int | None = None
    _deferring: int = 0

    def _on_signal(self, signum: int, frame) -> None:
        first = self._pending is None
        if first:
            # noted even when raised at once: raised inside a weakref callback or a
            # ``__del__`` (Python only prints "Exception ignored in ..." there), it would be
            # lost; the next :meth:`check`, or the run's end, raises it again
            self._pending = signum
        if self._deferring and first:
            return
        raise RunInterrupted(self._pending)

    def check(self) -> None:
        """Raise :class:`RunInterrupted` if a signal arrived since the run started."""
        if self._pending is not None:
            raise RunInterrupted(self._pending)

    @contextlib.contextmanager
    def interrupts_at_checks(self) -> Iterator[None]:
        """Inside: a signal waits for the next :meth:`check` (leaving checks once more)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self.check()

    def trainer(self, trainer_cfg: DictConfig, **kwargs: Any):
        """The run's Lightning ``Trainer`` from its config, with the run's callbacks (metrics
        into ``metrics.csv``, signals at step ends) and its progress shown as Lightning's bar
        on a terminal, but as about ten plain lines when stdout is a file or a pipe (the bar
        redraws thousands of times with carriage returns, which a log keeps every one of).
        ``trainer.enable_progress_bar=false`` turns both off."""
        callbacks = [lightning_metrics_callback(self.metrics), self.lightning_callback()]
        if trainer_cfg.get("enable_progress_bar", True) and not sys.stdout.isatty():
            callbacks.append(progress_lines_callback(self.log))
            kwargs["enable_progress_bar"] = False
        return instantiate(
            trainer_cfg, callbacks=callbacks, default_root_dir=str(self.folder), **kwargs
        )

    def lightning_callback(self):
        """A Lightning callback calling :meth:`check` after every training and validation step."""
        from lightning.pytorch.callbacks import Callback

        run = self

        class _Check(Callback):
            def on_train_batch_end(self, *args, **kwargs) -> None:
                run.check()

            def on_validation_batch_end(self, *args, **kwargs) -> None:
                run.check()

        return _Check()

    @property
    def policy_path(self) -> Path:
        return self.folder / POLICY_FILE

    def finish(self, *, complete: bool) -> None:
        """Write ``loss.png`` and the policy (if one exists yet)."""
        self.metrics.close()
        if self.policy_tensors is not None:
            tensors, self.step = self.policy_tensors()
            save_policy(
                self.policy_path, tensors, recipe=self.name, step=self.step, complete=complete
            )

    def outputs(self) -> str:
        files = [CONFIG_FILE, f"metrics.csv ({len(self.metrics)} rows)", "loss.png"]
        if self.policy_path.exists():
            files.append(POLICY_FILE)
        files.append(f"{self.name}.log")
        return f"{self.folder}: {', '.join(files)}"


@contextlib.contextmanager
def recipe_run(cfg: DictConfig, name: str) -> Iterator[Run]:
    """The frame of a recipe's ``main``: outputs, config, signals, and what is written at the end.

    Writes ``config.yaml`` (resolved) at once and says where the outputs go. On leaving,
    normally or by SIGINT / SIGTERM, completes ``metrics.csv``, draws ``loss.png`` and saves
    the policy (:attr:`Run.policy_tensors`). An interrupted run prints one line naming its
    outputs and exits with 128 + the signal number (130 for Ctrl-C), without a traceback.
    """
    if name not in RECIPE_NAMES:
        raise ValueError(f"unknown recipe {name!r}; recipes: {list(RECIPE_NAMES)}")
    folder = output_dir().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    filter_third_party_warnings()
    _quiet_lightning()
    (folder / CONFIG_FILE).write_text(OmegaConf.to_yaml(cfg, resolve=True))
    log = logging.getLogger(name)
    if not logging.getLogger().handlers:  # not under Hydra's logging (a test calling main)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    run = Run(name, folder, MetricsLog(folder), log)
    log.info(f"outputs: {folder} (resolved config: {folder / CONFIG_FILE})")
    previous = {s: signal.signal(s, run._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield run
        run.check()  # a signal that a callback swallowed still ends the run as interrupted
    except RunInterrupted as exc:
        for s in previous:  # a second Ctrl-C must not cut the files short
            signal.signal(s, signal.SIG_IGN)
        run.finish(complete=False)
        tty = next((s for s in (sys.stderr, sys.stdout) if s.isatty()), None)
        if tty is not None:  # end the line of a progress bar (and the terminal's "^C")
            tty.write("\n")
            tty.flush()
        log.info(f"interrupted ({exc}) at step {run.step}; outputs in {run.outputs()}")
        raise SystemExit(128 + exc.signum) from None
    else:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        run.finish(complete=True)
        log.info(f"outputs in {run.outputs()}")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# --------------------------------------------------------------------------- saved policies
def save_policy(
    path: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    *,
    recipe: str,
    step: int,
    complete: bool,
) -> Path:
    """Write a policy's tensors as safetensors (temporary file, then rename).

    The file's metadata records ``recipe``, ``step`` (gradient steps trained) and
    ``complete`` (``"false"`` when the run was interrupted).
    """
    from safetensors.torch import save

    data = save(
        {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
        metadata={"recipe": recipe, "step": str(int(step)), "complete": str(complete).lower()},
    )
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def recipe_module(recipe: str):
    """The recipe script ``recipes/<recipe>.py`` as a module (its ``main`` is not run)."""
    if recipe not in RECIPE_NAMES:
        raise ValueError(f"unknown recipe {recipe!r}; recipes: {list(RECIPE_NAMES)}")
    main = sys.modules.get("__main__")
    if Path(getattr(main, "__file__", "") or "").resolve() == RECIPES / f"{recipe}.py":
        return main
    module_name = f"_recipe_{recipe}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, RECIPES / f"{recipe}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def build_policy(recipe: str, cfg: DictConfig, state: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild recipe ``recipe``'s policy from its run config and its saved tensors.

    ``state`` is what :func:`save_policy` wrote, loaded with
    ``safetensors.torch.load_file`` or fetched with
    ``torchstore.remote.fetch_policy_weights``. Returns, for ``bc`` and ``offline_rl``, a
    callable from a task observation to an action (what ``torchstore.tasks.evaluate``
    rolls out) and, for ``sac``, a torchrl actor (for ``env.rollout``).
    """
    return recipe_module(recipe).policy_from_weights(cfg, dict(state))


@dataclass
class SavedPolicy:
    """A policy loaded from a run folder (:func:`load_policy`)."""

    recipe: str
    cfg: DictConfig
    policy: Any
    step: int
    complete: bool

    def rollout(self, episodes: int | None = None) -> str:
        """Roll the policy out as its recipe evaluates it (same seeds); the printed result."""
        return recipe_module(self.recipe).rollout_saved(self.cfg, self.policy, episodes)


def load_policy(folder: str | os.PathLike) -> SavedPolicy:
    """The policy a recipe run saved in ``folder`` (``config.yaml`` + ``policy.safetensors``).

    ``folder`` is a run folder (``outputs/bc/<time>``) or a copy of its two files, for
    example an entry pulled with ``torchstore.remote.pull``.

    Raises:
        FileNotFoundError: ``folder`` lacks ``config.yaml`` or ``policy.safetensors``.
        ValueError: the weights file does not say which recipe wrote it.

    Examples:
        >>> saved = load_policy("outputs/bc/2026-01-01_12-00-00")  # doctest: +SKIP
        >>> print(saved.rollout(episodes=20))  # doctest: +SKIP
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    folder = Path(folder)
    for required in (CONFIG_FILE, POLICY_FILE):
        if not (folder / required).is_file():
            raise FileNotFoundError(
                f"{folder} has no {required}: not the folder of a finished or interrupted "
                "recipe run (outputs/<recipe>/<time>/)"
            )
    weights = folder / POLICY_FILE
    try:
        with safe_open(str(weights), "pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(weights))
    except Exception as exc:  # SafetensorError has no stable import path
        raise ValueError(f"{weights} is not a readable safetensors file: {exc}") from exc
    recipe = meta.get("recipe")
    if recipe not in RECIPE_NAMES:
        raise ValueError(
            f"{weights} names recipe {recipe!r} in its metadata; "
            f"expected one of {list(RECIPE_NAMES)}"
        )
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    try:
        policy = build_policy(recipe, cfg, state)
    except (KeyError, RuntimeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"{weights} does not fit the {recipe} policy described by {folder / CONFIG_FILE}: "
            f"{str(exc)[:300]}"
        ) from exc
    return SavedPolicy(
        recipe, cfg, policy, int(meta.get("step", 0)), meta.get("complete") == "true"
    )


def mlp_io(state: Mapping[str, torch.Tensor], prefix: str) -> tuple[int, int]:
    """Input and output sizes of the MLP whose ``Linear`` weights are under ``prefix``."""
    weights = [
        (tuple(int(p) for p in k[len(prefix) : -len(".weight")].split(".") if p.isdigit()), v)
        for k, v in state.items()
        if k.startswith(prefix) and k.endswith(".weight") and v.ndim == 2
    ]
    if not weights:
        raise ValueError(f"no linear layer under {prefix!r} in the policy's tensors")
    weights.sort(key=lambda item: item[0])
    return int(weights[0][1].shape[1]), int(weights[-1][1].shape[0])


def strip(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix``, with ``prefix`` removed from their names."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
