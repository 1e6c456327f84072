"""The skeleton every initialiser of :mod:`fixup.init` shares around its own rule.

Each initialiser (Fixup, the gated methods, NF-ResNets, T-Fixup) does the same three things around the layers its
rule sets: it checks and lists the declared branches (:func:`plan_branches`: every layer a weight layer of the
model, none shared between branches), lists the normalisation layers still present (:func:`remaining_norms`,
:func:`norm_warnings`), and finally sweeps the rest of the model (:func:`sweep_rest_`: every scalar back to its
start, every weight layer its rule did not set drawn by the initialiser's rule for the rest, every other module
with parameters listed as left alone). The plain initialisers, which draw every layer alike, report through
:func:`plain_report`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import nn

from ..branch import WEIGHT_LAYERS, Branch, WeightSlice, find_branches
from ..nn import Bias, Scale
from ..report import InitReport, LayerRecord, NormRecord, describe_norm
from ._layers import check_layer, layer_key, named_weight_layers

__all__ = ["PlannedBranch", "Rest", "handled_modules", "module_names", "norm_warnings", "plain_report",
           "plan_branches", "remaining_norms", "sweep_rest_"]


@dataclass
class PlannedBranch:
    """A declared residual branch, checked: its block's name, the branch, its layers' names and its shortcut's."""

    block: str
    branch: Branch
    layer_names: list[str]
    shortcut: str | None


@dataclass
class Rest:
    """What :func:`sweep_rest_` found outside the initialiser's own rule."""

    other: list[LayerRecord] = field(default_factory=list)  # the weight layers it drew
    untouched: list[str] = field(default_factory=list)  # "name (Type)" of the modules with parameters left alone
    num_scalars: int = 0  # the Fixup scalars and gates set back to their start


def module_names(model: nn.Module) -> dict[int, str]:
    """Every submodule's qualified name, by ``id``."""
    return {id(mod): name for name, mod in model.named_modules()}


def plan_branches(branches: list[tuple[str, Branch]], names: dict[int, str]) -> list[PlannedBranch]:
    """The declared branches with their layers' names, after checking that every declared layer is a weight layer
    of the model and that no layer is declared in two branches (it could not be counted); a ValueError otherwise."""
    seen: dict[object, str] = {}
    plan = []
    for block, branch in branches:
        layer_names = [check_layer(layer, f"branch {block!r}", names) for layer in branch.layers]
        for layer, lname in zip(branch.layers, layer_names):
            if layer_key(layer) in seen:
                raise ValueError(f"weight layer {lname!r} is declared in two residual branches "
                                 f"({seen[layer_key(layer)]!r} and {block!r}); a layer shared between branches "
                                 "cannot be counted")
            seen[layer_key(layer)] = block
        short = None if branch.shortcut is None else check_layer(branch.shortcut, f"shortcut of {block!r}", names)
        plan.append(PlannedBranch(block, branch, layer_names, short))
    return plan


def handled_modules(plan: list[PlannedBranch], classifier: Iterable[nn.Module]) -> set[int]:
    """The ``id`` of every module the rule sets: each branch layer (a module declared through
    :class:`~fixup.branch.WeightSlice` counts whole), each shortcut projection and the classifier."""
    layers = {id(layer.module) if isinstance(layer, WeightSlice) else id(layer)
              for p in plan for layer in p.branch.layers}
    shortcuts = {id(p.branch.shortcut) for p in plan if p.branch.shortcut is not None}
    return layers | shortcuts | {id(c) for c in classifier}


def remaining_norms(model: nn.Module) -> list[NormRecord]:
    """A record of every normalisation layer still in ``model``, in module order."""
    return [rec for name, mod in model.named_modules() if (rec := describe_norm(name, mod)) is not None]


def norm_warnings(norms: list[NormRecord], consequence: str) -> list[str]:
    """One warning per normalisation layer still present, each ending with ``consequence`` (what the method
    does about normalisation, e.g. ``"Fixup replaces it"``)."""
    return [f"normalisation layer {rec.name!r} ({rec.type}) is still present; {consequence}" for rec in norms]


def plain_report(model: nn.Module, method: str, scheme: str, layers: list[LayerRecord], scalars: int) -> InitReport:
    """The report of an initialiser that drew every weight layer the same way (``layers``)."""
    handled = {id(m) for _, m in named_weight_layers(model)}
    untouched = [f"{name} ({type(mod).__name__})" for name, mod in model.named_modules()
                 if id(mod) not in handled and describe_norm(name, mod) is None
                 and not isinstance(mod, (Bias, Scale)) and any(True for _ in mod.parameters(recurse=False))]
    return InitReport(method=method, num_branches=len(find_branches(model)), other_layers=layers,
                      untouched=untouched, num_scalars=scalars, normalization=remaining_norms(model), scheme=scheme)


def sweep_rest_(model: nn.Module, handled: set[int],
                draw: Callable[[nn.Module, str], LayerRecord] | None = None, *,
                norms_left_alone: bool = False) -> Rest:
    """Go once through ``model`` in module order: every :class:`~fixup.nn.Bias` and :class:`~fixup.nn.Scale` (gates
    included) back to its start; every weight layer not in ``handled`` drawn by ``draw`` (``None``: left alone);
    every other module with parameters of its own and not in ``handled`` listed as left alone, normalisation
    layers only with ``norms_left_alone`` (the reports that list them apart leave them out)."""
    rest = Rest()
    for name, mod in model.named_modules():
        if isinstance(mod, (Bias, Scale)):
            mod.reset_parameters()
            rest.num_scalars += 1
        elif draw is not None and isinstance(mod, WEIGHT_LAYERS) and id(mod) not in handled:
            rest.other.append(draw(mod, name))
        elif (id(mod) not in handled and (norms_left_alone or describe_norm(name, mod) is None)
              and any(True for _ in mod.parameters(recurse=False))):
            rest.untouched.append(f"{name} ({type(mod).__name__})")
    return rest
