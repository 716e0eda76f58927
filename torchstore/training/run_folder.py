"""The folder one training run writes, and reads back: config, metrics, curves, policy.

A run folder holds

- ``config.yaml``: the run's resolved config (every default and override applied);
- ``metrics.csv``: one row per logged step (:class:`~torchstore.training.MetricsLog`);
- ``loss.png``: the curves of ``metrics.csv``;
- ``policy.safetensors``: the trained policy with its normaliser
  (:func:`~torchstore.training.save_policy_file`);
- ``last.ckpt``: the Lightning checkpoint a resumed run continues from (written by
  :class:`~torchstore.lightning.progress.LastCheckpoint`; a pickle, so it stays with the
  run: ``torchstore project push`` leaves it out);
- ``*.log``: what the run printed, when its launcher (Hydra, say) keeps a log file.

The names are fixed so any tool can find a run's parts: ``torchstore project push``
bundles ``config.yaml`` and ``policy.safetensors``, a reader plots ``metrics.csv``.
The config is written and read with OmegaConf (``hydra-core``, the ``train`` extra),
imported only when a config is.

Examples:
    >>> run = RunFolder("outputs/bc/2026-01-01_12-00-00")  # doctest: +SKIP
    >>> run.read_config().datamodule.action_horizon  # doctest: +SKIP
    16
    >>> run.read_metrics()[-1]["train/loss"]  # doctest: +SKIP
    0.0123
    >>> run.read_policy().metadata["step"]  # doctest: +SKIP
    '2000'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchstore.errors import ArgumentTypeError
from torchstore.training.metrics import METRICS_FILE, PLOT_FILE, MetricsLog, read_metrics
from torchstore.training.policy_file import PolicyFile, read_policy_file, save_policy_file

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from torchstore.lightning.normalizer import Normalizer

__all__ = ["CHECKPOINT_FILE", "CONFIG_FILE", "POLICY_FILE", "RUN_FILES", "RunFolder"]

CONFIG_FILE = "config.yaml"
POLICY_FILE = "policy.safetensors"
CHECKPOINT_FILE = "last.ckpt"
#: the files a run writes into its folder, in the order :meth:`RunFolder.describe` names them
RUN_FILES = (CONFIG_FILE, METRICS_FILE, PLOT_FILE, POLICY_FILE, CHECKPOINT_FILE)


@dataclass(frozen=True, slots=True)
class RunFolder:
    """A training run's folder: where each of its files goes, and how to read them back.

    Args:
        path: the folder (created by :meth:`write_config` and :meth:`metrics_log`).
    """

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def plot_path(self) -> Path:
        return self.path / PLOT_FILE

    @property
    def policy_path(self) -> Path:
        return self.path / POLICY_FILE

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_FILE

    def run_files(self) -> list[str]:
        """The run files (:data:`RUN_FILES`) the folder holds: empty for a fresh folder."""
        return [name for name in RUN_FILES if (self.path / name).is_file()]

    # ------------------------------------------------------------------ writing
    def write_config(self, config: DictConfig | Mapping[str, Any]) -> Path:
        """Write ``config`` as ``config.yaml``, interpolations resolved (again, if rerun).

        Raises:
            ArgumentTypeError: ``config`` is not a mapping (or an OmegaConf ``DictConfig``).
        """
        from omegaconf import DictConfig, OmegaConf

        if not isinstance(config, (DictConfig, Mapping)):
            raise ArgumentTypeError(
                f"config ({type(config).__name__}) must be a DictConfig or a mapping"
            )
        if not isinstance(config, DictConfig):
            config = OmegaConf.create(dict(config))
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_name(CONFIG_FILE + ".tmp")
        tmp.write_text(OmegaConf.to_yaml(config, resolve=True))
        os.replace(tmp, self.config_path)
        return self.config_path

    def metrics_log(self, *, resume_at: int | None = None) -> MetricsLog:
        """A :class:`MetricsLog` writing this folder's ``metrics.csv`` and ``loss.png``:
        fresh, or with ``resume_at`` the log continued after step ``resume_at``
        (:meth:`MetricsLog.resume`)."""
        if resume_at is None:
            return MetricsLog(self.path)
        return MetricsLog.resume(self.path, resume_at)

    def save_policy(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        normalizer: Normalizer | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``policy.safetensors`` (:func:`~torchstore.training.save_policy_file`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return save_policy_file(self.policy_path, tensors, normalizer=normalizer, metadata=metadata)

    # ------------------------------------------------------------------ reading
    def read_config(self) -> DictConfig:
        """``config.yaml`` as an OmegaConf ``DictConfig``.

        Raises:
            FileNotFoundError: the folder has no ``config.yaml``.
        """
        from omegaconf import OmegaConf

        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.path} has no {CONFIG_FILE}")
        return OmegaConf.load(self.config_path)

    def read_metrics(self) -> list[dict[str, float]]:
        """The rows of ``metrics.csv`` (:func:`~torchstore.training.read_metrics`)."""
        return read_metrics(self.metrics_path)

    def read_policy(self) -> PolicyFile:
        """``policy.safetensors``: tensors, normaliser and metadata
        (:func:`~torchstore.training.read_policy_file`)."""
        return read_policy_file(self.policy_path)

    def describe(self, *, rows: int | None = None) -> str:
        """One line naming the folder and the run files it holds, in a fixed order:
        ``<path>: config.yaml, metrics.csv (12 rows), loss.png, policy.safetensors,
        last.ckpt, bc.log``.

        ``rows`` is the metrics row count when the caller knows it (a :class:`MetricsLog`'s
        ``len``); otherwise the file is read to count them.
        """
        files = []
        if self.config_path.is_file():
            files.append(CONFIG_FILE)
        if self.metrics_path.is_file():
            count = len(self.read_metrics()) if rows is None else rows
            files.append(f"{METRICS_FILE} ({count} rows)")
        files += [n for n in (PLOT_FILE, POLICY_FILE, CHECKPOINT_FILE) if (self.path / n).is_file()]
        files += sorted(p.name for p in self.path.glob("*.log") if p.is_file())
        return f"{self.path}: {', '.join(files) or 'no run files'}"
