"""What an adapted model carries: Fixup's scalars attached to the user's own modules, and its declarations.

The adapted model keeps its class, its methods and the ``state_dict`` keys of everything that is not a
normalisation. Fixup's scalars are child modules of the layers they act on (``conv1.fixup_bias``,
``conv3.fixup_scale``), applied by forward hooks defined here at module level (so the model survives
``copy.deepcopy`` and ``torch.save``). The blocks declare their branches, and the root its classifier,
through callables set as instance attributes (``block.residual_branches()``, ``model.classifier_layers()``),
the protocol of :mod:`fixup.branch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..branch import Branch, WeightSlice
from ..nn import Bias, Scale

__all__ = ["DeclaredBranches", "DeclaredClassifier", "FusedNormBias", "FusedNormTail", "LayerScaleHandle",
           "TransposedWeight", "bias_inputs", "bias_output", "scale_output"]


def bias_inputs(positions: dict[int, str], module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook: add the scalar bias ``module.<name>`` to positional input ``i`` for each ``i: name``."""
    return tuple(getattr(module, positions[i])(a) if i in positions and isinstance(a, Tensor) else a
                 for i, a in enumerate(args))


def bias_output(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
    """Forward hook: add the scalar bias ``module.fixup_out_bias`` to the output (before a functional activation)."""
    return module.fixup_out_bias(out)


def scale_output(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
    """Forward hook: multiply the output (the first of a tuple, for attention) by ``module.fixup_scale``."""
    if isinstance(out, tuple):
        return (module.fixup_scale(out[0]), *out[1:])
    return module.fixup_scale(out)


def keep_tail(module: nn.Module, tail: Sequence[tuple[str, nn.Module]], original_type: str) -> None:
    """Register the children that followed a fused module's normalisation, in order."""
    for name, child in tail:
        module.add_module(name, child)
    module.order = [name for name, _ in tail]
    module.original_type = original_type


def run_tail(module: nn.Module, x: Tensor) -> Tensor:
    for name in module.order:
        x = module._modules[name](x)
    return x


class FusedNormBias(Bias):
    """A fused norm+activation module (timm's ``BatchNormAct2d``) in Fixup form: a scalar bias where the
    normalisation was, then the module's own children that followed it (dropout, activation), in order."""

    def __init__(self, tail: Sequence[tuple[str, nn.Module]], original_type: str) -> None:
        super().__init__()
        keep_tail(self, tail, original_type)

    def forward(self, x: Tensor) -> Tensor:
        return run_tail(self, x + self.bias)

    def extra_repr(self) -> str:
        return f"from {self.original_type}: bias, then {', '.join(self.order) or 'nothing'}"


class FusedNormTail(nn.Module):
    """A fused norm+activation module whose normalisation Fixup removes: only the children that followed it."""

    def __init__(self, tail: Sequence[tuple[str, nn.Module]], original_type: str) -> None:
        super().__init__()
        keep_tail(self, tail, original_type)

    def forward(self, x: Tensor) -> Tensor:
        return run_tail(self, x)


class LayerScaleHandle(Scale):
    """The branch's multiplier is a parameter the model already has: a layer scale (ConvNeXt's ``gamma``,
    a product with a parameter after the branch's last layer). Declared as the branch's ``scale`` so that
    :func:`fixup.fixup_init_` initialises it as Fixup's multiplier (every entry 1); it owns no parameter."""

    def __init__(self, owner: nn.Module, param: str, label: str) -> None:
        nn.Module.__init__(self)
        self.target = _Target(owner, param)
        self.label = label

    @property
    def scale(self) -> Tensor:  # type: ignore[override]
        return getattr(self.target.module, self.target.param)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


@dataclass
class _Target:
    module: nn.Module
    param: str


@dataclass(frozen=True)
class TransposedWeight(WeightSlice):
    """A weight stored ``(in, out)`` (``transformers.pytorch_utils.Conv1D``), declared as its ``(out, in)``
    transpose, so that fans and rows are those of the equivalent ``nn.Linear``; ``rows`` are output rows
    (columns of the stored parameter), e.g. the Q, K and V parts of GPT-2's fused ``c_attn``."""

    def __post_init__(self) -> None:
        weight = getattr(self.module, self.param, None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError(f"{type(self.module).__name__} has no 2-D parameter {self.param!r}")
        if self.rows is not None and not (0 <= self.rows[0] < self.rows[1] <= weight.shape[1]):
            raise ValueError(f"rows {self.rows} are outside the {weight.shape[1]} outputs of {self.param}")

    @property
    def weight(self) -> Tensor:
        weight = getattr(self.module, self.param).t()
        return weight if self.rows is None else weight[self.rows[0]:self.rows[1]]

    def label(self) -> str:
        rows = "" if self.rows is None else f"[{self.rows[0]}:{self.rows[1]}]"
        return f"{self.param}.T{rows}"


class DeclaredBranches:
    """``block.residual_branches()`` of an adapted block: the branches ``fixup.adapt`` found in it."""

    def __init__(self, branches: Sequence[Branch]) -> None:
        self.branches = list(branches)

    def __call__(self) -> list[Branch]:
        return list(self.branches)


class DeclaredClassifier:
    """``model.classifier_layers()`` of an adapted model."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.layers = list(layers)

    def __call__(self) -> list[nn.Module]:
        return list(self.layers)


class DeclaredTrunk(DeclaredClassifier):
    """``model.trunk_layers()`` of an adapted model: the weight layers carrying the stream outside the branches."""


class DeclaredTokens:
    """``model.trunk_tokens()`` of an adapted model: learned tokens concatenated into the stream, by name."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def __call__(self) -> list[str]:
        return list(self.names)
