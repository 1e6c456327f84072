"""SkipInit (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep
Networks", NeurIPS 2020): no normalisation; each residual branch ends in a learnable scalar gain that starts
at 0, so every block starts as its shortcut without scaling any weight by depth.

The paper's reason: BatchNorm shrinks each residual branch by about the square root of the
number of blocks before it, so a normalised deep network starts close to the identity; SkipInit gets there
with one scalar per branch.

``skipinit`` draws as the authors' released SkipInit ResNet (deepmind-research, ``nfnets/skipinit_resnet.py``):
every weight layer from haiku's default, a normal truncated at 2 std with std 1/sqrt(fan_in), and the
classifier at 0; its recipe leaves the gains and biases undecayed (``Method.decay_gains``). ``skipinit_he`` keeps
the He baseline's draw (fan-out) and PyTorch's default classifier: ReZero's network. The differences from the
authors' code are listed in docs/methods.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..method import Method
from ..report import GateReport
from ._gates import gate_init_

__all__ = ["initialise_"]

SUMMARY = "no normalisation; each residual branch times a scalar gain that starts at 0; no depth scaling"
SUMMARY_TRUNCATED = SUMMARY + "; the authors' draw (truncated normal from the fan-in, classifier at 0)"


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> GateReport:
    """Draw the weights by the method's ``draw`` (the authors' truncated normal from the fan-in with the classifier
    at 0 for ``skipinit``; He, or the model's ``init_base``, for ``skipinit_he``), unscaled, and every gain at 0."""
    summary = SUMMARY_TRUNCATED if method.draw == "truncated_fan_in" else SUMMARY
    return gate_init_(model, method, generator=generator, base=base, summary=summary)
