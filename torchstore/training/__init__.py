"""What a training run leaves behind, as files other tools can read back.

- :class:`RunFolder`: a run's folder (``config.yaml``, ``metrics.csv``, ``loss.png``,
  ``policy.safetensors``), written and read back;
- :class:`MetricsLog` / :func:`read_metrics`: a metrics CSV that survives a killed
  process, and its curves; :func:`describe_validation`: a summary line's validation loss;
- :func:`save_policy_file` / :func:`read_policy_file`: a policy's tensors with the
  normaliser it was trained behind, as safetensors;
- :func:`masked_mse`: the chunk loss over ``DemonstrationDataModule``'s padded chunks.

The recipes (``recipes/*.py``) write their runs with these. Lightning callbacks that feed
a run (metrics, plain progress lines) are in :mod:`torchstore.lightning.progress`.
Needs the ``train`` extra (safetensors, hydra-core's OmegaConf, matplotlib), each
imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.training.losses import masked_mse
    from torchstore.training.metrics import MetricsLog, describe_validation, read_metrics
    from torchstore.training.policy_file import PolicyFile, read_policy_file, save_policy_file
    from torchstore.training.run_folder import RunFolder

_EXPORTS = {
    "masked_mse": "torchstore.training.losses",
    "MetricsLog": "torchstore.training.metrics",
    "read_metrics": "torchstore.training.metrics",
    "describe_validation": "torchstore.training.metrics",
    "PolicyFile": "torchstore.training.policy_file",
    "read_policy_file": "torchstore.training.policy_file",
    "save_policy_file": "torchstore.training.policy_file",
    "RunFolder": "torchstore.training.run_folder",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "RunFolder",
    "MetricsLog",
    "read_metrics",
    "describe_validation",
    "PolicyFile",
    "read_policy_file",
    "save_policy_file",
    "masked_mse",
]
