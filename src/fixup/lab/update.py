"""The functional update of a real network, Δf(x) = ||f(x; θ - η∇ℓ) - f(x; θ)||, and its depth dependence.

Fixup's governing quantity (Zhang, Dauphin & Ma, ICLR 2019, section 3) is the change of the network
function caused by one SGD step. :func:`functional_update` trains a copy of a model with plain SGD
(no momentum, no weight decay) on one fixed batch and measures, at the chosen steps, how far the
output and every residual block's output moved in that step.

What step 1 measures in a Fixup network: the classifier starts at zero, so no gradient reaches the
branches and only the classifier moves; Δf at step 1 is then the same at every depth, whatever the
branch scale. The branches move from step 2, so the depth dependence that rule 2 controls shows at
steps k > 1. :func:`depth_sweep` repeats the measurement over depths for any model factory, and
:func:`loglog_slope` fits log Δf = slope * log L + c with the slope's standard error.

Δf is reported as the root mean square over the batch of each example's Euclidean change.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import ResidualBlock, find_branches
from ..nn import Bias, Scale

__all__ = ["depth_sweep", "functional_update", "loglog_slope", "rms_change", "update_sweep"]

LossFn = Callable[[Tensor, Tensor], Tensor]


def rms_change(after: Tensor, before: Tensor) -> float:
    """Root mean square over the batch (dim 0) of each example's Euclidean change."""
    diff = (after - before).reshape(after.shape[0], -1).double()
    return float(diff.pow(2).sum(dim=1).mean().sqrt())


def _rms_norm(t: Tensor) -> float:
    return float(t.reshape(t.shape[0], -1).double().pow(2).sum(dim=1).mean().sqrt())


def functional_update(model: nn.Module, x: Tensor, y: Tensor, *, lr: float = 0.1, steps: Sequence[int] = (1, 10),
                      loss_fn: LossFn = F.cross_entropy, per_block: bool = True,
                      scalar_lr_factor: float = 1.0) -> list[dict[str, Any]]:
    """Δf of the SGD steps listed in ``steps`` while training a copy of ``model`` on the batch (x, y).

    Returns one flat record per measured step: ``df`` (output change), ``df_max`` (the largest ``df`` of
    this and every earlier step: a network that blew up and then died still shows its blow-up),
    ``df_rel`` (``df`` over the output's size before the step), ``loss`` before the step, and, with
    ``per_block``, ``blocks``: one record per residual block (``name``, ``df``, ``df_rel``) and the block
    that moved most relative to its size (``block_df_rel_max``, ``block_df_rel_argmax``). The model
    itself is left untouched; the copy is in train mode. A diverged step shows as ``inf``/``nan``, never clipped.
    """
    wanted = sorted({int(s) for s in steps})
    if not wanted or wanted[0] < 1:
        raise ValueError(f"steps must be positive step numbers (1 is the first SGD step), got {list(steps)!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite learning rate, got {lr!r}")
    net = copy.deepcopy(model).train()
    params = [p for p in net.parameters() if p.requires_grad]
    scalar_ids = {id(p) for m in net.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters()}
    rates = [lr * scalar_lr_factor if id(p) in scalar_ids else lr for p in params]
    blocks = [(n, m) for n, m in net.named_modules() if isinstance(m, ResidualBlock)]
    captured: dict[str, Tensor] = {}
    capture = [False]

    def hook(name: str) -> Callable[..., None]:
        def fn(_mod: nn.Module, _inp: Any, out: Any) -> None:
            if capture[0] and isinstance(out, Tensor):
                captured[name] = out.detach().clone()
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in blocks] if per_block else []
    records = []
    df_max = 0.0
    try:
        for step in range(1, wanted[-1] + 1):
            measure = step in wanted
            capture[0] = measure and per_block
            captured.clear()
            out = net(x)
            before = dict(captured)
            loss = loss_fn(out, y)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for p, g, rate in zip(params, grads, rates):
                    if g is not None and rate:
                        p.sub_(rate * g)
                captured.clear()
                after_out = net(x)
                df = rms_change(after_out, out.detach())
                if math.isfinite(df_max) and (not math.isfinite(df) or df > df_max):
                    df_max = df  # a non-finite step is kept: divergence is never forgotten
                if not measure:
                    continue
                rec: dict[str, Any] = {"step": step, "loss": float(loss.detach()), "df": df, "df_max": df_max,
                                       "out_norm": _rms_norm(out.detach())}
                rec["df_rel"] = rec["df"] / rec["out_norm"] if rec["out_norm"] > 0 else math.nan
                if per_block:
                    rec["blocks"] = [{"name": n, "df": rms_change(captured[n], before[n]),
                                      "df_rel": rms_change(captured[n], before[n]) / max(_rms_norm(before[n]), 1e-300)}
                                     for n, _ in blocks if n in captured and n in before]
                    worst = max(rec["blocks"], key=lambda b: b["df_rel"] if math.isfinite(b["df_rel"]) else math.inf,
                                default=None)
                    rec["block_df_rel_max"] = worst["df_rel"] if worst else None
                    rec["block_df_rel_argmax"] = worst["name"] if worst and worst["df_rel"] != 0 else None
                records.append(rec)
    finally:
        capture[0] = False
        for h in handles:
            h.remove()
    return records


