"""Pieces the model constructors share: the method check, the normalisation layer and the scalars.

A constructor receives its :class:`~fixup.method.Method` (or a method's name), checks it against the
norms its architecture supports with :func:`check_method`, builds its scalars from it, and ends with
``self.init_report = initialise_(self, method, generator=generator)``.
"""

from __future__ import annotations

from torch import nn

from ..method import Method, as_method

__all__ = ["check_method", "make_norm", "name_blocks", "scalar"]


def check_method(method: Method | str, allowed: tuple[str, ...], model: str) -> Method:
    """``method`` as a :class:`Method`, after checking that ``model`` supports its norm."""
    method = as_method(method)
    if method.norm not in allowed:
        raise ValueError(f"norm={method.norm!r} is not available for {model}; choose one of {', '.join(allowed)}")
    return method


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
