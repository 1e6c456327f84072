"""ReZero (Bachlechner, Majumder, Mao, Cottrell & McAuley, "ReZero is All You Need: Fast Convergence at Large
Depth", 2020): ``x_{i+1} = x_i + alpha_i F(x_i)`` with ``alpha_i = 0`` at the start, for each residual branch,
and normalisation removed (LayerNorm in the Transformer, BatchNorm in convolutional networks).

At initialisation the input-output Jacobian is the identity (the paper's dynamical-isometry argument); the
gates then grow during the first steps. Our deviations from the paper are listed in docs/methods.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..method import Method
from ..report import GateReport
from ._gates import gate_init_

__all__ = ["initialise_"]

SUMMARY = "x + alpha * F(x) with alpha = 0 per residual branch; normalisation removed"


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> GateReport:
    """Draw the weights by the standard rule (He, or the model's ``init_base``), unscaled, and every alpha at 0."""
    return gate_init_(model, method, generator=generator, base=base, summary=SUMMARY)
