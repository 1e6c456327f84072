"""The methods Fixup is compared against, its ablations, and the one place that initialises a model for one.

The methods themselves are the typed table of :mod:`fixup.method`. A model's constructor calls
:func:`initialise_` with its :class:`~fixup.method.Method` as its last step and keeps the report it returns;
:func:`data_init_` finishes a data-dependent method (LSUV) on the first training batch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .branch import WEIGHT_LAYERS, find_branches
from .groups import unwrap
from .init import fixup_init_, groups_of, he_std, orthonormal_, xavier_std
from .lsuv import lsuv_
from .method import METHODS, Method, resolve_method
from .nn import Bias, Scale
from .report import FixupReport, InitReport, LayerRecord, LSUVRecord, describe_norm, warn_report

__all__ = [
    "METHODS",
    "Method",
    "data_init_",
    "describe_init",
    "he_init_",
    "initialise_",
    "lsuv_",
    "orthonormal_init_",
    "resolve_method",
    "xavier_init_",
    "zero_branches_",
    "zero_last_norm_gains_",
]


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
                  scalars: int) -> InitReport:
    norms = [rec for name, mod in model.named_modules() if (rec := describe_norm(name, mod)) is not None]
    handled = {id(m) for _, m in _named_weight_layers(model)}
    untouched = [f"{name} ({type(mod).__name__})" for name, mod in model.named_modules()
                 if id(mod) not in handled and describe_norm(name, mod) is None
                 and not isinstance(mod, (Bias, Scale)) and any(True for _ in mod.parameters(recurse=False))]
    return InitReport(method=method, num_branches=len(find_branches(model)), other_layers=layers,
                      untouched=untouched, num_scalars=scalars, normalization=norms, scheme=scheme)


def _default_linear_(layer: nn.Module, generator: torch.Generator | None) -> float:
    """PyTorch's default for ``nn.Linear`` (uniform, bound 1/sqrt(fan_in)), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(layer.weight.shape[1]) if layer.weight.shape[1] else 0.0
    layer.weight.uniform_(-bound, bound, generator=generator)
    if layer.bias is not None:
        layer.bias.uniform_(-bound, bound, generator=generator)
    return bound / math.sqrt(3.0)


def _record(name: str, layer: nn.Module, std: float) -> LayerRecord:
    return LayerRecord(name, type(layer).__name__, list(layer.weight.shape), float(std))


def describe_init(model: nn.Module, method: str, scheme: str, stds: dict[str, float]) -> InitReport:
    """The report of a model its own constructor initialised by ``scheme``, with the std each weight layer was
    drawn with (``stds``, by qualified name)."""
    records = [_record(name, mod, stds[name]) for name, mod in _named_weight_layers(model)]
    scalars = sum(isinstance(m, (Bias, Scale)) for m in model.modules())
    return _plain_report(model, method, scheme, records, scalars)


@torch.no_grad()
def he_init_(model: nn.Module, *, generator: torch.Generator | None = None, mode: str = "fan_out",
             method: str = "he") -> InitReport:
    """He normal for every convolution (``mode`` fan, as torchvision's ResNet), PyTorch's default for linear
    layers, normalisation gain 1 and shift 0. Returns the accounting report."""
    records = []
    for name, mod in _named_weight_layers(model):
        if isinstance(mod, nn.Linear):
            std = _default_linear_(mod, generator)
        else:
            std = he_std(mod.weight, mode, groups_of(mod))
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
def xavier_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> InitReport:
    """Xavier (Glorot & Bengio 2010) uniform for every weight layer, biases 0."""
    records = []
    for name, mod in _named_weight_layers(model):
        std = xavier_std(mod.weight, groups_of(mod))
        mod.weight.uniform_(-math.sqrt(3.0) * std, math.sqrt(3.0) * std, generator=generator)  # uniform of that std
        if mod.bias is not None:
            mod.bias.zero_()
        records.append(_record(name, mod, std))
    scalars = _reset_norms_and_scalars(model)
    return _plain_report(model, "xavier", "Xavier uniform, gain 1, biases 0", records, scalars)


