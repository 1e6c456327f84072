"""Three checks from the lesson's "common errors" (SEEDS.md), run on a real model.

* :func:`batch_coupling`: "a prediction changes when unrelated examples join its batch". Each probe
  example is run beside two different sets of companions; the largest change of its output (and of
  every residual block's output) is the coupling. Training-mode BatchNorm couples examples; Fixup,
  which computes no batch statistic, does not.
* :func:`symmetry_probe`: "hidden units remain indistinguishable". After ``steps`` SGD steps on a
  batch, the output units of each weight layer (rows of its weight, with their bias) are grouped by
  equality; a group of two or more is a symmetry the update did not break. In a Fixup network the
  zeroed last branch layers first receive a gradient at step 2 (the classifier is zero at step 1),
  so two steps is the default.
* :func:`residual_shapes`: "a residual sum succeeds with the wrong feature width". Runs the model on a
  sample input and, for every residual block, compares the shape of its branch (the output of the
  branch's last declared weight layer) with the block's output; a block that raises (the models use
  :func:`fixup.nn.residual_add`, which refuses a mismatch) is named with the error.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import WEIGHT_LAYERS, ResidualBlock

__all__ = ["batch_coupling", "residual_shapes", "symmetry_probe"]


def _block_outputs(net: nn.Module, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    outs: dict[str, Tensor] = {}
    handles = [m.register_forward_hook(lambda _m, _i, o, n=n: outs.__setitem__(n, o.detach()))
               for n, m in net.named_modules() if isinstance(m, ResidualBlock)]
    try:
        with torch.no_grad():
            y = net(x)
    finally:
        for h in handles:
            h.remove()
    return y.detach(), outs


def _max_change(a: Tensor, b: Tensor, k: int) -> tuple[float, float]:
    """Largest absolute change over the first k examples, and relative to that example's size."""
    d = (a[:k] - b[:k]).reshape(k, -1).double().norm(dim=1)
    size = a[:k].reshape(k, -1).double().norm(dim=1)
    rel = torch.where(size > 0, d / size.clamp_min(1e-300), torch.where(d > 0, torch.inf, 0.0))
    return float(d.max()), float(rel.max())


def batch_coupling(model: nn.Module, probe: Tensor, companions_a: Tensor, companions_b: Tensor,
                   modes: tuple[str, ...] = ("train", "eval")) -> list[dict[str, Any]]:
    """How much the outputs of ``probe`` change when its batch companions change from a to b.

    Each mode runs a fresh copy of the model (so running statistics and the original are untouched)
    on ``cat(probe, companions_a)`` and on ``cat(probe, companions_b)``. Returns one record per mode:
    ``output`` and ``output_rel`` (largest change of a probe example's output, absolute and relative
    to its size), ``blocks`` and ``blocks_rel`` (the same, maximised over residual blocks), and the
    name of the most coupled block. Zero means the model treats each example independently.
    """
    if companions_a.shape != companions_b.shape:
        raise ValueError(f"the two companion sets must have the same shape (same batch size), got "
                         f"{tuple(companions_a.shape)} and {tuple(companions_b.shape)}")
    k = probe.shape[0]
    records = []
    for mode in modes:
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        net = copy.deepcopy(model).train(mode == "train")
        ya, ba = _block_outputs(net, torch.cat([probe, companions_a]))
        net = copy.deepcopy(model).train(mode == "train")
        yb, bb = _block_outputs(net, torch.cat([probe, companions_b]))
        out, out_rel = _max_change(ya, yb, k)
        per_block = {n: _max_change(ba[n], bb[n], k) for n in ba}
        worst = max(per_block, key=lambda n: per_block[n][1], default=None)
        if worst is not None and per_block[worst][1] == 0.0:
            worst = None  # no block is coupled at all
        records.append({"mode": mode, "output": out, "output_rel": out_rel,
                        "blocks": max((v[0] for v in per_block.values()), default=0.0),
                        "blocks_rel": max((v[1] for v in per_block.values()), default=0.0),
                        "worst_block": worst, "probe_examples": k, "batch": k + companions_a.shape[0]})
    return records


def _groups(rows: Tensor, tol: float) -> list[list[int]]:
    """Groups (size >= 2) of rows equal within ``tol`` times the largest row norm."""
    scale = float(rows.norm(dim=1).max()) if rows.numel() else 0.0
    close = torch.cdist(rows, rows) <= tol * max(scale, 1e-30)
    seen, groups = set(), []
    for i in range(rows.shape[0]):
        if i in seen:
            continue
        members = [j for j in torch.nonzero(close[i]).flatten().tolist() if j not in seen]
        seen.update(members)
        if len(members) > 1:
            groups.append(members)
    return groups


