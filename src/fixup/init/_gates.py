"""What SkipInit and ReZero share: every residual branch ``x + alpha * F(x)`` with a scalar gate that starts at 0.

Both methods make each block start as its shortcut through a learnable scalar on the branch, not through its
weights: the weights are drawn unscaled, none in a branch zeroed, and the gate is 0. How they are drawn is the
method's ``draw``: ``"standard"`` (the He baseline's rule, or the model's ``init_base``; ReZero, ``skipinit_he``)
or ``"truncated_fan_in"`` (every weight layer from a truncated normal of std 1/sqrt(fan_in) and the classifier at
0, as De & Smith's released SkipInit ResNet; ``skipinit``). Each method's module (:mod:`fixup.init.skipinit`,
:mod:`fixup.init.rezero`) calls :func:`gate_init_` and says what it does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..branch import WEIGHT_LAYERS, WeightSlice, find_branches, find_classifier
from ..method import Method
from ..nn import Bias, Scale
from ..report import GateRecord, GateReport, LayerRecord, describe_norm
from ._layers import check_layer, default_linear_, draw_, draw_standard_, draw_truncated_, layer_key, model_base, record
from .fans import base_std, fans, groups_of

__all__ = ["gate_init_"]


@torch.no_grad()
def gate_init_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None, base: str | None = None,
               mode: str = "fan_out", summary: str = "") -> GateReport:
    """Draw every weight layer of ``model`` and set every branch's gate to 0; return the accounting report.

    Under the method's ``draw="standard"``: by ``base`` (He with ``mode`` in the branches and shortcuts, with the
    method's ``stem_mode`` elsewhere; a linear classifier as PyTorch's default under He). Under
    ``"truncated_fan_in"``: every weight layer from a normal truncated at 2 std, of std 1/sqrt(fan_in) per group,
    and the classifier at 0 (``base`` and ``mode`` do not apply: giving ``base`` is an error). Every bias 0.
    Raises, before any weight changes, if a branch has no gate."""
    truncated = method.draw == "truncated_fan_in"
    if truncated and base is not None:
        raise ValueError(f"{method.name} draws every weight from a truncated normal of std 1/sqrt(fan_in), as its "
                         f"authors' code, so base={base!r} does not apply; leave base out, or use 'skipinit_he' "
                         "(fixup.create_model) or 'rezero' (also in fixup.adapt), which draw from a standard base")
    base = "truncated_fan_in" if truncated else model_base(model, base)

    def draw(layer: nn.Module | WeightSlice, lname: str, layer_mode: str) -> LayerRecord:
        if not truncated:
            return draw_standard_(layer, lname, base, layer_mode, generator)
        std = 1.0 / math.sqrt(fans(layer.weight, groups_of(layer))[0])
        draw_truncated_(layer, std, generator)
        return record(lname, layer, std)

    names = {id(mod): name for name, mod in model.named_modules()}
    branches = find_branches(model)
    if not branches:
        raise ValueError(f"{type(model).__name__} declares no residual branch; {method.name} gates residual "
                         "branches (see fixup.branch, or fixup.adapt for a model written elsewhere)")
    missing = [block for block, branch in branches if branch.gate is None]
    if missing:
        raise ValueError(f"{method.name}: {len(missing)} residual branches ({', '.join(missing[:3])}) have no "
                         f"gate; build the model for the method (fixup.create_model(name, method={method.name!r})) "
                         "so that each branch ends in its fixup.Gate")
    seen: dict[object, str] = {}
    plan = []
    for block, branch in branches:
        layer_names = [check_layer(layer, f"branch {block!r}", names) for layer in branch.layers]
        for layer, lname in zip(branch.layers, layer_names):
            if layer_key(layer) in seen:
                raise ValueError(f"weight layer {lname!r} is declared in two residual branches "
                                 f"({seen[layer_key(layer)]!r} and {block!r})")
            seen[layer_key(layer)] = block
        short = None if branch.shortcut is None else check_layer(branch.shortcut, f"shortcut of {block!r}", names)
        plan.append((block, branch, layer_names, short))
    classifier = find_classifier(model)
    cls_names = [check_layer(layer, "classifier", names) for layer in classifier]
    norms = [rec for name, mod in model.named_modules() if (rec := describe_norm(name, mod)) is not None]
    warnings = [f"normalisation layer {rec.name!r} ({rec.type}) is still present; {method.name} removes it"
                for rec in norms]

    handled = {id(layer.module) if isinstance(layer, WeightSlice) else id(layer)
               for _, branch, _, _ in plan for layer in branch.layers} | {id(c) for c in classifier}
    records = []
    for block, branch, layer_names, short in plan:
        drawn = [draw(layer, lname, mode) for layer, lname in zip(branch.layers, layer_names)]
        shortcut = None
        if branch.shortcut is not None:
            shortcut = draw(branch.shortcut, short, mode)
            handled.add(id(branch.shortcut))
        branch.gate.reset_parameters()
        records.append(GateRecord(block, branch.kind, branch.depth, drawn, f"{names[id(branch.gate)]}.scale", shortcut))
    cls_records = []
    for layer, lname in zip(classifier, cls_names):
        if truncated:  # the authors' classifier starts at 0 (weight and bias)
            draw_(layer, 0.0, generator)
            std = 0.0
        elif base == "he" and isinstance(layer, nn.Linear):
            std = default_linear_(layer, generator)
        else:
            std = base_std(layer.weight, base, method.stem_mode, groups_of(layer))
            draw_(layer, std, generator)
        cls_records.append(record(lname, layer, std))
    other, untouched, num_scalars = [], [], 0
    for name, mod in model.named_modules():
        if isinstance(mod, (Bias, Scale)):
            mod.reset_parameters()
            num_scalars += 1
        elif isinstance(mod, WEIGHT_LAYERS) and id(mod) not in handled:
            if truncated:
                other.append(draw(mod, name, method.stem_mode))
            else:
                std = base_std(mod.weight, base, method.stem_mode, groups_of(mod))
                draw_(mod, std, generator)
                other.append(record(name, mod, std))
        elif id(mod) not in handled and describe_norm(name, mod) is None and any(
                True for _ in mod.parameters(recurse=False)):
            untouched.append(f"{name} ({type(mod).__name__})")
    return GateReport(method=method.name, num_branches=len(branches), branches=records, classifier=cls_records,
                      other_layers=other, untouched=untouched, num_scalars=num_scalars, normalization=norms,
                      warnings=warnings, fan_mode="fan_in" if truncated else mode, base_init=base,
                      stem_fan_mode="fan_in" if truncated else method.stem_mode,
                      summary=summary)
