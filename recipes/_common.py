"""What every recipe shares: paths, the sampler's ERE switch, the run folder and saved policies.

Recipes import this as ``from _common import ...``: running ``python recipes/bc.py`` puts
``recipes/`` first on ``sys.path``.

A run (:func:`recipe_run`) writes a :class:`torchstore.training.RunFolder` into its Hydra
run folder, ``outputs/<recipe>/<time>/``:

- ``config.yaml``: the resolved config of the run (every default and override applied);
- ``metrics.csv``: one row per logged step, written through as it is logged;
- ``loss.png``: the curves of ``metrics.csv``, drawn when the run ends, interrupted or not;
- ``policy.safetensors``: the trained policy's tensors (:func:`load_policy` rebuilds it);
- ``last.ckpt``: the Lightning recipes' (bc, bc_robomimic, offline_rl) checkpoint, written
  every ``checkpoint_every`` steps, at the end and at an interrupt;
- ``<recipe>.log``: what the run printed, with timestamps (and a failed run's traceback).

Ctrl-C (SIGINT) or SIGTERM ends a run cleanly: the files above are completed (the policy
as trained so far), one line says where they are, and the process exits with 130 (143
for SIGTERM). ``resume=<run folder>`` continues a Lightning recipe's run from its
``last.ckpt``, in that folder, with the run's own config (``key=value`` overrides on top,
``trainer.max_steps=4000`` say): the step count goes on and ``metrics.csv`` keeps its rows.
A folder that already holds a run is never written over unless ``overwrite=true`` says so;
a run that cannot start (such a folder, a ``store.path`` that is not there) says why in
one line and leaves no folder behind (:class:`RunFolderCheck`, a Hydra callback, checks
before Hydra makes the folder). What is left here is the recipes' own: Hydra config
handling, the signal frame of a script, which recipe rebuilds which policy, and how the
reach recipes (bc, offline_rl) evaluate theirs: the task, the baselines, the table.
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
from hydra.experimental.callback import Callback as HydraCallback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from torchstore.errors import ArgumentError, ColumnError, ResidencyError, StoreFormatError
from torchstore.training import MetricsLog, RunFolder

if TYPE_CHECKING:
    from torchstore.lightning import Normalizer

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = Path(__file__).resolve().parent
DEFAULT_DEMO = REPO_ROOT / "data" / "reach_demo.h5"
#: Recipes whose runs save a policy :func:`load_policy` can rebuild.
RECIPE_NAMES = ("bc", "bc_camera", "bc_robomimic", "offline_rl", "sac", "distributed_sac")
#: Recipes trained by a Lightning ``Trainer``: they keep ``last.ckpt`` and take ``resume=``.
RESUMABLE = ("bc", "bc_camera", "bc_robomimic", "offline_rl")
#: training steps between two writes of ``last.ckpt`` when a config does not say
CHECKPOINT_EVERY = 500


def _run_folder(resume: str | None, fresh: str) -> str:
    """``hydra.run.dir``: the folder a resumed run continues in, else a fresh one."""
    return str(resume) if resume else fresh


OmegaConf.register_new_resolver("run_folder", _run_folder, replace=True)


class RunRefused(Exception):
    """A run that cannot start as asked: said in one line, before anything is written."""


#: what a run stops on in one ``error:`` line: an option its data does not allow
_OPTION_ERRORS = (ResidencyError, ArgumentError, ColumnError)


def refuse(message: str) -> None:
    """End the process with ``error: message`` on stderr and status 2 (no traceback).

    A ``SystemExit`` passes through Hydra's job runner, which reports any ``Exception``
    with a traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _overrides(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides=list(overrides))


def resumed_config(
    folder: str | os.PathLike, overrides: list[str], groups: Mapping[str, Any]
) -> DictConfig:
    """The config a ``resume=<folder>`` run trains with: the folder's ``config.yaml``, with
    the command line's ``key=value`` overrides on top (``resume=``, ``overwrite=`` and
    ``hydra.*`` excepted).

    Raises:
        RunRefused: the folder has no ``config.yaml``, or an override picks a config group
            (``datamodule=offline``): a resumed run keeps its groups.
    """
    run = RunFolder(folder)
    if not run.config_path.is_file():
        raise RunRefused(f"resume={folder}: {run.config_path.name} is not there")
    cfg = run.read_config()
    for override in _overrides(overrides):
        key = override.key_or_group
        if key in ("resume", "overwrite") or key.startswith("hydra.") or key == "hydra":
            continue
        if key in groups:
            raise RunRefused(
                f"resume={folder} keeps the run's config groups; {override.input_line} picks "
                "another (start a new run for it)"
            )
        if override.is_delete():
            with open_dict(cfg):
                OmegaConf.update(cfg, key, None, merge=False)
            continue
        value = override.value()
        if isinstance(value, (list, dict)):
            value = OmegaConf.create(value)
        OmegaConf.update(cfg, key, value, merge=False, force_add=override.is_add())
    with open_dict(cfg):
        cfg.resume = str(Path(folder).resolve())
    return cfg


