"""The methods Fixup is compared against, its ablations, and the one place that initialises a model for one.

A *method* is a ``(norm, init)`` pair (Zhang, Dauphin & Ma, ICLR 2019, sections 4-5 and appendix):

- ``norm="fixup"``: Fixup (rules 1-3 of section 3), or one of its ablations (section 4.3, table 3):
  ``fixup_no_depth_scale`` (rule 2's factor removed), ``fixup_scale_x0.1`` / ``fixup_scale_x10``
  (the factor times 0.1 / 10), ``fixup_zero_branch`` (every branch weight zero),
  ``fixup_no_bias`` (no scalar biases), ``fixup_no_scale`` (no scalar multiplier).
- ``norm="none"``: no normalisation and no scalars, with ``he`` (He et al. 2015), ``xavier`` (Glorot &
  Bengio 2010), ``lsuv`` (Mishkin & Matas 2016; needs a data batch, see :func:`data_init_`) or
  ``sqrt2`` (He, and every residual block's output ``x + F(x)`` multiplied by 1/sqrt(2): the depth
  study's baseline, section 4.1).
- ``norm="batchnorm"`` / ``"groupnorm"``: the normalised baselines, He-initialised; ``norm="layernorm"``
  (the Transformer's baseline) with Xavier, as the authors' fairseq code (section 5).

Builders call :func:`resolve_method` before building (the method decides which scalars exist and the
blocks' output scale) and :func:`initialise_` after; every method leaves ``model.init_report``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .branch import WEIGHT_LAYERS, find_branches
from .init import fixup_init_
from .lsuv import lsuv_
from .nn import Bias, Scale
from .report import FixupReport, LayerRecord, LSUVRecord, describe_norm

__all__ = [
    "METHODS",
    "Method",
    "data_init_",
    "he_init_",
    "initialise_",
    "lsuv_",
    "orthonormal_init_",
    "resolve_method",
    "xavier_init_",
    "zero_branches_",
    "zero_last_norm_gains_",
]

SQRT_HALF = 1.0 / math.sqrt(2.0)  # the 1/sqrt(2) residual rescaling of the depth study (section 4.1)


@dataclass(frozen=True)
class Method:
    """One ``(norm, init)`` combination and what it asks of the architecture and of the initialiser."""

    norm: str
    init: str
    description: str
    biases: bool = False  # branches carry Fixup's scalar biases (rule 3)
    scale: bool = False  # branches carry Fixup's scalar multiplier (rule 3)
    output_scale: float = 1.0  # multiplier on each residual block's output x + F(x)
    depth_scaling: bool = True  # rule 2's factor L^(-1/(2m-2)) (Fixup forms only)
    rescale: float = 1.0  # rule 2's factor times this (Fixup forms only)
    zero_branch: bool = False  # every weight of every residual branch zero (ablation)

    @property
    def fixup(self) -> bool:
        return self.norm == "fixup"

    @property
    def needs_data(self) -> bool:
        """Whether the method finishes only once it has seen a batch (:func:`data_init_`)."""
        return self.init == "lsuv"


def _fixup(init: str, description: str, **kw: object) -> Method:
    return Method("fixup", init, description, **{"biases": True, "scale": True, **kw})  # type: ignore[arg-type]


_NORMED = "He-initialised convolutions, normalisation gain 1 and shift 0"
METHODS: dict[str, dict[str, Method]] = {
    "fixup": {m.init: m for m in (
        _fixup("fixup", "Fixup: rules 1-3 (section 3)"),
        _fixup("fixup_no_depth_scale", "Fixup without rule 2's depth factor (ablation)", depth_scaling=False),
        _fixup("fixup_scale_x0.1", "Fixup with rule 2's factor times 0.1 (ablation)", rescale=0.1),
        _fixup("fixup_scale_x10", "Fixup with rule 2's factor times 10 (ablation)", rescale=10.0),
        _fixup("fixup_zero_branch", "Fixup with every residual-branch weight zero (ablation)", zero_branch=True),
        _fixup("fixup_no_bias", "Fixup without the scalar biases (ablation)", biases=False),
        _fixup("fixup_no_scale", "Fixup without the scalar multiplier (ablation)", scale=False),
    )},
    "none": {m.init: m for m in (
        Method("none", "he", "no normalisation, He initialisation"),
        Method("none", "xavier", "no normalisation, Xavier (Glorot) initialisation"),
        Method("none", "lsuv", "no normalisation, LSUV (orthonormal, then unit output variance per layer)"),
        Method("none", "sqrt2", "no normalisation, He initialisation, block outputs times 1/sqrt(2)",
               output_scale=SQRT_HALF),
    )},
    **{norm: {"he": Method(norm, "he", f"{norm}, {_NORMED}")} for norm in ("batchnorm", "groupnorm")},
    "layernorm": {"xavier": Method("layernorm", "xavier", "layernorm, Xavier-initialised linear layers")},
}
DEFAULT_INIT = {"fixup": "fixup", "none": "he", "batchnorm": "he", "groupnorm": "he", "layernorm": "xavier"}


def _combinations() -> str:
    return "; ".join(f"norm={norm!r} with init in ({', '.join(map(repr, inits))})" for norm, inits in METHODS.items())


def resolve_method(norm: str, init: str | None = None) -> Method:
    """The :class:`Method` for ``norm`` and ``init`` (``None``: the norm's default); a ValueError if none."""
    if norm not in METHODS:
        raise ValueError(f"unknown norm={norm!r}; the combinations that exist are: {_combinations()}")
    key = DEFAULT_INIT[norm] if init is None else init
    if key not in METHODS[norm]:
        raise ValueError(f"init={init!r} does not combine with norm={norm!r}; the combinations that exist are: "
                         f"{_combinations()}")
    return METHODS[norm][key]


# ---------------------------------------------------------------------------------------------------------
# Plain initialisers (every weight layer drawn the same way), each returning the accounting report.


def _named_weight_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, WEIGHT_LAYERS)]


