"""The branch protocol: how a model tells ``fixup_init_`` where its residual branches are.

A residual block computes ``y = shortcut(x) + F(x)``. The block itself declares ``F``: the weight
layers on F's path in execution order (the last one is zeroed by rule 1), the scalar biases and the
multiplier it carries (rule 3) and, where it has one, its shortcut projection (He-initialised, never
depth-scaled). A model declares its classifier. Nothing is found by matching parameter names.

A module takes part by defining ``residual_branches(self) -> Sequence[Branch]``; a model names its
classifier layers with ``classifier_layers(self) -> Sequence[nn.Module]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import nn

from .nn import Bias, Scale

__all__ = [
    "WEIGHT_LAYERS",
    "Branch",
    "FixupClassifier",
    "ResidualBlock",
    "find_branches",
    "find_classifier",
]

# Module types whose ``weight`` is a weight layer in the sense of the paper (a linear map).
WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass
class Branch:
    """One residual branch F of a block ``y = shortcut(x) + F(x)``.

    Attributes:
        layers: the weight layers on F's path, in execution order. The last one is zeroed; the others
            are He-initialised and multiplied by ``L ** (-1 / (2m - 2))``.
        kind: a short name of the branch type ("basic", "bottleneck", "attention", "ffn", ...).
        m: the number of weight layers that multiply along the path. Defaults to ``len(layers)``;
            set it where parallel layers multiply, e.g. attention: queries, keys and values times
            the output projection count as m = 4 although they are four layers side by side.
        biases: the scalar biases (rule 3) placed on the branch.
        scale: the branch's scalar multiplier (rule 3), if any.
        shortcut: the shortcut's projection layer, if the shortcut is not the identity.
    """

    layers: Sequence[nn.Module]
    kind: str = "branch"
    m: int | None = None
    biases: Sequence[Bias] = field(default_factory=list)
    scale: Scale | None = None
    shortcut: nn.Module | None = None

    @property
    def depth(self) -> int:
        """The m of the paper: weight layers multiplying along the branch."""
        return self.m if self.m is not None else len(self.layers)


@runtime_checkable
class ResidualBlock(Protocol):
    """A module that owns one or more residual branches."""

    def residual_branches(self) -> Sequence[Branch]: ...


@runtime_checkable
class FixupClassifier(Protocol):
    """A model that names its classifier (zeroed by rule 1)."""

    def classifier_layers(self) -> Sequence[nn.Module]: ...


def find_branches(model: nn.Module) -> list[tuple[str, Branch]]:
    """Every declared residual branch of ``model``, with its block's qualified name, in module order."""
    found: list[tuple[str, Branch]] = []
    for name, module in model.named_modules():
        if isinstance(module, ResidualBlock):
            branches = list(module.residual_branches())
            for i, branch in enumerate(branches):
                label = name or type(module).__name__
                found.append((label if len(branches) == 1 else f"{label}[{i}]", branch))
    return found


def find_classifier(model: nn.Module) -> list[nn.Module]:
    """The classifier layers ``model`` declares, or an empty list."""
    if isinstance(model, FixupClassifier):
        return list(model.classifier_layers())
    return []