@torch.no_grad()
def orthonormal_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> InitReport:
    """Orthonormal weights (Saxe et al. 2014) for every weight layer, biases 0: LSUV's first step."""
    records = []
    for name, mod in _named_weight_layers(model):
        groups = groups_of(mod)
        orthonormal_(mod.weight, groups, generator)
        if mod.bias is not None:
            mod.bias.zero_()
        rows, cols = mod.weight.shape[0] // groups, mod.weight[0].numel()
        records.append(_record(name, mod, math.sqrt(1.0 / max(rows, cols))))  # orthonormal rows (or columns)
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


def _ablation_notes(report: FixupReport, method: Method) -> None:
    """The scalars an ablation leaves out by design are a note of the report, not a warning."""
    for present, what in ((method.biases, "no scalar biases"), (method.scale, "no scalar multiplier")):
        if not present:
            report.notes.append(f"{report.num_branches} branches have {what} (rule 3): the {method.init} "
                                "ablation leaves them out")


@torch.no_grad()
def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str = "he") -> InitReport:
    """Initialise a freshly built ``model`` for ``method`` and return the report (a model's last step).

    ``base`` is the standard initialisation the Fixup forms start from (see :func:`fixup.fixup_init_`).
    A data-dependent method (LSUV) leaves ``report.data_init_pending`` set until :func:`data_init_`
    has run on a batch. The report's warnings are issued as :class:`fixup.FixupWarning`.
    """
    _check_output_scale(model, method)
    report: InitReport
    if method.fixup:
        report = fixup_init_(model, generator=generator, depth_scaling=method.depth_scaling, rescale=method.rescale,
                             base=base, stream_bias=method.stream_bias, stem_mode=method.stem_mode,
                             expect_biases=method.biases, expect_scale=method.scale)
        if method.zero_branch:
            zero_branches_(model, report)
        report.method = method.init
        _ablation_notes(report, method)
    elif method.init == "xavier":
        report = xavier_init_(model, generator=generator)
    elif method.init == "lsuv":
        report = orthonormal_init_(model, generator=generator)
        report.data_init_pending = True
    else:
        report = he_init_(model, generator=generator, method=method.name)
    report.output_scale = method.output_scale
    if method.zero_init_last_norm:
        report.zeroed.extend(zero_last_norm_gains_(model))
    if not method.fixup:  # fixup_init_ has issued its own
        warn_report(report, stacklevel=4)
    return report


def data_init_(model: nn.Module, batch: torch.Tensor | tuple | list, **lsuv_kwargs: float) -> list[LSUVRecord]:
    """The data-dependent step of the model's method, run once with the first training batch.

    For a model whose ``init_report`` has ``data_init_pending`` (built with ``init="lsuv"``) this runs
    :func:`lsuv_` on the batch's inputs (``batch`` may be an input tensor or an ``(inputs, targets)`` pair),
    fills the report's data-dependent section and returns the per-layer records; for every other model,
    or a second time, it does nothing and returns ``[]``. Call it before wrapping the model in
    DistributedDataParallel; under ``torch.distributed`` the rescaled weights are broadcast from rank 0 so
    that every process holds the same model.
    """
    target = unwrap(model)
    report = getattr(target, "init_report", None)
    if not (isinstance(report, InitReport) and report.data_init_pending):
        return []
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    records = lsuv_(target, inputs, orthonormal=False, **lsuv_kwargs)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        for _, layer in _named_weight_layers(target):
            torch.distributed.broadcast(layer.weight.data, src=0)
    report.data_init_pending = False
    report.data_init = records
    report.scheme = f"orthonormal, then LSUV on a batch of {inputs.shape[0]}"
    layers = dict(_named_weight_layers(target))
    for rec in report.other_layers:  # the weights' spread after rescaling
        if rec.name in layers and layers[rec.name].weight.numel() > 1:
            rec.std = float(layers[rec.name].weight.detach().std())
    missed = [f"LSUV: {r.name} did not reach unit output variance ({r.variance:.4g})"
              for r in records if not r.converged]
    report.warnings.extend(missed)
    warn_report(InitReport(method=report.method, warnings=missed))
    return records
