"""The shared-gradient effect of stream biases, measured on any model (registered or adapted).

A stream bias is the scalar bias a branch adds after its last layer, onto the residual stream
(``Branch.stream_bias``). At initialisation every branch is zero, so the blocks of a stage pass the
stream through unchanged and every stream bias of the stage receives the *same* gradient: the stage's
offset (their sum) moves (blocks per stage) times faster than one scalar. :func:`stream_probe` shows it:

- ``branches``: each stream bias's gradient at the first step where any is nonzero (``grad_step``: the
  second, where the classifier starts at zero);
- ``stages``: per stage, the blocks, the mean gradient, the spread of the gradients relative to their
  mean (0 when bit-identical; float rounding where the lean forward sums them in another order),
  ``identical`` (equal to 1e-6), and how much faster the offset moves than one bias (|sum| / max |g|);
- ``steps``: the loss, the live fraction of the classifier's input and the offset of each stage over
  the first SGD steps with :func:`fixup.param_groups` (with or without the stream budget).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import find_branches, find_classifier
from ..groups import param_groups
from ..train.collapse import live_fraction, stage_of, stream_offsets

__all__ = ["stream_probe"]


def stream_probe(model: nn.Module, inputs: Tensor, targets: Tensor, *, steps: int = 10, lr: float = 0.1,
                 momentum: float = 0.9, weight_decay: float = 5e-4, scalar_lr_mult: float = 0.1,
                 stream_budget: bool | None = None) -> dict[str, Any]:
    """First-step stream-bias gradients and the stage offsets over ``steps`` SGD steps, on a copy of ``model``.

    ``inputs``/``targets`` is one classification batch, used for every step (cross-entropy on the model's
    output). ``stream_budget`` as in :func:`fixup.param_groups` (``None``: the model's own method).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if inputs.shape[0] != targets.shape[0] or inputs.shape[0] < 2:
        raise ValueError(f"need a batch of at least 2 inputs with one target each, got {inputs.shape[0]} inputs "
                         f"and {targets.shape[0]} targets")
    net = copy.deepcopy(model).train()
    branches = [(name, b) for name, b in find_branches(net) if b.stream_bias is not None]
    if not branches:
        raise ValueError(f"{type(model).__name__} declares no stream bias (a bias after a branch's last layer); "
                         "build it with method='fixup' or 'fixup_paper', or adapt it with fixup.adapt")
    live: list[Tensor] = []
    classifier = find_classifier(net)
    hook = classifier[0].register_forward_pre_hook(lambda _m, a: live.append(live_fraction(a[0]))) if classifier \
        else None
    groups = param_groups(net, lr, weight_decay, scalar_lr_mult=scalar_lr_mult, stream_budget=stream_budget)
    opt = torch.optim.SGD([{k: v for k, v in g.items() if k != "param_names"} for g in groups], lr=lr,
                          momentum=momentum)
    first: list[dict[str, Any]] = []
    first_step = 0
    trajectory = [{"step": 0, "loss": None, "live_fraction": None, **stream_offsets(net)}]
    try:
        for step in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(inputs), targets)
            loss.backward()
            grads = [float(b.stream_bias.bias.grad.reshape(())) if b.stream_bias.bias.grad is not None else 0.0
                     for _, b in branches]
            if not first and (any(grads) or step == steps):  # step 1 has none where the classifier starts at 0
                first_step = step
                first = [{"block": name, "stage": stage_of(name), "grad": g} for (name, _), g in zip(branches, grads)]
            opt.step()
            trajectory.append({"step": step, "loss": float(loss.detach()),
                               "live_fraction": float(live[-1]) if live else None, **stream_offsets(net)})
    finally:
        if hook is not None:
            hook.remove()
    by_stage: dict[str, list[float]] = defaultdict(list)
    for rec in first:
        by_stage[rec["stage"]].append(rec["grad"])
    stages = []
    for stage, grads in by_stage.items():
        g = torch.tensor(grads, dtype=torch.float64)
        mean = float(g.mean())
        biggest = float(g.abs().max())
        stages.append({"stage": stage, "blocks": len(grads), "grad_mean": mean,
                       "relative_spread": float(g.std(correction=0)) / abs(mean) if mean else 0.0,
                       "identical": bool((g - g[0]).abs().max() <= 1e-6 * g.abs().max()),
                       "offset_speed": abs(float(g.sum())) / biggest if biggest else 0.0})
    budget = next((g["lr"] for g in groups if g["name"] == "stream_biases"), None)
    scalar = next((g["lr"] for g in groups if g["name"] == "scalars"), lr * scalar_lr_mult)
    return {"model": type(model).__name__, "stream_biases": len(branches), "lr": lr, "scalar_lr": scalar,
            "stream_bias_lr": budget if budget is not None else scalar, "stream_budget": budget is not None,
            "grad_step": first_step, "branches": first, "stages": stages, "steps": trajectory}
