"""Losses over the batches torchstore's DataModules produce.

``DemonstrationDataModule`` pads an action chunk that runs past its episode's end and
marks the padded steps ``False`` in ``batch["action_mask"]`` (``[B, T_a]``); a chunk loss
must leave them out, or the policy learns to repeat the last action after every episode.

Examples:
    >>> pred = torch.zeros(2, 3, 1); target = torch.ones(2, 3, 1)
    >>> mask = torch.tensor([[True, True, False], [True, False, False]])
    >>> masked_mse(pred, target, mask).item()
    1.0
"""

from __future__ import annotations

import torch

from torchstore.errors import ArgumentError

__all__ = ["masked_mse"]


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the steps ``mask`` keeps, averaged over the action dim.

    Args:
        pred: predicted action chunks ``[B, T_a, A]``.
        target: the batch's action chunks, same shape.
        mask: ``[B, T_a]``, true where the step is real (``batch["action_mask"]``).

    Returns:
        A scalar: the mean over kept steps of each step's mean squared error; ``0`` when
        the mask keeps no step.

    Raises:
        ArgumentError: the shapes do not line up.
    """
    if pred.shape != target.shape or tuple(mask.shape) != tuple(pred.shape[:-1]):
        raise ArgumentError(
            f"masked_mse needs pred and target of one shape [B, T, A] and mask [B, T]; got "
            f"pred {tuple(pred.shape)}, target {tuple(target.shape)}, mask {tuple(mask.shape)}"
        )
    err = ((pred - target) ** 2).mean(-1)  # [B, T_a]
    kept = mask.to(err.dtype)
    return (err * kept).sum() / kept.sum().clamp(min=1.0)
