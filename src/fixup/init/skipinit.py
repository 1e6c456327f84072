"""SkipInit (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep
Networks", NeurIPS 2020): no normalisation; each residual branch ends in a learnable scalar gain that starts
at 0, so every block starts as its shortcut without scaling any weight by depth.

The paper's reason: BatchNorm shrinks each residual branch by about the square root of the
number of blocks before it, so a normalised deep network starts close to the identity; SkipInit gets there
with one scalar per branch. Our deviations from the paper are listed in docs/methods.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..method import Method
from ..report import GateReport
from ._gates import gate_init_

__all__ = ["initialise_"]

SUMMARY = "no normalisation; each residual branch times a scalar gain that starts at 0; no depth scaling"


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> GateReport:
    """Draw the weights by the standard rule (He, or the model's ``init_base``), unscaled, and every gain at 0."""
    return gate_init_(model, method, generator=generator, base=base, summary=SUMMARY)
