"""Pieces shared by the model builders: the method choice, the normalisation layer and the initialisation step.

Every builder does the same three things: ``method = method_for(norm, init, allowed_norms)`` before
building (the method decides which scalars the blocks carry and their output scale), builds, then
``finish(model, norm, init, ...)``, which initialises for the method (see :mod:`fixup.baselines`) and
sets ``model.init_report``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..baselines import Method, initialise_, resolve_method

__all__ = ["NORMS", "Method", "check_norm", "finish", "make_norm", "method_for", "name_blocks", "scalar"]

NORMS = ("fixup", "batchnorm", "groupnorm", "layernorm", "none")


def check_norm(norm: str, allowed: tuple[str, ...]) -> str:
    if norm not in allowed:
        raise ValueError(f"norm={norm!r} is not available for this model; choose one of {', '.join(allowed)}")
    return norm


def method_for(norm: str, init: str | None, allowed: tuple[str, ...]) -> Method:
    """Check ``norm`` against the architecture's ``allowed`` norms, then resolve the ``(norm, init)`` method."""
    check_norm(norm, allowed)
    return resolve_method(norm, init)


def scalar(module: type[nn.Module], on: bool) -> nn.Module:
    """A Fixup scalar (``Bias``/``Scale``) where the method has one, else an identity placeholder."""
    return module() if on else nn.Identity()


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


def finish(model: nn.Module, norm: str, init: str | None, *, generator: torch.Generator | None = None,
           zero_init_last_norm: bool = False, base: str = "he") -> nn.Module:
    """Initialise a freshly built model for the method ``(norm, init)``; sets ``model.init_report``.

    ``norm="fixup"`` applies :func:`fixup.fixup_init_` (with the ablation's settings); the other methods
    are in :mod:`fixup.baselines`. ``zero_init_last_norm`` zeroes the gain of each block's last
    normalisation layer (batchnorm/groupnorm only; off by default, as in the paper's baselines).
    ``base`` is the standard initialisation rule 2 of Fixup starts from ("he", or "xavier" for the
    Transformer).
    """
    initialise_(model, resolve_method(norm, init), generator=generator, zero_init_last_norm=zero_init_last_norm,
                base=base)
    return model
