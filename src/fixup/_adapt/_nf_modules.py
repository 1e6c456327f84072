"""What an NF-adapted model carries (``fixup.adapt(..., method="nf_resnet")``): constant factors on the user's own
modules (1/beta on what reads a block's input, gamma on an activation's output or on what reads it) and each
branch's ``alpha * g`` after its last layer. They are child modules applied by module-level hooks, as Fixup's
scalars (:mod:`fixup._adapt._modules`), so the model survives ``copy.deepcopy`` and ``torch.save``; an input factor
uses the same hook as Fixup's biases (:func:`fixup._adapt._modules.bias_inputs`), so that
:func:`fixup.private.prepare` moves it around its layer as it does those.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..nn import Gate

__all__ = ["NFBranchOut", "NFFactor", "gamma_output"]


class NFFactor(nn.Module):
    """``x * factor``, a constant (no parameter): 1/beta, gamma, or their product where one input takes both."""

    def __init__(self, factor: float, what: str) -> None:
        super().__init__()
        self.factor = float(factor)
        self.what = what  # e.g. "1/beta", "gamma (ReLU)"

    def forward(self, x: Tensor) -> Tensor:
        return x * self.factor

    def extra_repr(self) -> str:
        return f"{self.factor:.6g}: {self.what}"


class NFBranchOut(nn.Module):
    """The end of an NF branch: ``alpha * g * F`` with ``g`` the zero-started skip gain (``nf_resnet``, a
    :class:`fixup.nn.Gate`, learnt in :func:`fixup.param_groups`' ``gates`` group) or without one
    (``nf_resnet_nozero``). Attached as the end layer's ``fixup_scale``, so it runs where Fixup's multiplier runs."""

    def __init__(self, alpha: float, gated: bool, after: float = 1.0) -> None:
        super().__init__()
        self.alpha = float(alpha)
        self.after = float(after)  # the gamma of a homogeneous activation after the sum, moved onto its operands
        self.gain = Gate() if gated else None

    def forward(self, x: Tensor) -> Tensor:
        x = x * (self.alpha * self.after)
        return x if self.gain is None else self.gain(x)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}" + (f", times {self.after:.6g} (gamma after the sum)" if self.after != 1 else "")


def gamma_output(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
    """Forward hook: multiply an activation's output by its gamma (``module.nf_gamma``)."""
    return module.nf_gamma(out)
