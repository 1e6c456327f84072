"""A test helper: parameters moved off their initial values, so zero biases and unit scales prove nothing."""

from __future__ import annotations

import torch
from torch import nn


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` with N(0, 0.2^2) added to every parameter, in place (drawn from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model
