"""The Fixup rule as an initialiser in the manner of ``torch.nn.init``.

Zhang, Dauphin & Ma, "Fixup Initialization: Residual Learning Without Normalization", ICLR 2019,
section 3, with L residual branches of m weight layers each:

1. the classifier and the last weight layer of every residual branch start at zero;
2. every other weight layer gets a standard initialisation (He by default; Xavier where that is the
   architecture's standard, as for the Transformer in the authors' fairseq code), and the weights
   inside residual branches are then multiplied by ``L ** (-1 / (2m - 2))``;
3. every branch carries a scalar multiplier (1) and scalar biases (0) before each convolution,
   linear layer and element-wise activation.

Branches are found through the protocol of :mod:`fixup.branch`, never from parameter names.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .branch import WEIGHT_LAYERS, Branch, WeightSlice, find_branches, find_classifier
from .method import FAN_MODES, STREAM_BIAS, Method
from .nn import Bias, Scale
from .report import BranchRecord, FixupReport, LayerRecord, describe_norm, warn_report

__all__ = ["BASE_INITS", "FAN_MODES", "base_std", "branch_scale", "fans", "fixup_init_", "groups_of", "he_std",
           "orthonormal_", "xavier_std"]

# The standard initialisation rule 2 starts from before depth scaling: He et al. (2015) for ReLU
# networks (the paper's ResNets), Glorot & Bengio (2010) "Xavier" for the Transformer, whose
# attention projections are not followed by a ReLU (the authors' fairseq code, Fixup section 5).
BASE_INITS = ("he", "xavier")


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


def groups_of(layer: object) -> int:
    """The number of groups of a weight layer: a grouped or depthwise convolution's ``groups``, else 1."""
    return 1 if isinstance(layer, WeightSlice) else int(getattr(layer, "groups", 1))