def _reset_norms_and_scalars(model: nn.Module) -> int:
    """Normalisation layers to gain 1, shift 0, fresh running statistics; scalars to 1 and 0."""
    scalars = 0
    for mod in model.modules():
        if describe_norm("", mod) is not None and hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
        elif isinstance(mod, (Bias, Scale)):
            mod.reset_parameters()
            scalars += 1
    return scalars


def _plain_report(model: nn.Module, method: str, scheme: str, layers: list[LayerRecord],
                  scalars: int) -> FixupReport:
    norms = [rec for name, mod in model.named_modules() if (rec := describe_norm(name, mod)) is not None]
    handled = {id(m) for _, m in _named_weight_layers(model)}
    untouched = [f"{name} ({type(mod).__name__})" for name, mod in model.named_modules()
                 if id(mod) not in handled and describe_norm(name, mod) is None
                 and not isinstance(mod, (Bias, Scale)) and any(True for _ in mod.parameters(recurse=False))]
    return FixupReport(num_branches=len(find_branches(model)), branches=[], classifier=[], other_layers=layers,
                       untouched=untouched, num_scalars=scalars, normalization=norms, method=method,
                       depth_scaling=False, scheme=scheme)


def _default_linear_(layer: nn.Module, generator: torch.Generator | None) -> float:
    """PyTorch's default for ``nn.Linear`` (uniform, bound 1/sqrt(fan_in)), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(layer.weight.shape[1]) if layer.weight.shape[1] else 0.0
    layer.weight.uniform_(-bound, bound, generator=generator)
    if layer.bias is not None:
        layer.bias.uniform_(-bound, bound, generator=generator)
    return bound / math.sqrt(3.0)


def _record(name: str, layer: nn.Module, std: float) -> LayerRecord:
    return LayerRecord(name, type(layer).__name__, list(layer.weight.shape), float(std))


@torch.no_grad()
def he_init_(model: nn.Module, *, generator: torch.Generator | None = None, mode: str = "fan_out",
             method: str = "he") -> FixupReport:
    """He normal for every convolution (``mode`` fan, as torchvision's ResNet), PyTorch's default for linear
    layers, normalisation gain 1 and shift 0. Returns the accounting report."""
    records = []
    for name, mod in _named_weight_layers(model):
        if isinstance(mod, nn.Linear):
            std = _default_linear_(mod, generator)
        else:
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(mod.weight)
            std = math.sqrt(2.0 / (fan_out if mode == "fan_out" else fan_in))
            mod.weight.normal_(0.0, std, generator=generator)
            if mod.bias is not None:
                mod.bias.zero_()
        records.append(_record(name, mod, std))
    scalars = _reset_norms_and_scalars(model)
    scheme = f"He normal ({mode}) for convolutions, PyTorch's default uniform for linear layers"
    report = _plain_report(model, method, scheme, records, scalars)
    report.fan_mode = mode
    return report


@torch.no_grad()
def xavier_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> FixupReport:
    """Xavier (Glorot & Bengio 2010) uniform for every weight layer, biases 0."""
    records = []
    for name, mod in _named_weight_layers(model):
        nn.init.xavier_uniform_(mod.weight, generator=generator)
        if mod.bias is not None:
            mod.bias.zero_()
        fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(mod.weight)
        records.append(_record(name, mod, math.sqrt(2.0 / (fan_in + fan_out))))
    scalars = _reset_norms_and_scalars(model)
    return _plain_report(model, "xavier", "Xavier uniform, gain 1, biases 0", records, scalars)


@torch.no_grad()
def orthonormal_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> FixupReport:
    """Orthonormal weights (Saxe et al. 2014) for every weight layer, biases 0: LSUV's first step."""
    records = []
    for name, mod in _named_weight_layers(model):
        nn.init.orthogonal_(mod.weight, generator=generator)
        if mod.bias is not None:
            mod.bias.zero_()
        records.append(_record(name, mod, float(mod.weight.std()) if mod.weight.numel() > 1 else 0.0))
    scalars = _reset_norms_and_scalars(model)
    return _plain_report(model, "lsuv", "orthonormal (LSUV step 1); LSUV rescaling pending", records, scalars)


# ---------------------------------------------------------------------------------------------------------
# Modifications applied after an initialiser.


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


@torch.no_grad()
def zero_last_norm_gains_(model: nn.Module) -> list[str]:
    """Zero the gain of each residual block's last normalisation layer (Goyal et al. 2017), so that every
    block starts as its shortcut. Blocks name that layer with ``last_norm()``; returns the zeroed names."""
    names = {id(mod): name for name, mod in model.named_modules()}
    zeroed = []
    for mod in model.modules():
        norm = mod.last_norm() if callable(getattr(mod, "last_norm", None)) else None
        if norm is None or describe_norm("", norm) is None:
            continue
        if getattr(norm, "weight", None) is None:
            raise ValueError(f"{names[id(norm)]}: the last normalisation layer of a block has no gain to zero "
                             "(affine=False); build it with an affine transform or leave zero_init_last_norm off")
        norm.weight.zero_()
        zeroed.append(f"{names[id(norm)]}.weight")
    if not zeroed:
        raise ValueError(f"{type(model).__name__} has no block whose last normalisation layer could be zeroed; "
                         "zero_init_last_norm needs norm='batchnorm' or 'groupnorm'")
    return zeroed


# ---------------------------------------------------------------------------------------------------------
# The single entry point for builders, and the data-dependent step for the training engine.


def _check_output_scale(model: nn.Module, method: Method) -> None:
    """Every block that has an ``output_scale`` must carry the method's (built for the same method)."""
    scales = [(name, mod.output_scale) for name, mod in model.named_modules() if hasattr(mod, "output_scale")]
    if method.output_scale != 1.0 and not scales:
        raise ValueError(f"init={method.init!r} multiplies each block's output, but {type(model).__name__}'s "
                         "blocks have no `output_scale`; this architecture does not support it")
    for name, scale in scales:
        if scale != method.output_scale:
            raise ValueError(f"block {name!r} has output_scale {scale:g} but init={method.init!r} needs "
                             f"{method.output_scale:g}; build the model with the norm/init you initialise it for")


def _collapse_ablation_warnings(report: FixupReport, method: Method) -> None:
    """One line instead of one warning per branch for the scalars an ablation leaves out by design."""
    for present, what in ((method.biases, "no scalar biases"), (method.scale, "no scalar multiplier")):
        if present:
            continue
        kept = [w for w in report.warnings if not (w.startswith("branch ") and what in w)]
        if len(kept) < len(report.warnings):
            report.warnings = [*kept, f"{len(report.warnings) - len(kept)} branches have {what} (rule 3): "
                                      f"the {method.init} ablation leaves them out"]


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                zero_init_last_norm: bool = False, base: str = "he") -> FixupReport:
    """Initialise a freshly built ``model`` for ``method``; sets and returns ``model.init_report``.

    ``base`` is the standard initialisation the Fixup forms start from (see :func:`fixup.fixup_init_`).

    Also sets ``model.init_method`` (the :class:`Method`) and ``model.pending_data_init`` (``"lsuv"``
    until :func:`data_init_` has run on a batch, else ``None``).
    """
    if zero_init_last_norm and method.norm not in ("batchnorm", "groupnorm"):
        raise ValueError(f"zero_init_last_norm applies to norm='batchnorm' or 'groupnorm', not norm={method.norm!r}")
    _check_output_scale(model, method)
    if method.fixup:
        report = fixup_init_(model, generator=generator, depth_scaling=method.depth_scaling, rescale=method.rescale,
                             base=base)
        if method.zero_branch:
            zero_branches_(model, report)
        report.method = method.init
        _collapse_ablation_warnings(report, method)
    elif method.init == "xavier":
        report = xavier_init_(model, generator=generator)
    elif method.init == "lsuv":
        report = orthonormal_init_(model, generator=generator)
        report.warnings.append("LSUV is not finished: call fixup.baselines.data_init_(model, batch) with a "
                               "training batch (the training engine does this with its first batch)")
    else:
        report = he_init_(model, generator=generator, method=method.init if method.norm == "none" else method.norm)
    report.output_scale = method.output_scale
    if zero_init_last_norm:
        report.zeroed.extend(zero_last_norm_gains_(model))
    model.init_method = method
    model.pending_data_init = "lsuv" if method.needs_data else None
    model.init_report = report
    return report


