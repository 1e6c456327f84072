"""NF-ResNets (Brock, De & Smith, "Characterizing signal propagation to close the performance gap in unnormalized
ResNets", ICLR 2021): no normalisation; every convolution weight-standardised with a learnable gain, every ReLU
scaled by gamma, and each block ``h + alpha * F(h / beta)`` with beta the analytic std of ``h``.

The blocks (:mod:`fixup.models.nf_blocks`) carry the architecture: the standardisation, gamma, alpha and each
block's beta, set by the model's constructor. This initialiser draws the raw weights, sets every gain to 1 and
every bias to 0, the zero-started skip gain where the method has one (``nf_resnet``, as the authors' released
models; ``nf_resnet_nozero`` has none), the classifier as the authors' released models do, and reports each block's
beta. Adaptive gradient clipping, its recipe, is :func:`fixup.adaptive_clip_grad_` (the authors' rule: every tensor
but the classifier's weight; ``fixup train --clip agc``). The differences from the authors' code are listed in
docs/methods.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..branch import find_branches, find_classifier
from ..method import Method
from ..nn import ScaledStdConv2d
from ..report import LayerRecord, NFBlockRecord, NFReport
from ._layers import check_layer, draw_, record
from ._skeleton import Rest, module_names, norm_warnings, remaining_norms, sweep_rest_
from .fans import fans, groups_of, he_std

# Its report lives in fixup.report with the others; it is named here too, for the imports that predate the move.
__all__ = ["CLASSIFIER_STD", "NFBlockRecord", "NFReport", "draw_standardized_", "initialise_"]

CLASSIFIER_STD = 0.01  # the classifier's normal std in the authors' released NF-ResNets (bias 0)


def _raw_std(conv: nn.Module) -> float:
    """The std of a standardised layer's raw weights: 1/sqrt(fan_in), so that each row has about unit norm and
    the standardised weight is close to the raw one (the gradient's scale is that of an ordinary layer)."""
    return 1.0 / math.sqrt(fans(conv.weight, groups_of(conv))[0])


@torch.no_grad()
def draw_standardized_(model: nn.Module, classifier: list[nn.Module], cls_names: list[str],
                       generator: torch.Generator | None) -> tuple[dict[str, LayerRecord], list[LayerRecord], Rest]:
    """The NF-ResNet's draws: every :class:`ScaledStdConv2d` raw N(0, 1/fan_in) with gain 1 and bias 0, the
    classifier N(0, 0.01) with bias 0, any other weight layer He from its fan-in, every gate at 0 (every scalar at
    its start). Returns the standardised layers' records by name, the classifier's, and the rest's."""
    handled = {id(c) for c in classifier}
    records: dict[str, LayerRecord] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, ScaledStdConv2d):
            std = _raw_std(mod)
            draw_(mod, std, generator)
            mod.gain.fill_(1.0)
            records[name] = record(name, mod, std)
            handled.add(id(mod))
    cls_records = []
    for layer, lname in zip(classifier, cls_names):
        draw_(layer, CLASSIFIER_STD, generator)
        cls_records.append(record(lname, layer, CLASSIFIER_STD))

    def draw_other(mod: nn.Module, name: str) -> LayerRecord:  # any other weight layer: He from its fan-in
        std = he_std(mod.weight, "fan_in", groups_of(mod))
        draw_(mod, std, generator)
        return record(name, mod, std)

    return records, cls_records, sweep_rest_(model, handled, draw_other)  # a gate starts at 0


@torch.no_grad()
def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> NFReport:
    """Draw every weight-standardised layer's raw weights N(0, 1/fan_in) (gain 1, bias 0), the classifier
    N(0, 0.01) (bias 0), any other weight layer He from its fan-in, every branch gain at 0 where the method has
    one; return the report. ``base`` is unused: standardisation fixes every layer's scale. Raises, before any
    weight changes, on a model whose blocks are not NF blocks."""
    names = module_names(model)
    branches = find_branches(model)
    if not branches or any(not branch.kind.startswith("nf-") for _, branch in branches):
        other = sorted({branch.kind for _, branch in branches if not branch.kind.startswith("nf-")})
        raise ValueError(f"{method.name} is not available for {type(model).__name__}: it needs NF-ResNet blocks "
                         f"(found {', '.join(other) or 'no residual branch'}); build a CIFAR, Wide or ImageNet "
                         f"ResNet for it (fixup.create_model('resnet50', method={method.name!r}))")
    if method.gate and any(branch.gate is None for _, branch in branches):
        raise ValueError(f"{method.name}: the blocks have no gain; build the model for the method "
                         f"(fixup.create_model(name, method={method.name!r}))")
    classifier = find_classifier(model)
    cls_names = [check_layer(layer, "classifier", names) for layer in classifier]
    norms = remaining_norms(model)
    warnings = norm_warnings(norms, f"{method.name} removes it")

    records, cls_records, rest = draw_standardized_(model, classifier, cls_names, generator)
    num_standardized = len(records)

    blocks = []
    for block_name, branch in branches:
        block = model.get_submodule(block_name.split("[")[0])
        layers = [records[names[id(layer)]] for layer in branch.layers]
        short = None if branch.shortcut is None else records[names[id(branch.shortcut)]]
        gate = None if branch.gate is None else f"{names[id(branch.gate)]}.scale"
        blocks.append(NFBlockRecord(block_name, branch.kind, float(block.beta), branch.shortcut is not None, layers,
                                    gate, short))
    alpha = float(getattr(model.get_submodule(branches[0][0].split("[")[0]), "alpha", 0.2))
    last = blocks[-1]
    output_std = math.sqrt((1.0 if last.transition else last.beta**2) + alpha**2)
    return NFReport(method=method.name, num_branches=len(branches), blocks=blocks, classifier=cls_records,
                    other_layers=rest.other, untouched=rest.untouched, num_scalars=rest.num_scalars,
                    normalization=norms, warnings=warnings, alpha=alpha, output_std=output_std,
                    num_standardized=num_standardized, scheme="scaled weight standardisation", fan_mode="fan_in")
