"""The gain gamma of each activation for ``fixup.adapt(..., method="nf_resnet")``: ``gamma * f(x)`` has unit variance
on a unit Gaussian ``x`` (Brock, De & Smith 2021, section 4), ``gamma = 1 / sqrt(Var f(z))``, ``z ~ N(0, 1)``.

The gamma of a recorded activation is computed from the activation itself, as the model calls it (its own module
or function, with the options it was called with: a LeakyReLU's slope, GELU's tanh approximation), by integrating
against the normal density on a fine grid in float64; for ReLU that is the library's :data:`fixup.nn.RELU_GAMMA`
(sqrt(2 / (1 - 1/pi))). The NF-Nets authors tabulate the same quantity, estimated by sampling (their released
``nfnets/base.py``); tests/test_adapt_nf.py checks ours against their figures. Only the element-wise activations
that adapt's vocabulary knows get one; a learnt one (PReLU: its slope, and so its gamma, changes in training) is
refused, naming the activation.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx, nn

from . import _vocab as V

__all__ = ["activation_gamma", "gamma_of", "positively_homogeneous"]

_GRID = (-14.0, 14.0, 200_001)  # z's range and points: the tails beyond carry < 1e-40 of the density
_LEARNT = (nn.PReLU,)
_LEARNT_NAMES = {"prelu"}


def gamma_of(f: Any) -> float:
    """``1 / sqrt(Var f(z))`` for ``z ~ N(0, 1)``, by the trapezoid rule on :data:`_GRID` in float64."""
    lo, hi, n = _GRID
    z = torch.linspace(lo, hi, n, dtype=torch.float64)
    density = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) * ((hi - lo) / (n - 1))
    with torch.no_grad():
        y = f(z.clone()).to(torch.float64)
    mean = (density * y).sum()
    var = float((density * y * y).sum() - mean * mean)
    if not math.isfinite(var) or var <= 1e-12:
        raise ValueError(f"its output has variance {var:.3g} on a unit Gaussian input, so no gamma scales it to 1")
    return 1.0 / math.sqrt(var)


def _callable(node: fx.Node, modules: dict[str, nn.Module]) -> Any:
    """The activation as the model calls it, applied to a float64 tensor."""
    extra, kwargs = node.args[1:], dict(node.kwargs)
    if node.op == "call_module":
        return modules[str(node.target)]
    if node.op == "call_method":
        return lambda z: getattr(z, str(node.target))(*extra, **kwargs)
    return lambda z: node.target(z, *extra, **kwargs)  # type: ignore[operator]


def positively_homogeneous(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether the activation at ``node`` commutes with a positive factor, ``f(c x) = c f(x)`` (ReLU, LeakyReLU):
    then ``gamma * f(a + b) = f(gamma * a + gamma * b)``. Checked on the grid, not read from a name."""
    lo, hi, n = _GRID
    z = torch.linspace(lo, hi, n // 100, dtype=torch.float64)
    f = _callable(node, modules)
    with torch.no_grad():
        return bool(torch.allclose(f(1.7 * z.clone()), 1.7 * f(z.clone()), rtol=1e-9, atol=1e-12))


def activation_gamma(node: fx.Node, modules: dict[str, nn.Module]) -> tuple[float, str]:
    """The gamma of the activation recorded at ``node`` and its name (module type or function); a ValueError naming
    it where it has none (a learnt activation, or one whose output does not vary)."""
    mod = V.module_of(node, modules)
    what = type(mod).__name__ if mod is not None else V._name(node)
    if isinstance(mod, _LEARNT) or (mod is None and V._name(node) in _LEARNT_NAMES):
        raise ValueError(f"the activation {what} at {node.name!r} has a learnt shape (its slope moves in training), "
                         "so no fixed gamma keeps its output at unit variance; replace it with a fixed activation "
                         "(nn.LeakyReLU(0.25) has PReLU's initial slope) or adapt with method='fixup'")
    if any(isinstance(a, fx.Node) for a in [*node.args[1:], *node.kwargs.values()]):
        raise ValueError(f"the activation {what} at {node.name!r} takes a tensor option; no fixed gamma applies")
    try:
        return gamma_of(_callable(node, modules)), what
    except ValueError as err:
        raise ValueError(f"the activation {what} at {node.name!r} has no gamma: {err}") from None