def run_config(cfg: DictConfig) -> DictConfig:
    """The config a recipe trains with: ``cfg`` as Hydra composed it, or for a
    ``resume=<folder>`` run the run's own config with this command's overrides
    (:func:`resumed_config`)."""
    if not cfg.get("resume"):
        return cfg
    hydra = HydraConfig.get()
    try:
        return resumed_config(
            hydra.runtime.output_dir, list(hydra.overrides.task), hydra.runtime.choices
        )
    except RunRefused as exc:
        refuse(str(exc))


def prepared_config(cfg: DictConfig) -> DictConfig:
    """:func:`run_config`, with the process set up from it: torch's CPU threads
    (``threads``) and every seed (``seed``, by Lightning's ``seed_everything``); the first
    line of a Lightning recipe's ``main``."""
    import lightning

    cfg = run_config(cfg)
    torch.set_num_threads(cfg.threads)
    lightning.seed_everything(cfg.seed, verbose=False)
    return cfg


def _run_files(folder: RunFolder, recipe: str) -> list[str]:
    """The files of a run ``folder`` holds: :data:`RUN_FILES` and the recipe's log."""
    log = f"{recipe}.log"
    return folder.run_files() + ([log] if (folder.path / log).is_file() else [])


def check_run_start(config: DictConfig, recipe: str) -> None:
    """What :class:`RunFolderCheck` checks before Hydra makes the run folder.

    - ``resume=<folder>``: the folder holds a ``last.ckpt`` its recipe wrote, short of
      the run's ``trainer.max_steps``;
    - otherwise the run folder holds no run, or ``overwrite=true`` says to replace it
      (its run files are removed, once every check has passed);
    - ``store.path``, when the recipe reads a store, names a file or folder that exists.

    Raises:
        RunRefused: naming what is wrong and what to do.
    """
    folder = RunFolder(Path(str(OmegaConf.select(config, "hydra.run.dir"))).expanduser())
    resume, overwrite = config.get("resume"), bool(config.get("overwrite", False))
    if resume and overwrite:
        raise RunRefused("resume= continues a run and overwrite=true replaces it: give one")
    held: list[str] = []
    if resume:
        config = _resumable(config, folder, recipe)
    else:
        held = _run_files(folder, recipe)
        if held and not overwrite:
            raise RunRefused(
                f"{folder.path} already holds a run ({', '.join(held)}): resume={folder.path} "
                "continues it (bc, bc_robomimic, offline_rl), overwrite=true replaces it; "
                "or give another hydra.run.dir"
            )
    _check_store(config, recipe)
    _check_columns(config, recipe)
    for name in held:
        (folder.path / name).unlink()


def _resumable(config: DictConfig, folder: RunFolder, recipe: str) -> DictConfig:
    """The config a ``resume=`` run would train with, once its checkpoint is found fit."""
    from torchstore.lightning.progress import read_checkpoint_state

    resume = config.resume
    if not folder.path.is_dir():
        raise RunRefused(f"resume={resume}: no such folder")
    try:
        step, state = read_checkpoint_state(folder.checkpoint_path)
    except FileNotFoundError:
        raise RunRefused(
            f"resume={resume}: no {folder.checkpoint_path.name} there (not the folder of "
            f"a {'/'.join(RESUMABLE)} run, or one stopped before its first checkpoint)"
        ) from None
    except StoreFormatError as exc:
        raise RunRefused(f"resume={resume}: {exc}") from None
    if state.get("recipe") != recipe:
        raise RunRefused(
            f"resume={resume}: its checkpoint is a {state.get('recipe')} run's, not {recipe}'s"
        )
    overrides = list(config.hydra.overrides.task)
    resumed = resumed_config(folder.path, overrides, config.hydra.runtime.choices)
    max_steps = OmegaConf.select(resumed, "trainer.max_steps", default=-1)
    if 0 <= max_steps <= step:
        raise RunRefused(
            f"resume={resume}: the run is at step {step} of trainer.max_steps={max_steps}; "
            "give a larger trainer.max_steps to train it on"
        )
    return resumed


def _check_store(config: DictConfig, recipe: str) -> None:
    store = config.get("store")
    if isinstance(store, DictConfig) and "path" in store.keys():  # `in store`: not if ???
        if OmegaConf.is_missing(store, "path"):
            raise RunRefused(f"{recipe} needs store.path=STORE (a store file or folder)")
        path = repo_path(store.path)
        if not path.exists() and path != DEFAULT_DEMO:
            raise RunRefused(f"store.path={store.path}: no such file or folder ({path})")


