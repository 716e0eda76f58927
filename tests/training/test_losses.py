"""masked_mse on DemonstrationDataModule's padded chunks: padding never counts."""

from __future__ import annotations

import pytest
import torch

from torchstore.errors import ArgumentError
from torchstore.training import masked_mse


def test_padded_steps_do_not_count():
    pred = torch.zeros(2, 3, 2)
    target = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]], [[2.0, 2.0], [0, 0], [0, 0]]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # kept steps' errors: 1, 9, 4 -> mean 14 / 3; the 100s are padding
    assert masked_mse(pred, target, mask).item() == pytest.approx(14 / 3)


def test_gradients_reach_only_kept_steps():
    pred = torch.zeros(1, 2, 1, requires_grad=True)
    masked_mse(pred, torch.ones(1, 2, 1), torch.tensor([[True, False]])).backward()
    assert pred.grad[0, :, 0].tolist() == [-2.0, 0.0]


def test_a_fully_padded_batch_gives_zero_not_nan():
    loss = masked_mse(torch.zeros(1, 2, 1), torch.ones(1, 2, 1), torch.zeros(1, 2, dtype=bool))
    assert loss.item() == 0.0


def test_shapes_that_do_not_line_up_are_refused():
    said = r"mask \[B, T\]; got pred \(2, 3, 1\), .* mask \(2, 4\)"
    with pytest.raises(ArgumentError, match=said):
        masked_mse(torch.zeros(2, 3, 1), torch.zeros(2, 3, 1), torch.ones(2, 4, dtype=bool))
    with pytest.raises(ArgumentError, match=r"target \(2, 3, 2\)"):
        masked_mse(torch.zeros(2, 3, 1), torch.zeros(2, 3, 2), torch.ones(2, 3, dtype=bool))