def _unwrap(model: nn.Module) -> nn.Module:
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, wrappers) else model


def data_init_(model: nn.Module, batch: torch.Tensor | tuple | list, **lsuv_kwargs: float) -> list[LSUVRecord]:
    """The data-dependent step of the model's method, run once with the first training batch.

    For a model built with ``init="lsuv"`` this runs :func:`lsuv_` on the batch's inputs (``batch`` may
    be an input tensor or an ``(inputs, targets)`` pair), updates ``model.init_report`` and returns the
    per-layer records; for every other model, or a second time, it does nothing and returns ``[]``.
    Call it before wrapping the model in DistributedDataParallel; under ``torch.distributed`` the
    rescaled weights are broadcast from rank 0 so that every process holds the same model.
    """
    target = _unwrap(model)
    if getattr(target, "pending_data_init", None) != "lsuv":
        return []
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    records = lsuv_(target, inputs, orthonormal=False, **lsuv_kwargs)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        for _, layer in _named_weight_layers(target):
            torch.distributed.broadcast(layer.weight.data, src=0)
    target.pending_data_init = None
    report = getattr(target, "init_report", None)
    if report is not None:
        report.data_init = records
        report.scheme = f"orthonormal, then LSUV on a batch of {inputs.shape[0]}"
        report.warnings = [w for w in report.warnings if not w.startswith("LSUV is not finished")]
        layers = dict(_named_weight_layers(target))
        for rec in report.other_layers:  # the weights' spread after rescaling
            if rec.name in layers and layers[rec.name].weight.numel() > 1:
                rec.std = float(layers[rec.name].weight.detach().std())
        report.warnings.extend(f"LSUV: {r.name} did not reach unit output variance ({r.variance:.4g})"
                               for r in records if not r.converged)
    return records