#: config options that name store columns, in the recipes that have them
COLUMN_OPTIONS = (
    "datamodule.obs_keys",
    "datamodule.action_keys",
    "obs.rgb",
    "obs.low_dim",
    "action_keys",
)


def _check_columns(config: DictConfig, recipe: str) -> None:
    """Every column the config names is one of the store's, and ``bc``'s observations are
    state vectors: said in one line before the run starts, not as a KeyError inside it."""
    named = {opt: OmegaConf.select(config, opt, default=None) for opt in COLUMN_OPTIONS}
    named = {opt: [str(k) for k in keys] for opt, keys in named.items() if keys is not None}
    store_cfg = config.get("store")
    if (
        not named
        or not isinstance(store_cfg, DictConfig)
        or "path" not in store_cfg.keys()
        or OmegaConf.is_missing(store_cfg, "path")
    ):
        return
    path = repo_path(store_cfg.path)
    if not path.is_file():
        return  # a folder of shards, or the default demo before it is rebuilt
    from torchstore.data.store.store import TrajectoryStore

    try:
        with TrajectoryStore(path) as store:
            columns = {spec.name: spec for spec in store.columns}
    except Exception:  # a store that does not open says so when the run opens it
        return
    for option, keys in named.items():
        for key in keys:
            if key not in columns:
                raise RunRefused(
                    f"{option}: {store_cfg.path} has no column {key!r}; its columns are "
                    f"{sorted(columns)}"
                )
    if recipe == "bc":
        for key in named.get("datamodule.obs_keys", []):
            if len(columns[key].shape) != 1:
                raise RunRefused(
                    f"datamodule.obs_keys: {key!r} is {columns[key].describe()}, not a state "
                    "vector; bc trains an MLP on state vectors, recipes/bc_camera.py trains "
                    f"from cameras: python recipes/bc_camera.py 'obs.rgb=[{key}]'"
                )