def loglog_slope(L: Sequence[float], values: Sequence[float]) -> dict[str, Any]:
    """Least-squares fit of ``log10 value = slope * log10 L + intercept`` with the slope's standard error.

    Non-finite or non-positive values are left out of the fit and counted in ``excluded`` (a diverged
    network is reported, not fitted). ``stderr`` is nan with fewer than three points.
    """
    pts = [(math.log10(a), math.log10(b)) for a, b in zip(L, values) if a > 0 and math.isfinite(b) and b > 0]
    out: dict[str, Any] = {"slope": math.nan, "stderr": math.nan, "intercept": math.nan, "n": len(pts),
                           "excluded": len(list(L)) - len(pts)}
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return out
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    intercept = my - slope * mx
    out.update(slope=slope, intercept=intercept)
    if n > 2:
        ssr = sum((p[1] - intercept - slope * p[0]) ** 2 for p in pts)
        out["stderr"] = math.sqrt(ssr / (n - 2) / sxx)
    return out


def depth_sweep(factory: Callable[[int], nn.Module], depths: Sequence[int], x: Tensor, y: Tensor, *,
                lr: float = 0.1, steps: Sequence[int] = (1, 10), loss_fn: LossFn = F.cross_entropy,
                per_block: bool = False, scalar_lr_factor: float = 1.0) -> dict[str, Any]:
    """:func:`functional_update` for ``factory(depth)`` at every depth, with a log-log fit per step.

    Returns ``{"records": [...], "fits": {"df@k": ..., "df_max@k": ...}}`` (a :func:`loglog_slope` of
    ``df`` and of ``df_max`` at every measured step k); each record carries ``depth``,
    ``L`` (residual branches found by the branch protocol), ``step`` and the measured Δf.
    """
    records: list[dict[str, Any]] = []
    for depth in depths:
        model = factory(int(depth))
        L = len(find_branches(model))
        for rec in functional_update(model, x, y, lr=lr, steps=steps, loss_fn=loss_fn, per_block=per_block,
                                       scalar_lr_factor=scalar_lr_factor):
            records.append({"depth": int(depth), "L": L, **rec})
    fits: dict[str, dict[str, Any]] = {}
    for step in sorted({r["step"] for r in records}):
        rs = [r for r in records if r["step"] == step]
        fits[f"df@{step}"] = loglog_slope([r["L"] for r in rs], [r["df"] for r in rs])
        fits[f"df_max@{step}"] = loglog_slope([r["L"] for r in rs], [r["df_max"] for r in rs])
    return {"records": records, "fits": fits}


def update_sweep(model: str = "resnet_cifar", depths: Sequence[int] = (20, 56, 110), *,
                 methods: Sequence[str] = ("fixup", "fixup_no_depth_scale", "none"), lr: float = 0.1,
                 steps: Sequence[int] = (1, 10), batch: int = 8, size: int = 8, num_classes: int = 10,
                 scalar_lr_factor: float = 1.0, seed: int = 0, per_block: bool = False) -> dict[str, Any]:
    """Measured Δf against depth for a registered model under several initialisation methods.

    Every method and depth sees the same fixed Gaussian batch (``batch`` images of ``size`` x ``size``).
    ``scalar_lr_factor`` multiplies the learning rate of Fixup's scalar biases and multipliers (0 holds
    them fixed, as the analysis of section 3 does, which has no biases); ``per_block`` adds each residual
    block's change (see :func:`functional_update`). Returns ``config``, the flat
    ``records`` (with ``method``) and ``fits[method]["df@k" or "df_max@k"]`` (log-log slopes against L).
    """
    from .methods import model_factory, sample_batch

    x, y = sample_batch(batch, size, 3, num_classes, seed)
    records: list[dict[str, Any]] = []
    fits: dict[str, dict[str, dict[str, Any]]] = {}
    for method in methods:
        sweep = depth_sweep(model_factory(model, method, seed=seed, num_classes=num_classes, data=x), depths, x, y,
                            lr=lr, steps=steps, scalar_lr_factor=scalar_lr_factor, per_block=per_block)
        records += [{"method": method, **r} for r in sweep["records"]]
        fits[method] = sweep["fits"]
    config = {"model": model, "depths": list(depths), "methods": list(methods), "lr": lr, "steps": list(steps),
              "batch": batch, "size": size, "num_classes": num_classes, "scalar_lr_factor": scalar_lr_factor,
              "seed": seed, "per_block": per_block}
    return {"config": config, "records": records, "fits": fits}