def symmetry_probe(model: nn.Module, x: Tensor, y: Tensor, *, lr: float = 0.1, steps: int = 2,
                   loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
                   tol: float = 1e-6) -> list[dict[str, Any]]:
    """Units that are still identical after ``steps`` SGD steps on (x, y), for every weight layer.

    A copy of the model is trained (plain SGD, train mode). Returns one record per weight layer:
    ``name``, ``units`` (output units), ``identical`` (units in a group of two or more equal units),
    ``identical_nonzero`` (those of them whose weights are not all zero: a copied unit rather than a
    unit that has not moved yet), ``zero_units`` (units whose weights are all still zero: no gradient
    has reached them, e.g. a channel no example activates, or a zero-padded shortcut channel of a
    Fixup network whose classifier column is still zero), ``groups``, ``largest`` (size of the largest
    group), ``all_zero`` (the whole layer is still zero) and ``flagged`` (``identical > 0``).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (symmetry is judged after an update), got {steps!r}")
    net = copy.deepcopy(model).train()
    params = [p for p in net.parameters() if p.requires_grad]
    for _ in range(steps):
        grads = torch.autograd.grad(loss_fn(net(x), y), params, allow_unused=True)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(lr * g)
    records = []
    with torch.no_grad():
        for name, mod in net.named_modules():
            if not isinstance(mod, WEIGHT_LAYERS):
                continue
            rows = mod.weight.detach().reshape(mod.weight.shape[0], -1).double()  # (units, fan_in)
            if getattr(mod, "bias", None) is not None:
                rows = torch.cat([rows, mod.bias.detach().double()[:, None]], dim=1)
            groups = _groups(rows, tol)
            zero_rows = (rows == 0).all(dim=1)
            identical = sum(len(g) for g in groups)
            nonzero = sum(len(g) for g in groups if not bool(zero_rows[g[0]]))
            records.append({"name": name, "type": type(mod).__name__, "units": rows.shape[0],
                            "identical": identical, "identical_nonzero": nonzero, "zero_units": int(zero_rows.sum()),
                            "groups": len(groups), "largest": max((len(g) for g in groups), default=0),
                            "all_zero": bool(zero_rows.all()), "flagged": identical > 0})
    return records


def residual_shapes(model: nn.Module, x: Tensor) -> list[dict[str, Any]]:
    """Check every residual sum of ``model`` on the sample input ``x``; name any block that is wrong.

    Returns one record per residual block in execution order: ``block``, ``input``, ``branch`` (shape of
    each declared branch's last layer output), ``output`` shapes, ``ok`` and ``message``. A branch whose
    shape differs from the block's output (a sum that broadcast), or a block that raised, is ``ok=False``
    with the reason; blocks after a failure are reported as not reached.
    """
    net = copy.deepcopy(model).eval()
    blocks = [(n, m) for n, m in net.named_modules() if isinstance(m, ResidualBlock)]
    seen: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    handles = []
    for name, block in blocks:
        rec: dict[str, Any] = {"block": name, "input": None, "branch": [], "output": None, "ok": None,
                               "message": "not reached"}
        seen[name] = rec

        def pre(_m: nn.Module, inp: Any, rec: dict[str, Any] = rec) -> None:
            rec["input"] = list(inp[0].shape) if inp and isinstance(inp[0], Tensor) else None
            order.append(rec["block"])

        def post(_m: nn.Module, _inp: Any, out: Any, rec: dict[str, Any] = rec) -> None:
            rec["output"] = list(out.shape) if isinstance(out, Tensor) else None

        handles.append(block.register_forward_pre_hook(pre))
        handles.append(block.register_forward_hook(post))
        for branch in block.residual_branches():
            last = branch.layers[-1]
            if isinstance(last, nn.Module) and branch.ends == 1:  # several ends: each is a part of the output
                handles.append(last.register_forward_hook(
                    lambda _m, _i, o, rec=rec: rec["branch"].append(list(o.shape)) if isinstance(o, Tensor) else None))
    error: Exception | None = None
    try:
        with torch.no_grad():
            net(x)
    except (ValueError, RuntimeError) as err:
        error = err
    finally:
        for h in handles:
            h.remove()
    for name in order:
        rec = seen[name]
        if rec["output"] is None:
            rec["ok"], rec["message"] = False, str(error) if error else "the block produced no tensor"
        elif any(shape != rec["output"] for shape in rec["branch"]):
            rec["ok"] = False
            rec["message"] = (f"{name}: branch output {rec['branch']} differs from the block output {rec['output']}; "
                              "the sum broadcast. Give the shortcut a projection or correct the branch width/stride.")
        else:
            rec["ok"], rec["message"] = True, ""
    return [seen[n] for n in order] + [seen[n] for n, _ in blocks if n not in order]
