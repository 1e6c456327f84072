"""Pieces the model constructors share: the method check, the normalisation layer and the scalars.

A constructor receives its :class:`~fixup.method.Method` (or a method's name), checks it against the norms its
architecture builds and the family it belongs to with :func:`check_method`, builds its scalars from it, and ends with
``self.init_report = initialise_(self, method, generator=generator)`` (:func:`fixup.init.initialise_`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..method import FAMILIES, METHODS, Method, as_method
from ..nn import Gate, Scale
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import scalar_value

__all__ = ["StemHeadFolding", "branch_multiplier", "check_method", "make_norm", "name_blocks", "scalar"]


class StemHeadFolding:
    """``fold_`` for a ResNet whose stem is ``bias1(norm1(conv1(x)))`` and whose head is ``fc(bias2(x))``."""

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold the stem's bias into conv1 and the head's into fc (the blocks fold themselves)."""
        n = 0
        if type(self.norm1) is nn.Identity:
            n += count_scalars(self.bias1)
            self.conv1 = fold_layer(self.conv1, bias=scalar_value(self.bias1))
            self.bias1 = nn.Identity()
        n += count_scalars(self.bias2)
        self.fc = fold_layer(self.fc, shift=scalar_value(self.bias2))
        self.bias2 = nn.Identity()
        return n


# A model of each family, for the error that sends a method to the family it applies to.
_EXAMPLE = {"resnet": "resnet20", "transformer": "transformer_tiny"}


def check_method(method: Method | str, allowed: tuple[str, ...], model: str, family: str) -> Method:
    """``method`` as a :class:`Method`, after checking that ``model`` (of ``family``, a key of
    :data:`fixup.method.FAMILIES`) builds its norm (one of ``allowed``) and is of a family it applies to."""
    method = as_method(method)
    if method.family not in ("any", family):
        usable = [m for m in METHODS.values() if m.family in ("any", family) and m.norm in allowed]
        names = ["the Fixup forms"] * any(m.fixup for m in usable) + [m.name for m in usable if not m.fixup]
        raise ValueError(f"{method.name} is not available for {model}: it applies to {FAMILIES[method.family]} only "
                         f"(fixup.create_model({_EXAMPLE[method.family]!r}, method={method.name!r})); {model} is "
                         f"built for {', '.join(names)}")
    if method.norm not in allowed:
        raise ValueError(f"norm={method.norm!r} is not available for {model}; choose one of {', '.join(allowed)}")
    return method


def scalar(module: type[nn.Module], on: bool) -> nn.Module:
    """A Fixup scalar (``Bias``/``Scale``) where the method has one, else an identity placeholder."""
    return module() if on else nn.Identity()


def branch_multiplier(method: Method) -> nn.Module:
    """What multiplies a residual branch's output: Fixup's multiplier (rule 3, starts at 1), the gate of SkipInit
    and ReZero (starts at 0), or an identity placeholder."""
    if method.gate:
        return Gate()
    return scalar(Scale, method.fixup and method.scale)


def make_norm(norm: str, channels: int, groups: int = 16) -> nn.Module:
    """The normalisation layer after a convolution: BatchNorm, GroupNorm (``groups`` groups), or nothing."""
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "groupnorm":
        return nn.GroupNorm(min(groups, channels), channels)
    return nn.Identity()


def name_blocks(model: nn.Module) -> None:
    """Tell every block its qualified name, so that shape errors in residual sums can name it."""
    for name, module in model.named_modules():
        if hasattr(module, "block_name"):
            module.block_name = name