def fans(weight: torch.Tensor, groups: int = 1) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of one unit of a weight layer, per group.

    A convolution with ``groups`` splits its channels into independent groups: an output unit reads
    ``in_channels / groups x k^2`` inputs (the weight's second dimension already says so), and an input unit
    feeds ``out_channels / groups x k^2`` outputs. torch's ``_calculate_fan_in_and_fan_out`` counts the
    latter as ``out_channels x k^2`` whatever the groups, which draws a depthwise layer ``sqrt(groups)`` too
    small from its fan-out.
    """
    if int(groups) != groups or groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"groups must be a positive divisor of the weight's {weight.shape[0]} output units, "
                         f"got {groups!r}")
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(weight)
    return fan_in, fan_out // int(groups)


def he_std(weight: torch.Tensor, mode: str = "fan_out", groups: int = 1) -> float:
    """He et al. (2015) normal std ``sqrt(2 / fan)`` for a ReLU network, with the per-group fan of :func:`fans`.

    ``fan_out`` (output channels x kernel size / groups) is the default: it is what the Fixup authors'
    reference code and torchvision's ResNet use; He et al. (section 2.2) show that either fan keeps
    the signal bounded through depth.
    """
    if mode not in FAN_MODES:
        raise ValueError(f"mode must be one of {FAN_MODES}, got {mode!r}")
    fan_in, fan_out = fans(weight, groups)
    return math.sqrt(2.0 / (fan_in if mode == "fan_in" else fan_out))


def xavier_std(weight: torch.Tensor, groups: int = 1) -> float:
    """Glorot & Bengio (2010) normal std ``sqrt(2 / (fan_in + fan_out))``, with the per-group fans."""
    fan_in, fan_out = fans(weight, groups)
    return math.sqrt(2.0 / (fan_in + fan_out))


def base_std(weight: torch.Tensor, base: str = "he", mode: str = "fan_out", groups: int = 1) -> float:
    """The std of the standard initialisation ``base`` ("he" with fan ``mode``, or "xavier")."""
    if base not in BASE_INITS:
        raise ValueError(f"base must be one of {BASE_INITS}, got {base!r}")
    return he_std(weight, mode, groups) if base == "he" else xavier_std(weight, groups)


def orthonormal_(weight: torch.Tensor, groups: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Saxe et al. (2014) orthonormal rows (or columns), drawn group by group for a grouped convolution.

    Each group of ``out_channels / groups`` output units reads only its own inputs, so each group's
    ``(out / groups) x (in / groups * k^2)`` matrix is made orthonormal on its own; a depthwise kernel is one
    unit vector per channel. Returns ``weight``.
    """
    fans(weight, groups)  # checks groups
    with torch.no_grad():
        for block in weight.chunk(int(groups), dim=0):
            nn.init.orthogonal_(block, generator=generator)
    return weight


def _record(name: str, layer: nn.Module | WeightSlice, std: float) -> LayerRecord:
    if isinstance(layer, WeightSlice):
        kind = f"{type(layer.module).__name__}.{layer.param}"
    else:
        kind = type(layer).__name__
    return LayerRecord(name, kind, list(layer.weight.shape), float(std))


def _key(layer: nn.Module | WeightSlice) -> object:
    """What makes two declared layers the same layer (a module, or a block of a parameter)."""
    return layer.key if isinstance(layer, WeightSlice) else id(layer)


def _draw_(layer: nn.Module, std: float, generator: torch.Generator | None) -> None:
    if std == 0.0:
        layer.weight.zero_()
    else:
        layer.weight.normal_(0.0, std, generator=generator)
    if getattr(layer, "bias", None) is not None:
        layer.bias.zero_()


def _check_layer(layer: object, where: str, names: dict[int, str]) -> str:
    if not isinstance(getattr(layer, "weight", None), torch.Tensor):
        raise ValueError(
            f"{where}: {type(layer).__name__} has no `weight` tensor; branch layers must be weight layers "
            "(nn.Linear or nn.Conv*). Declare only the weight layers of the branch, in execution order."
        )
    owner = layer.module if isinstance(layer, WeightSlice) else layer
    if id(owner) not in names:
        raise ValueError(f"{where}: a declared layer ({type(owner).__name__}) is not a submodule of the "
                         "model")
    if isinstance(layer, WeightSlice):
        return f"{names[id(owner)]}.{layer.label()}" if names[id(owner)] else layer.label()
    return names[id(owner)]


def fixup_init_(
    model: nn.Module,
    *,
    generator: torch.Generator | None = None,
    mode: str = "fan_out",
    stem_mode: str | None = None,
    strict: bool = False,
    depth_scaling: bool = True,
    rescale: float = 1.0,
    base: str = "he",
    stream_bias: str | None = None,
    expect_biases: bool = True,
    expect_scale: bool = True,
) -> FixupReport:
    """Apply the Fixup rule to ``model`` in place and return the accounting report.

    Args:
        model: a module whose residual blocks declare their branches (``residual_branches()``) and
            which names its classifier (``classifier_layers()``).
        generator: the random generator for the He draws, for reproducible initialisation.
        mode: He fan convention of the branch layers and shortcut projections, ``"fan_out"`` (default) or
            ``"fan_in"``.
        stem_mode: He fan convention of every other weight layer outside the residual branches (in the
            library's models, the stem). Default: the model's method's (``"fan_in"`` for ``fixup`` and its
            ablations, ``"fan_out"`` for ``fixup_paper``), and ``"fan_in"`` for a model without one. Without
            normalisation the stem alone sets the scale of the residual stream, and every block starts as the
            identity, so the classifier first sees the stem's scale: a fan-in draw keeps the input's, a fan-out
            draw shrinks it by ``sqrt(fan_in / fan_out)`` (1/4 for one input channel into 16).
        strict: raise, instead of warning, when a branch lacks its scalar multiplier or biases, a
            normalisation layer is still present, or no classifier is declared.
        depth_scaling: apply rule 2's factor (``False`` is the paper's "no depth scaling" ablation).
        rescale: multiply rule 2's factor by this number (0.1 and 10 are the paper's ablations).
        base: the standard initialisation of rule 2, drawn from a normal distribution: ``"he"``
            (default, ``sqrt(2 / fan)`` with ``mode``) or ``"xavier"`` (``sqrt(2 / (fan_in + fan_out))``,
            what the authors' Transformer starts from). It applies to branch layers before depth
            scaling, to shortcut projections and to other weight layers alike.

    Every check runs before any weight changes, so a model is never left half-initialised. Each warning
    of the report is also issued as a :class:`fixup.FixupWarning`.
    Calling it again draws a fresh model from the same distribution and gives the same report.
    """
    if mode not in FAN_MODES:
        raise ValueError(f"mode must be one of {FAN_MODES}, got {mode!r}")
    own = getattr(model, "method", None)
    stem_mode = stem_mode or (own.stem_mode if isinstance(own, Method) else "fan_in")
    if stem_mode not in FAN_MODES:
        raise ValueError(f"stem_mode must be one of {FAN_MODES}, got {stem_mode!r}")
    if base not in BASE_INITS:
        raise ValueError(f"base must be one of {BASE_INITS}, got {base!r}")
    if not (rescale > 0 and math.isfinite(rescale)):
        raise ValueError(f"rescale must be a positive finite number, got {rescale!r}")
    stream = stream_bias or (own.stream_bias if isinstance(own, Method) else "budget")
    if stream not in STREAM_BIAS:
        raise ValueError(f"stream_bias must be one of {STREAM_BIAS}, got {stream_bias!r}")
    names = {id(mod): name for name, mod in model.named_modules()}
    branches = find_branches(model)
    if not branches:
        raise ValueError(
            f"{type(model).__name__} declares no residual branch. Fixup needs residual blocks that define "
            "`residual_branches()` (see fixup.branch), or run fixup.adapt(model, example_input) on a model "
            "written elsewhere."
        )
    L = len(branches)
    warnings: list[str] = []
    seen: dict[object, str] = {}
    plan: list[tuple[str, Branch, list[str], str | None]] = []
    for block, branch in branches:
        if not branch.layers:
            raise ValueError(f"residual branch {block!r} declares no weight layer; a branch needs at least one "
                             "(its last weight layer is the one rule 1 zeroes)")
        layer_names = [_check_layer(layer, f"branch {block!r}", names) for layer in branch.layers]
        for layer, lname in zip(branch.layers, layer_names):
            if _key(layer) in seen:
                raise ValueError(f"weight layer {lname!r} is declared in two residual branches "
                                 f"({seen[_key(layer)]!r} and {block!r}); a layer shared between branches "
                                 "cannot be counted")
            seen[_key(layer)] = block
        if branch.depth < 1:
            raise ValueError(f"residual branch {block!r} has m={branch.depth}; m must be at least 1")
        short = None
        if branch.shortcut is not None:
            short = _check_layer(branch.shortcut, f"shortcut of {block!r}", names)
        if branch.scale is None and expect_scale:
            warnings.append(f"branch {block!r} has no scalar multiplier (rule 3)")
        if not branch.all_biases and expect_biases:
            warnings.append(f"branch {block!r} has no scalar biases (rule 3)")
        plan.append((block, branch, layer_names, short))
    classifier = find_classifier(model)
    cls_names = [_check_layer(layer, "classifier", names) for layer in classifier]
    if not classifier:
        warnings.append(f"{type(model).__name__} declares no classifier (`classifier_layers()`); "
                        "no output layer was zeroed")
    norms = [rec for name, mod in model.named_modules() if (rec := describe_norm(name, mod)) is not None]
    for rec in norms:
        warnings.append(f"normalisation layer {rec.name!r} ({rec.type}) is still present; Fixup replaces it")
    if strict and warnings:
        raise ValueError("fixup_init_(strict=True) refused the model:\n  - " + "\n  - ".join(warnings))

    records: list[BranchRecord] = []
    # Modules whose weights the rule set; a module declared through WeightSlices counts as handled.
    handled = {id(layer.module) if isinstance(layer, WeightSlice) else id(layer)
               for _, branch, _, _ in plan for layer in branch.layers} | {id(c) for c in classifier}
    with torch.no_grad():
        for block, branch, layer_names, short in plan:
            m = branch.depth
            factor = (branch_scale(L, m) if depth_scaling else 1.0) * rescale
            scaled = []
            for layer, lname in zip(branch.layers[:-1], layer_names[:-1]):
                std = base_std(layer.weight, base, mode, groups_of(layer)) * factor
                _draw_(layer, std, generator)
                scaled.append(_record(lname, layer, std))
            last = branch.layers[-1]
            _draw_(last, 0.0, generator)
            for scalar in (*branch.all_biases, *([branch.scale] if branch.scale is not None else [])):
                scalar.reset_parameters()
            shortcut_rec = None
            if branch.shortcut is not None:
                std = base_std(branch.shortcut.weight, base, mode, groups_of(branch.shortcut))
                _draw_(branch.shortcut, std, generator)
                shortcut_rec = _record(short, branch.shortcut, std)
                handled.add(id(branch.shortcut))
            records.append(BranchRecord(block, branch.kind, m, factor, scaled, _record(layer_names[-1], last, 0.0),
                                        len(branch.all_biases), branch.scale is not None, shortcut_rec,
                                        branch.stream_bias is not None))
        cls_records = []
        for layer, lname in zip(classifier, cls_names):
            _draw_(layer, 0.0, generator)
            cls_records.append(_record(lname, layer, 0.0))
        other, untouched, num_scalars = [], [], 0
        for name, mod in model.named_modules():
            if isinstance(mod, (Bias, Scale)):
                mod.reset_parameters()
                num_scalars += 1
            elif isinstance(mod, WEIGHT_LAYERS) and id(mod) not in handled:
                std = base_std(mod.weight, base, stem_mode, groups_of(mod))
                _draw_(mod, std, generator)
                other.append(_record(name, mod, std))
            elif id(mod) not in handled and any(True for _ in mod.parameters(recurse=False)):
                untouched.append(f"{name} ({type(mod).__name__})")
    num_stream = sum(b.stream_bias is not None for _, b in branches)
    report = FixupReport(
        num_branches=L, branches=records, classifier=cls_records, other_layers=other, untouched=untouched,
        num_scalars=num_scalars, normalization=norms, warnings=warnings,
        method="fixup" if depth_scaling and rescale == 1.0 else "fixup (ablation)",
        fan_mode=mode, stem_fan_mode=stem_mode, depth_scaling=depth_scaling, rescale=rescale, base_init=base,
        num_stream_biases=num_stream, stream_bias=stream if num_stream else "none",
    )
    warn_report(report)
    return report
