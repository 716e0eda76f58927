"""What every recipe shares: repo-relative paths, the sampler's ERE switch, metrics files.

Recipes import this as ``from _common import ...``: running ``python recipes/bc.py`` puts
``recipes/`` first on ``sys.path``.
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEMO = REPO_ROOT / "data" / "reach_demo.h5"


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


class MetricsLog:
    """``metrics.csv`` (a ``step`` column plus one per metric) and ``loss.png`` in a folder.

    Rows may carry different metrics; the file is rewritten with the union of columns on
    every ``flush`` (cheap at recipe sizes), so it is complete even if a run is killed.
    """

    def __init__(self, folder: str | os.PathLike, *, flush_every: int = 50):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.folder / "metrics.csv"
        self.png_path = self.folder / "loss.png"
        self._rows: list[dict[str, float]] = []
        self._keys: list[str] = ["step", "time_s"]
        self._flush_every = flush_every
        self._start = time.perf_counter()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row: dict[str, float] = {
            "step": int(step),
            "time_s": round(time.perf_counter() - self._start, 3),
        }
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().float().mean().item()
            value = float(value)
            if math.isfinite(value):
                row[key] = value
                if key not in self._keys:
                    self._keys.append(key)
        self._rows.append(row)
        if len(self._rows) % self._flush_every == 0:
            self.flush()

    def flush(self) -> None:
        with open(self.csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self._keys, restval="")
            writer.writeheader()
            writer.writerows(self._rows)

    def close(self) -> None:
        """Write the CSV and the loss-curve PNG."""
        from torchstore.viz import plot_metrics

        self.flush()
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


def print_config(cfg: DictConfig) -> None:
    print(OmegaConf.to_yaml(cfg, resolve=True))
