"""Fans and standard draws that know about groups: what every initialiser of :mod:`fixup.init` starts from.

He et al. (2015) and Glorot & Bengio (2010) give a layer's std from its fans. torch's fan helper counts a
grouped or depthwise convolution's fan-out over every output channel; :func:`fans` counts it per group.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..branch import WeightSlice
from ..method import FAN_MODES

__all__ = ["BASE_INITS", "FAN_MODES", "base_std", "fans", "groups_of", "he_std", "orthonormal_", "xavier_std"]

# The standard initialisation rule 2 starts from before depth scaling: He et al. (2015) for ReLU
# networks (the paper's ResNets), Glorot & Bengio (2010) "Xavier" for the Transformer, whose
# attention projections are not followed by a ReLU (the authors' fairseq code, Fixup section 5).
BASE_INITS = ("he", "xavier")


def groups_of(layer: object) -> int:
    """The number of groups of a weight layer: a grouped or depthwise convolution's ``groups``, else 1."""
    return 1 if isinstance(layer, WeightSlice) else int(getattr(layer, "groups", 1))


def fans(weight: torch.Tensor, groups: int = 1) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of one unit of a weight layer, per group.

    A convolution with ``groups`` splits its channels into independent groups: an output unit reads
    ``in_channels / groups x k^2`` inputs (the weight's second dimension already says so), and an input unit
    feeds ``out_channels / groups x k^2`` outputs. torch's ``_calculate_fan_in_and_fan_out`` counts the
    latter as ``out_channels x k^2`` whatever the groups, which draws a depthwise layer ``sqrt(groups)`` too
    small from its fan-out.
    """
    if int(groups) != groups or groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"groups must be a positive divisor of the weight's {weight.shape[0]} output units, "
                         f"got {groups!r}")
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(weight)
    return fan_in, fan_out // int(groups)


def he_std(weight: torch.Tensor, mode: str = "fan_out", groups: int = 1) -> float:
    """He et al. (2015) normal std ``sqrt(2 / fan)`` for a ReLU network, with the per-group fan of :func:`fans`.

    ``fan_out`` (output channels x kernel size / groups) is the default: it is what the Fixup authors'
    reference code and torchvision's ResNet use; He et al. (section 2.2) show that either fan keeps
    the signal bounded through depth.
    """
    if mode not in FAN_MODES:
        raise ValueError(f"mode must be one of {FAN_MODES}, got {mode!r}")
    fan_in, fan_out = fans(weight, groups)
    return math.sqrt(2.0 / (fan_in if mode == "fan_in" else fan_out))


def xavier_std(weight: torch.Tensor, groups: int = 1) -> float:
    """Glorot & Bengio (2010) normal std ``sqrt(2 / (fan_in + fan_out))``, with the per-group fans."""
    fan_in, fan_out = fans(weight, groups)
    return math.sqrt(2.0 / (fan_in + fan_out))


def base_std(weight: torch.Tensor, base: str = "he", mode: str = "fan_out", groups: int = 1) -> float:
    """The std of the standard initialisation ``base`` ("he" with fan ``mode``, or "xavier")."""
    if base not in BASE_INITS:
        raise ValueError(f"base must be one of {BASE_INITS}, got {base!r}")
    return he_std(weight, mode, groups) if base == "he" else xavier_std(weight, groups)


def orthonormal_(weight: torch.Tensor, groups: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Saxe et al. (2014) orthonormal rows (or columns), drawn group by group for a grouped convolution.

    Each group of ``out_channels / groups`` output units reads only its own inputs, so each group's
    ``(out / groups) x (in / groups * k^2)`` matrix is made orthonormal on its own; a depthwise kernel is one
    unit vector per channel. Returns ``weight``.
    """
    fans(weight, groups)  # checks groups
    with torch.no_grad():
        for block in weight.chunk(int(groups), dim=0):
            nn.init.orthogonal_(block, generator=generator)
    return weight
