"""What every recipe shares: paths, the sampler's ERE switch, the run folder and saved policies.

Recipes import this as ``from _common import ...``: running ``python recipes/bc.py`` puts
``recipes/`` first on ``sys.path``.

A run (:func:`recipe_run`) writes a :class:`torchstore.training.RunFolder` into its Hydra
run folder, ``outputs/<recipe>/<time>/``:

- ``config.yaml``: the resolved config of the run (every default and override applied);
- ``metrics.csv``: one row per logged step, written through as it is logged;
- ``loss.png``: the curves of ``metrics.csv``, drawn when the run ends, interrupted or not;
- ``policy.safetensors``: the trained policy's tensors (:func:`load_policy` rebuilds it);
- ``<recipe>.log``: what the run printed, with timestamps.

Ctrl-C (SIGINT) or SIGTERM ends a run cleanly: the files above are completed (the policy
as trained so far), one line says where they are, and the process exits with 130 (143
for SIGTERM). What is left here is the recipes' own: Hydra config handling, the signal
frame of a script, and which recipe rebuilds which policy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from torchstore.training import MetricsLog, RunFolder

if TYPE_CHECKING:
    from torchstore.lightning import Normalizer

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = Path(__file__).resolve().parent
DEFAULT_DEMO = REPO_ROOT / "data" / "reach_demo.h5"
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
    folder: RunFolder
    metrics: MetricsLog
    log: logging.Logger
    step: int = 0
    #: set by the recipe once the policy exists: returns ``(tensors, step)`` to save
    policy_tensors: Callable[[], tuple[dict[str, torch.Tensor], int]] | None = None
    #: saved with the policy when set (the data module's, for a policy trained on it)
    normalizer: Normalizer | None = None
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
        """Inside: a signal waits for the next :meth:`check` (leaving checks once more).

        Lightning answers a SIGTERM itself, by raising ``SIGTERMException`` (a
        ``SystemExit``, status 0) at the end of a training step; one that lands after this
        run's step-end check would end the process as if the run had finished, so it is
        taken as the interrupt it is.
        """
        self._deferring += 1
        try:
            yield
        except SystemExit:
            if self._pending is None:
                raise
        finally:
            self._deferring -= 1
        self.check()

    def trainer(self, trainer_cfg: DictConfig, **kwargs: Any):
        """The run's Lightning ``Trainer`` from its config, with the run's callbacks (metrics
        into ``metrics.csv``, signals at step ends) and its progress shown as Lightning's bar
        on a terminal, but as about ten plain lines when stdout is a file or a pipe.
        ``trainer.enable_progress_bar=false`` turns both off."""
        from torchstore.lightning import MetricsRecorder, plain_progress_off_a_terminal

        progress, kwargs["enable_progress_bar"] = plain_progress_off_a_terminal(
            self.log, enabled=trainer_cfg.get("enable_progress_bar", True)
        )
        callbacks = [MetricsRecorder(self.metrics.log), self.lightning_callback(), *progress]
        return instantiate(
            trainer_cfg, callbacks=callbacks, default_root_dir=str(self.folder.path), **kwargs
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

    def finish(self, *, complete: bool) -> None:
        """Write ``loss.png`` and the policy (if one exists yet)."""
        self.metrics.close()
        if self.policy_tensors is not None:
            tensors, self.step = self.policy_tensors()
            self.folder.save_policy(
                tensors,
                normalizer=self.normalizer,
                metadata={"recipe": self.name, "step": self.step, "complete": complete},
            )

    def outputs(self) -> str:
        return self.folder.describe(rows=len(self.metrics))


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
    folder = RunFolder(output_dir().resolve())
    filter_third_party_warnings()
    _quiet_lightning()
    folder.write_config(cfg)
    log = logging.getLogger(name)
    if not logging.getLogger().handlers:  # not under Hydra's logging (a test calling main)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    run = Run(name, folder, folder.metrics_log(), log)
    log.info(f"outputs: {folder.path} (resolved config: {folder.config_path})")
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

    ``state`` is every tensor of the run's ``policy.safetensors`` (read with
    ``torchstore.training.read_policy_file`` or fetched with
    ``torchstore.remote.fetch_policy_weights``). Returns, for ``bc`` and ``offline_rl``, a
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
    run = RunFolder(folder)
    for required in (run.config_path, run.policy_path):
        if not required.is_file():
            raise FileNotFoundError(
                f"{run.path} has no {required.name}: not the folder of a finished or "
                "interrupted recipe run (outputs/<recipe>/<time>/)"
            )
    saved = run.read_policy()
    recipe = saved.metadata.get("recipe")
    if recipe not in RECIPE_NAMES:
        raise ValueError(
            f"{run.policy_path} names recipe {recipe!r} in its metadata; "
            f"expected one of {list(RECIPE_NAMES)}"
        )
    cfg = run.read_config()
    try:
        policy = build_policy(recipe, cfg, saved.state)
    except (KeyError, RuntimeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"{run.policy_path} does not fit the {recipe} policy described by "
            f"{run.config_path}: {str(exc)[:300]}"
        ) from exc
    step = int(saved.metadata.get("step", 0))
    return SavedPolicy(recipe, cfg, policy, step, saved.metadata.get("complete") == "true")


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
