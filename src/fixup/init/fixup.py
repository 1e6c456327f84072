"""Fixup: the rule as an initialiser in the manner of ``torch.nn.init`` (the ``fixup`` forms of the table).

Zhang, Dauphin & Ma, "Fixup Initialization: Residual Learning Without Normalization", ICLR 2019,
section 3, with L residual branches of m weight layers each:

1. the classifier and the last weight layer of every residual branch start at zero;
2. every other weight layer gets a standard initialisation (He by default; Xavier where that is the
   architecture's standard, as for the Transformer in the authors' fairseq code), and the weights
   inside residual branches are then multiplied by ``L ** (-1 / (2m - 2))``;
3. every branch carries a scalar multiplier (1) and scalar biases (0) before each convolution,
   linear layer and element-wise activation.

Branches are found through the protocol of :mod:`fixup.branch`, never from parameter names. The
:class:`~fixup.method.Method` says which form (the ablations of section 4.3, our corrections); a model
re-initialised without one uses its own.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..branch import Branch, find_branches, find_classifier
from ..method import METHODS, Method, as_method
from ..report import BranchRecord, FixupReport, LayerRecord, warn_report
from ._layers import check_layer, draw_, draw_standard_, model_base, record
from ._skeleton import (
    PlannedBranch,
    handled_modules,
    module_names,
    norm_warnings,
    plan_branches,
    remaining_norms,
    sweep_rest_,
)
from .fans import FAN_MODES, base_std, groups_of

__all__ = ["branch_scale", "fixup_init_", "initialise_", "zero_branches_"]


def branch_scale(L: int, m: int) -> float:
    """Fixup's factor for the weights inside a residual branch: ``L ** (-1 / (2m - 2))``.

    ``L`` is the number of residual branches in the whole model and ``m`` the weight layers of this
    branch. m = 2 gives L^-1/2, m = 3 gives L^-1/4. With m = 1 the only layer is the zeroed one,
    so there is nothing to scale and the factor is 1.
    """
    if int(L) != L or L < 1:
        raise ValueError(f"L must be a positive whole number of residual branches, got {L!r}")
    if int(m) != m or m < 1:
        raise ValueError(f"m must be a positive whole number of weight layers per branch, got {m!r}")
    if m == 1:
        return 1.0
    return float(L) ** (-1.0 / (2 * m - 2))


def _resolve(model: nn.Module, method: Method | str | None,
             overrides: dict[str, object]) -> tuple[Method, str, list[str]]:
    """The Fixup form to apply, the name the report gives it, and the warnings the choice needs.

    ``method`` if given; else the model's own where it was built for a Fixup form; else ``fixup`` (a model
    written elsewhere, or one built for another method: said in a warning). Keyword overrides change fields.
    """
    warnings: list[str] = []
    if method is not None:
        chosen = as_method(method)
        if not chosen.fixup:
            raise ValueError(f"fixup_init_ applies the Fixup forms; method {chosen.name!r} is not one. "
                             f"fixup.init.initialise_(model, {chosen.name!r}) initialises a model for any method")
    else:
        own = getattr(model, "method", None)
        if isinstance(own, Method) and own.fixup:
            chosen = own
        else:
            chosen = METHODS["fixup"]
            if isinstance(own, Method):
                warnings.append(f"{type(model).__name__} was built for method {own.name!r}; fixup_init_ applied "
                                f"'fixup' instead (fixup.init.initialise_(model) re-initialises it by its own method)")
    changes = {k: v for k, v in overrides.items() if v is not None and getattr(chosen, k) != v}
    if not changes:
        return chosen, chosen.init, warnings
    return dataclasses.replace(chosen, **changes), f"{chosen.init} (ablation)", warnings


def fixup_init_(
    model: nn.Module,
    method: Method | str | None = None,
    *,
    generator: torch.Generator | None = None,
    mode: str = "fan_out",
    base: str | None = None,
    strict: bool = False,
    stem_mode: str | None = None,
    depth_scaling: bool | None = None,
    rescale: float | None = None,
    stream_bias: str | None = None,
    expect_biases: bool | None = None,
    expect_scale: bool | None = None,
) -> FixupReport:
    """Apply the Fixup rule to ``model`` in place and return the accounting report.

    Args:
        model: a module whose residual blocks declare their branches (``residual_branches()``) and
            which names its classifier (``classifier_layers()``).
        method: the Fixup form (a :class:`~fixup.method.Method` or a name of :data:`fixup.METHODS`). Default:
            the model's own (``model.method``) where it was built for a Fixup form, so that re-initialising a
            model built with ``init="fixup_no_depth_scale"`` keeps its ablation; ``fixup`` otherwise, with a
            warning where the model was built for another method.
        generator: the random generator for the He draws, for reproducible initialisation.
        mode: He fan convention of the branch layers and shortcut projections, ``"fan_out"`` (default) or
            ``"fan_in"``.
        base: the standard initialisation of rule 2, drawn from a normal distribution: ``"he"``
            (``sqrt(2 / fan)`` with ``mode``) or ``"xavier"`` (``sqrt(2 / (fan_in + fan_out))``, what the
            authors' Transformer starts from). Default: the one the model declares (``init_base``), else He.
            It applies to branch layers before depth scaling, to shortcut projections and to other weight
            layers alike.
        strict: raise, instead of warning, when a branch lacks its scalar multiplier or biases, a
            normalisation layer is still present, or no classifier is declared.
        stem_mode, depth_scaling, rescale, stream_bias: override the method's field of that name (the He fan
            of the layers outside the branches, rule 2's factor on or off, a factor on rule 2's factor, where
            the stream biases learn); the report then names the method ``"<name> (ablation)"``.
        expect_biases, expect_scale: whether a branch without scalar biases / multiplier is a warning
            (default: the method's ``biases`` / ``scale``).

    Every check runs before any weight changes, so a model is never left half-initialised. Each warning
    of the report is also issued as a :class:`fixup.FixupWarning`.
    Calling it again draws a fresh model from the same distribution and gives the same report.
    """
    _check_mode(mode)
    base = model_base(model, base)
    overrides = {"stem_mode": stem_mode, "depth_scaling": depth_scaling, "rescale": rescale, "stream_bias": stream_bias}
    chosen, label, warnings = _resolve(model, method, overrides)
    report = _fixup_init(model, chosen, label, warnings, generator=generator, mode=mode, base=base, strict=strict,
                         expect_biases=expect_biases, expect_scale=expect_scale)
    warn_report(report)
    return report


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> FixupReport:
    """The initialiser of the Fixup forms in :data:`fixup.METHODS` (called by :func:`fixup.init.initialise_`, which
    resolved ``method``: it is applied as it is)."""
    if not method.fixup:
        raise ValueError(f"fixup_init_ applies the Fixup forms; method {method.name!r} is not one. "
                         f"fixup.init.initialise_(model, {method.name!r}) initialises a model for any method")
    return _fixup_init(model, method, method.init, [], generator=generator, base=base)


def _check_mode(mode: str) -> None:
    if mode not in FAN_MODES:
        raise ValueError(f"mode must be one of {FAN_MODES}, got {mode!r}")


@torch.no_grad()
def _fixup_init(model: nn.Module, chosen: Method, label: str, warnings: list[str], *,
                generator: torch.Generator | None = None, mode: str = "fan_out", base: str | None = None,
                strict: bool = False, expect_biases: bool | None = None,
                expect_scale: bool | None = None) -> FixupReport:
    """Apply the Fixup form ``chosen`` (reported as ``label``, with the ``warnings`` its choice needed)."""
    _check_mode(mode)
    base = model_base(model, base)
    names = module_names(model)
    branches = find_branches(model)
    plan = _plan(model, branches, names, chosen.biases if expect_biases is None else expect_biases,
                 chosen.scale if expect_scale is None else expect_scale, warnings)
    classifier = find_classifier(model)
    cls_names = [check_layer(layer, "classifier", names) for layer in classifier]
    if not classifier:
        warnings.append(f"{type(model).__name__} declares no classifier (`classifier_layers()`); "
                        "no output layer was zeroed")
    norms = remaining_norms(model)
    warnings += norm_warnings(norms, "Fixup replaces it")
    if strict and warnings:
        raise ValueError("fixup_init_(strict=True) refused the model:\n  - " + "\n  - ".join(warnings))

    handled = handled_modules(plan, classifier)  # every check has passed: the weights change from here on
    records = [_draw_branch(p, len(branches), chosen, base, mode, generator) for p in plan]
    cls_records = []
    for layer, lname in zip(classifier, cls_names):  # rule 1: the classifier starts at zero
        draw_(layer, 0.0, generator)
        cls_records.append(record(lname, layer, 0.0))

    def draw_other(mod: nn.Module, name: str) -> LayerRecord:  # outside the branches: the stem's fan (stem_mode)
        std = base_std(mod.weight, base, chosen.stem_mode, groups_of(mod))
        draw_(mod, std, generator)
        return record(name, mod, std)

    rest = sweep_rest_(model, handled, draw_other, norms_left_alone=True)
    num_stream = sum(b.stream_bias is not None for _, b in branches)
    report = FixupReport(
        num_branches=len(branches), branches=records, classifier=cls_records, other_layers=rest.other,
        untouched=rest.untouched, num_scalars=rest.num_scalars, normalization=norms, warnings=warnings,
        method=label, fan_mode=mode, stem_fan_mode=chosen.stem_mode, depth_scaling=chosen.depth_scaling,
        rescale=chosen.rescale, base_init=base, num_stream_biases=num_stream,
        stream_bias=chosen.stream_bias if num_stream else "none",
    )
    if chosen.zero_branch:
        zero_branches_(model, report)
    for present, what in ((chosen.biases, "no scalar biases"), (chosen.scale, "no scalar multiplier")):
        if not present:  # left out by design: a note, not a warning
            report.notes.append(f"{len(branches)} branches have {what} (rule 3): the {chosen.init} ablation leaves "
                                "them out")
    return report


def _plan(model: nn.Module, branches: list[tuple[str, Branch]], names: dict[int, str], expect_biases: bool,
          expect_scale: bool, warnings: list[str]) -> list[PlannedBranch]:
    """The checked branches (a ValueError for a model Fixup cannot count); a warning in ``warnings`` for each
    branch without the scalars rule 3 expects."""
    if not branches:
        raise ValueError(
            f"{type(model).__name__} declares no residual branch. Fixup needs residual blocks that define "
            "`residual_branches()` (see fixup.branch), or run fixup.adapt(model, example_input) on a model "
            "written elsewhere."
        )
    for block, branch in branches:
        if not branch.layers:
            raise ValueError(f"residual branch {block!r} declares no weight layer; a branch needs at least one "
                             "(its last weight layer is the one rule 1 zeroes)")
    plan = plan_branches(branches, names)
    for p in plan:
        if p.branch.depth < 1:
            raise ValueError(f"residual branch {p.block!r} has m={p.branch.depth}; m must be at least 1")
        if p.branch.scale is None and expect_scale:
            warnings.append(f"branch {p.block!r} has no scalar multiplier (rule 3)")
        if not p.branch.all_biases and expect_biases:
            warnings.append(f"branch {p.block!r} has no scalar biases (rule 3)")
    return plan


def _draw_branch(p: PlannedBranch, L: int, chosen: Method, base: str, mode: str,
                 generator: torch.Generator | None) -> BranchRecord:
    """Rules 1-3 on one branch: its inner layers drawn by ``base`` times rule 2's factor, its last layer (of each
    path, ``Branch.ends``) zero, its scalars at their start (biases 0, multiplier 1); its shortcut projection drawn by
    ``base``, unscaled."""
    branch, m, k = p.branch, p.branch.depth, len(p.branch.inner)
    factor = (branch_scale(L, m) if chosen.depth_scaling else 1.0) * chosen.rescale
    scaled = [draw_standard_(layer, lname, base, mode, generator, factor)
              for layer, lname in zip(branch.inner, p.layer_names[:k])]
    zeroed = []
    for layer, lname in zip(branch.zeroed, p.layer_names[k:]):  # rule 1: the last layer of each path
        draw_(layer, 0.0, generator)
        zeroed.append(record(lname, layer, 0.0))
    for scalar in (*branch.all_biases, *([branch.scale] if branch.scale is not None else [])):
        scalar.reset_parameters()
    shortcut = None if branch.shortcut is None else draw_standard_(branch.shortcut, p.shortcut, base, mode, generator)
    return BranchRecord(p.block, branch.kind, m, factor, scaled, zeroed[0], len(branch.all_biases),
                        branch.scale is not None, shortcut, branch.stream_bias is not None, zeroed[1:])


@torch.no_grad()
def zero_branches_(model: nn.Module, report: FixupReport | None = None) -> list[str]:
    """Zero every weight of every residual branch (the "zero branch" ablation); returns their names.

    The scalar biases and multipliers stay as they are; shortcut projections are not branch weights.
    With a report, its branch records are updated (factor 0, every std 0) and the names added to ``zeroed``.
    """
    names = {id(mod): name for name, mod in model.named_modules()}
    zeroed = []
    for _, branch in find_branches(model):
        for layer in branch.layers:
            layer.weight.zero_()
            if getattr(layer, "bias", None) is not None:
                layer.bias.zero_()
            owner = getattr(layer, "module", layer)
            zeroed.append(names.get(id(owner), type(owner).__name__))
    if report is not None:
        for b in report.branches:
            b.factor = 0.0
            for rec in b.scaled:
                rec.std = 0.0
        report.zeroed.extend(f"{n} (branch weight)" for n in zeroed)
    return zeroed
