"""The gated methods, SkipInit and ReZero: every residual branch ``x + alpha * F(x)`` with a scalar gate that starts
at 0, so that every block starts as its shortcut without scaling any weight by depth.

- SkipInit (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep
  Networks", NeurIPS 2020): no normalisation; each branch ends in a learnable scalar gain that starts at 0. The
  paper's reason: BatchNorm shrinks each residual branch by about the square root of the number of blocks before
  it, so a normalised deep network starts close to the identity; SkipInit gets there with one scalar per branch.
- ReZero (Bachlechner, Majumder, Mao, Cottrell & McAuley, "ReZero is All You Need: Fast Convergence at Large
  Depth", 2020): ``x_{i+1} = x_i + alpha_i F(x_i)`` with ``alpha_i = 0`` at the start, and normalisation removed
  (LayerNorm in the Transformer, BatchNorm in convolutional networks). At initialisation the input-output Jacobian
  is the identity (the paper's dynamical-isometry argument); the gates then grow during the first steps.

Both make each block start as its shortcut through the gate, not through its weights: the weights are drawn
unscaled, none in a branch zeroed, and the gate is 0. How they are drawn is the method's ``draw``:
``"standard"`` (the He baseline's rule, or the model's ``init_base``; ReZero, ``skipinit_he``: ReZero's network)
or ``"truncated_fan_in"`` (``skipinit``, as the authors' released SkipInit ResNet, deepmind-research
``nfnets/skipinit_resnet.py``: every weight layer from haiku's default, a normal truncated at 2 std with std
1/sqrt(fan_in), and the classifier at 0; its recipe leaves the gains and biases undecayed, ``Method.decay_gains``).
The report opens with the method's ``summary``. The differences from the authors' code are listed in
docs/methods.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..branch import WeightSlice, find_branches, find_classifier
from ..method import Method
from ..report import GateRecord, GateReport, LayerRecord
from ._layers import check_layer, default_linear_, draw_, draw_standard_, draw_truncated_, model_base, record
from ._skeleton import (
    PlannedBranch,
    handled_modules,
    module_names,
    norm_warnings,
    plan_branches,
    remaining_norms,
    sweep_rest_,
)
from .fans import base_std, fans, groups_of

__all__ = ["gate_init_", "initialise_"]

Draw = Callable[[nn.Module | WeightSlice, str, str], LayerRecord]  # (layer, its name, its He fan) -> its record


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> GateReport:
    """The initialiser of the gated methods: the weights drawn by the method's ``draw``, unscaled, every gate at 0
    (:func:`gate_init_`)."""
    return gate_init_(model, method, generator=generator, base=base, summary=method.summary)


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
    names = module_names(model)
    plan = _plan(model, method, names)
    classifier = find_classifier(model)
    cls_names = [check_layer(layer, "classifier", names) for layer in classifier]
    norms = remaining_norms(model)
    warnings = norm_warnings(norms, f"{method.name} removes it")

    draw = _drawer(base, generator)  # every check has passed: the weights change from here on
    records = [_draw_branch(p, draw, mode, names) for p in plan]
    cls_records = [_draw_classifier(layer, lname, method, base, generator)
                   for layer, lname in zip(classifier, cls_names)]

    def draw_other(mod: nn.Module, name: str) -> LayerRecord:  # outside the branches: the stem's fan (stem_mode)
        if truncated:
            return draw(mod, name, method.stem_mode)
        std = base_std(mod.weight, base, method.stem_mode, groups_of(mod))
        draw_(mod, std, generator)
        return record(name, mod, std)

    rest = sweep_rest_(model, handled_modules(plan, classifier), draw_other)
    return GateReport(method=method.name, num_branches=len(plan), branches=records, classifier=cls_records,
                      other_layers=rest.other, untouched=rest.untouched, num_scalars=rest.num_scalars,
                      normalization=norms, warnings=warnings, fan_mode="fan_in" if truncated else mode, base_init=base,
                      stem_fan_mode="fan_in" if truncated else method.stem_mode, summary=summary)


def _plan(model: nn.Module, method: Method, names: dict[int, str]) -> list[PlannedBranch]:
    """The checked branches; a ValueError for a model without branches or with a branch without its gate."""
    branches = find_branches(model)
    if not branches:
        raise ValueError(f"{type(model).__name__} declares no residual branch; {method.name} gates residual "
                         "branches (see fixup.branch, or fixup.adapt for a model written elsewhere)")
    missing = [block for block, branch in branches if branch.gate is None]
    if missing:
        raise ValueError(f"{method.name}: {len(missing)} residual branches ({', '.join(missing[:3])}) have no "
                         f"gate; build the model for the method (fixup.create_model(name, method={method.name!r})) "
                         "so that each branch ends in its fixup.Gate")
    return plan_branches(branches, names)


def _drawer(base: str, generator: torch.Generator | None) -> Draw:
    """How the method draws a weight layer: by the standard rule ``base`` with the fan given, or (``base``
    ``"truncated_fan_in"``) from the truncated normal of std 1/sqrt(fan_in) whatever the fan."""
    def draw(layer: nn.Module | WeightSlice, lname: str, layer_mode: str) -> LayerRecord:
        if base != "truncated_fan_in":
            return draw_standard_(layer, lname, base, layer_mode, generator)
        std = 1.0 / math.sqrt(fans(layer.weight, groups_of(layer))[0])
        draw_truncated_(layer, std, generator)
        return record(lname, layer, std)
    return draw


def _draw_branch(p: PlannedBranch, draw: Draw, mode: str, names: dict[int, str]) -> GateRecord:
    """One branch: its layers and its shortcut drawn unscaled, its gate at 0."""
    drawn = [draw(layer, lname, mode) for layer, lname in zip(p.branch.layers, p.layer_names)]
    shortcut = None if p.branch.shortcut is None else draw(p.branch.shortcut, p.shortcut, mode)
    p.branch.gate.reset_parameters()
    return GateRecord(p.block, p.branch.kind, p.branch.depth, drawn, f"{names[id(p.branch.gate)]}.scale", shortcut)


def _draw_classifier(layer: nn.Module, lname: str, method: Method, base: str,
                     generator: torch.Generator | None) -> LayerRecord:
    """A classifier layer: at 0 (weight and bias) under the authors' truncated draw; PyTorch's default for a linear
    layer under He; else by ``base`` with the method's ``stem_mode``."""
    if base == "truncated_fan_in":
        draw_(layer, 0.0, generator)
        std = 0.0
    elif base == "he" and isinstance(layer, nn.Linear):
        std = default_linear_(layer, generator)
    else:
        std = base_std(layer.weight, base, method.stem_mode, groups_of(layer))
        draw_(layer, std, generator)
    return record(lname, layer, std)