class RunFolderCheck(HydraCallback):
    """Hydra callback (``hydra.callbacks`` in the recipe configs): :func:`check_run_start`
    before Hydra makes the run folder, so a run that cannot start says why in one line
    (``error: ...``, status 2) and leaves no folder behind."""

    def on_run_start(self, config: DictConfig, config_name: str | None = None, **kwargs) -> None:
        try:
            check_run_start(config, config_name or "")
        except RunRefused as exc:
            refuse(str(exc))


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

        print(f"{path} is missing: regenerating it (torchstore demo {path} --task reach)")
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
    #: training steps between two writes of ``last.ckpt``; None: no checkpoint (not a
    #: Lightning recipe)
    checkpoint_every: int | None = None
    #: the checkpoint a resumed run continues from (``ckpt_path`` of ``Trainer.fit``)
    resume_from: Path | None = None
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
        from torchstore.lightning.progress import LastCheckpoint

        progress, kwargs["enable_progress_bar"] = plain_progress_off_a_terminal(
            self.log, enabled=trainer_cfg.get("enable_progress_bar", True)
        )
        callbacks = [MetricsRecorder(self.metrics.log), self.lightning_callback(), *progress]
        if self.checkpoint_every is not None:
            callbacks.append(
                LastCheckpoint(
                    self.folder.checkpoint_path,
                    self.checkpoint_every,
                    on=(RunInterrupted,),
                    state={"recipe": self.name},
                )
            )
        return instantiate(
            trainer_cfg, callbacks=callbacks, default_root_dir=str(self.folder.path), **kwargs
        )

    def fit(self, trainer, model, datamodule) -> None:
        """``trainer.fit`` with signals taken at step ends, from ``last.ckpt`` when the run
        resumes (the step count, optimiser, scheduler and loops go on from it)."""
        with self.interrupts_at_checks():
            trainer.fit(
                model,
                datamodule=datamodule,
                ckpt_path=self.resume_from,
                # the run's own checkpoint: tensors and plain values, no pickled objects
                weights_only=True if self.resume_from is not None else None,
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


def _start(cfg: DictConfig, name: str, folder: RunFolder, log: logging.Logger) -> Run:
    """The run's :class:`Run`, its ``config.yaml`` written: fresh, or for ``cfg.resume``
    with ``metrics.csv`` continued from ``last.ckpt``'s step."""
    resume_from, step = None, 0
    if cfg.get("resume"):
        from torchstore.lightning.progress import read_checkpoint_state

        resume_from = folder.checkpoint_path
        step, _ = read_checkpoint_state(resume_from)
    folder.write_config(cfg)
    metrics = folder.metrics_log(resume_at=step if resume_from is not None else None)
    run = Run(name, folder, metrics, log, step=step, resume_from=resume_from)
    if name in RESUMABLE:
        run.checkpoint_every = int(cfg.get("checkpoint_every", CHECKPOINT_EVERY))
    log.info(f"outputs: {folder.path} (resolved config: {folder.config_path})")
    if resume_from is not None:
        log.info(f"resuming from {resume_from.name} at step {step} ({len(metrics)} rows kept)")
    return run


def _into_log_files(log: logging.Logger, message: str, exc_info) -> None:
    """``message`` with a traceback into the root logger's files only (the run's
    ``<recipe>.log``), not its console."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, exc_info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


@contextlib.contextmanager
def recipe_run(cfg: DictConfig, name: str) -> Iterator[Run]:
    """The frame of a recipe's ``main``: outputs, config, signals, and what is written at the end.

    Writes ``config.yaml`` (resolved) at once and says where the outputs go. On leaving,
    normally or by SIGINT / SIGTERM, completes ``metrics.csv``, draws ``loss.png`` and saves
    the policy (:attr:`Run.policy_tensors`). An interrupted run prints one line naming its
    outputs and exits with 128 + the signal number (130 for Ctrl-C), without a traceback.
    A failed run's traceback goes into its log file as well. With ``cfg.resume`` (the
    config of :func:`run_config`), ``metrics.csv`` is continued from ``last.ckpt``'s step
    and :meth:`Run.fit` trains on from it.
    """
    if name not in RECIPE_NAMES:
        raise ValueError(f"unknown recipe {name!r}; recipes: {list(RECIPE_NAMES)}")
    folder = RunFolder(output_dir().resolve())
    filter_third_party_warnings()
    _quiet_lightning()
    log = logging.getLogger(name)
    if not logging.getLogger().handlers:  # not under Hydra's logging (a test calling main)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    run = _start(cfg, name, folder, log)
    previous = {s: signal.signal(s, run._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield run
        run.check()  # a signal that a callback swallowed still ends the run as interrupted
    except Exception as exc:
        # an option the data does not allow (a budget too small for an episode, a resize
        # naming no camera; raised by the data module, or inside Hydra's instantiate): one
        # line that says which, the traceback in the run's log only
        refused = exc if isinstance(exc, _OPTION_ERRORS) else exc.__cause__
        _into_log_files(log, "the run failed:", sys.exc_info())
        run.metrics.close()
        if isinstance(refused, _OPTION_ERRORS):
            refuse(f"{refused} (the traceback is in {folder.path / (name + '.log')})")
        raise  # Hydra prints the traceback on the console only: the run's log keeps it too
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


# --------------------------------------------------------------------------- the reach task
def reach_task(store: Any) -> Any:
    """The :class:`~torchstore.tasks.ReachTask` a store's demonstrations were recorded in
    (its manifest's ``task_config``)."""
    from torchstore.tasks import ReachTask

    return ReachTask(**store.manifest.metadata["task_config"])


def reach_baselines(store: Any, seed: int) -> dict[str, Any]:
    """What a learned policy is compared with: the scripted expert that recorded the store
    (its manifest's gains and noise), and a uniformly random policy."""
    from torchstore.tasks import RandomPolicy, ReachExpert

    expert = store.manifest.metadata["expert"]
    return {
        "expert": ReachExpert(**{k: expert[k] for k in ("kp", "kd", "noise")}, seed=seed),
        "random": RandomPolicy(store.column("action").shape[0], seed=seed),
    }


def evaluate_policies(
    run: Run, cfg: DictConfig, task: Any, policies: Mapping[str, Any], step: int
) -> dict[str, dict[str, float]]:
    """Roll each of ``policies`` out in ``task`` as ``cfg.eval`` says, log its success rate
    into ``metrics.csv`` at ``step``, and print the table of results; returns the results."""
    evaluate = instantiate(cfg.eval)
    run.log.info(f"evaluating over {cfg.eval.episodes} episodes ...")
    results = {name: evaluate(task, policy) for name, policy in policies.items()}
    for name, result in results.items():
        run.metrics.log(step, {f"eval/{name}_success_rate": result["success_rate"]})
    run.log.info(f"\n{RESULT_HEADER}")
    for name, result in results.items():
        run.log.info(result_line(name, result))
    return results


def rollout_row(cfg: DictConfig, name: str, policy: Any, episodes: int | None = None) -> str:
    """A saved policy rolled out exactly as its run evaluated it (same task, reset seeds):
    the table's header and the policy's row, under ``name``."""
    store = open_demo_store(cfg.store)
    evaluate = instantiate(cfg.eval, **({"episodes": episodes} if episodes else {}))
    return RESULT_HEADER + "\n" + result_line(name, evaluate(reach_task(store), policy))
