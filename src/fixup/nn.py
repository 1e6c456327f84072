"""Scalar parameters of the Fixup parameterisation and of the gated methods, and the checked residual sum.

Fixup's rule 3 (Zhang, Dauphin & Ma, ICLR 2019, section 3) adds to every residual branch one
scalar multiplier, initially 1, and scalar biases, initially 0, before each convolution, linear
layer and element-wise activation. These are single numbers shared by the whole tensor, not
per-channel parameters as in a normalisation layer's affine transform. SkipInit (De & Smith 2020)
and ReZero (Bachlechner et al. 2020) multiply each branch by a :class:`Gate`: the same scalar
multiplier, starting at 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["Bias", "Gate", "Scale", "check_residual_shapes", "residual_add"]


class Bias(nn.Module):
    """A learnable scalar shift ``x + b``; ``b`` starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bias


class Scale(nn.Module):
    """A learnable scalar multiplier ``s * x``; ``s`` starts at 1."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class Gate(Scale):
    """A learnable scalar gate ``alpha * x`` on a residual branch; ``alpha`` starts at 0, so the block starts as
    its shortcut (SkipInit's gain, ReZero's alpha). A :class:`Scale` in every other respect (lean forward,
    folding), with its own optimiser group (:func:`fixup.param_groups`)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.scale.zero_()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.zero_()


def check_residual_shapes(shortcut: Tensor, branch: Tensor | torch.Size, block: str = "residual block") -> None:
    """Raise unless ``shortcut`` and ``branch`` (a tensor or its shape) have the same full shape."""
    branch_shape = branch.shape if isinstance(branch, Tensor) else torch.Size(branch)
    if shortcut.shape != branch_shape:
        raise ValueError(
            f"{block}: residual branch output has shape {tuple(branch_shape)} but the shortcut has "
            f"shape {tuple(shortcut.shape)}; they must match exactly. Give the shortcut a projection "
            "(or subsampling) to the branch's shape, or correct the branch's width and stride."
        )


def residual_add(shortcut: Tensor, branch: Tensor, block: str = "residual block") -> Tensor:
    """Return ``shortcut + branch`` after checking that both have the same full shape.

    A plain ``+`` would broadcast a branch of the wrong width or size into a result that looks
    valid; this names the block and both shapes instead.
    """
    check_residual_shapes(shortcut, branch, block)
    return shortcut + branch
