"""Per-layer and per-block statistics of a real network, as flat records (one dict per module and mode).

The lesson's observation habit (SEEDS.md, "Observe before changing several mechanisms"): compare
preactivation scale, activation sparsity or saturation, gradient norms and train-versus-inference
behaviour layer by layer, with the input and the parameters fixed while the mode changes.

:func:`layer_stats` runs one forward and backward pass on a copy of the model in each mode and
returns, for every weight layer, activation module and residual block: the mean and standard
deviation of its output, the fraction of exact zeros (sparsity after a ReLU), the fraction saturated
(bounded activations at their limits), the fraction non-finite, the gradient norm and the norm of its
parameters. An activation module called several times per forward (a shared ``nn.ReLU``) is
aggregated over its calls. The model passed in is never modified (BatchNorm running statistics
included). Plots live in :mod:`fixup.lab.plots`; the update, coupling, symmetry and shape checks in
:mod:`fixup.lab.update` and :mod:`fixup.lab.checks`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import WEIGHT_LAYERS, ResidualBlock, find_classifier

__all__ = ["ACTIVATIONS", "BOUNDED", "SATURATION", "layer_stats"]

ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.SiLU,
                                            nn.LeakyReLU, nn.ELU, nn.Softsign)
# Bounded activations and their limits: an output within SATURATION of a limit counts as saturated
# (the derivative there is near zero).
BOUNDED: dict[type[nn.Module], tuple[float, float]] = {nn.Tanh: (-1.0, 1.0), nn.Sigmoid: (0.0, 1.0),
                                                       nn.Hardtanh: (-1.0, 1.0), nn.Softsign: (-1.0, 1.0)}
SATURATION = 0.01


class _Acc:
    """Running sums over every call of one module."""

    def __init__(self) -> None:
        self.calls = self.n = self.zeros = self.saturated = self.nonfinite = 0
        self.s = self.s2 = 0.0

    def add(self, t: Tensor, limits: tuple[float, float] | None) -> None:
        t = t.detach().double()
        finite = torch.isfinite(t)
        v = t[finite]
        self.calls += 1
        self.n += t.numel()
        self.nonfinite += int((~finite).sum())
        self.zeros += int((t == 0).sum())
        self.s += float(v.sum())
        self.s2 += float((v * v).sum())
        if limits is not None:
            lo, hi = limits
            self.saturated += int(((v <= lo + SATURATION) | (v >= hi - SATURATION)).sum())

    def summary(self, bounded: bool) -> dict[str, Any]:
        m = self.n - self.nonfinite
        mean = self.s / m if m else math.nan
        var = max(self.s2 / m - mean * mean, 0.0) if m else math.nan
        return {"calls": self.calls, "mean": mean, "std": math.sqrt(var), "frac_zero": self.zeros / max(self.n, 1),
                "frac_saturated": self.saturated / max(self.n, 1) if bounded else None,
                "frac_nonfinite": self.nonfinite / max(self.n, 1)}


def _role(module: nn.Module, classifier: set[int]) -> str | None:
    if id(module) in classifier:
        return "classifier"
    if isinstance(module, ResidualBlock):
        return "block"
    if isinstance(module, WEIGHT_LAYERS):
        return "layer"
    if isinstance(module, ACTIVATIONS):
        return "activation"
    return None


def _norm(tensors: Sequence[Tensor | None]) -> float | None:
    ts = [t.detach().double().reshape(-1) for t in tensors if t is not None]
    if not ts:
        return None
    return float(torch.cat(ts).norm())


def layer_stats(model: nn.Module, x: Tensor, y: Tensor | None = None, *,
                loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
                modes: Sequence[str] = ("train", "eval")) -> list[dict[str, Any]]:
    """Statistics of every weight layer, activation, residual block and the classifier, per mode.

    Args:
        model: the network; a copy is probed, so the original (and its running statistics) is unchanged.
        x: a small, fixed input batch.
        y: targets for the loss whose gradients are measured; without them the gradient of
            ``0.5 * output.pow(2).sum()`` is used.
        modes: any of ``"train"`` and ``"eval"``.

    Returns one flat record per (mode, module) in module order: ``mode``, ``index``, ``name``,
    ``type``, ``role`` (``layer``, ``activation``, ``block`` or ``classifier``), ``calls``, ``mean``,
    ``std``, ``frac_zero``, ``frac_saturated`` (None where the activation is unbounded),
    ``frac_nonfinite``, ``grad_norm`` and ``param_norm`` (None for modules without parameters).
    """
    bad = [m for m in modes if m not in ("train", "eval")]
    if bad:
        raise ValueError(f"modes must be 'train' and/or 'eval', got {bad!r}")
    records: list[dict[str, Any]] = []
    for mode in modes:
        net = copy.deepcopy(model)
        net.train(mode == "train")
        classifier = {id(m) for m in find_classifier(net)}
        probed = [(n, m, r) for n, m in net.named_modules() if (r := _role(m, classifier)) is not None]
        accs = {n: _Acc() for n, _, _ in probed}

        def hook(acc: _Acc, limits: tuple[float, float] | None) -> Callable[..., None]:
            def fn(_mod: nn.Module, _inp: Any, output: Any) -> None:
                if isinstance(output, Tensor):
                    acc.add(output, limits)
            return fn

        handles = [m.register_forward_hook(hook(accs[n], BOUNDED.get(type(m)))) for n, m, _ in probed]
        try:
            out = net(x)
            loss = loss_fn(out, y) if y is not None else 0.5 * out.pow(2).sum()
            net.zero_grad(set_to_none=True)
            loss.backward()
        finally:
            for h in handles:
                h.remove()
        for i, (name, mod, role) in enumerate(probed):
            params = list(mod.parameters())
            records.append({
                "mode": mode, "index": i, "name": name or type(mod).__name__, "type": type(mod).__name__,
                "role": role, **accs[name].summary(type(mod) in BOUNDED),
                "grad_norm": _norm([p.grad for p in params]) if params else None,
                "param_norm": _norm(params) if params else None,
            })
    return records
