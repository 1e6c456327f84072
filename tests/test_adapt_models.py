"""``fixup.adapt`` against our own models, and adapted models trained on digits at the BatchNorm rate.

The cross-check: for every registered architecture, adapting its normalised form (BatchNorm, or
LayerNorm for the Transformer) must give the same accounting as its native Fixup form: the same L,
the same m and factor per branch, the same zeroed, scaled, projection and classifier layers.
"""

from __future__ import annotations

import fnmatch
import inspect

import pytest
import torch
from torch import nn

import fixup
from fixup import adapt
from fixup.report import FixupReport

# Registered models too big to build twice in a default run (each still runs with -m slow); their
# structures are covered by default through the tiny variants (resnet_imagenet*_tiny, wide_resnet).
_SLOW = ("resnet1202", "resnet50", "resnet_imagenet", "*101*", "*152*", "*200*", "wrn*_10", "*iwslt*", "*wmt*")
# Smaller sizes for builders that take them: the accounting depends on the layer structure only.
_SMALL = {"transformer*": {"d_model": 32, "ffn_dim": 64, "heads": 4, "src_vocab": 50, "tgt_vocab": 50}}


def _params(name: str) -> list:
    slow = any(fnmatch.fnmatchcase(name, p) for p in _SLOW)
    return [pytest.param(name, marks=pytest.mark.slow) if slow else name]


def _build(name: str, norm: str, **extra: object) -> nn.Module:
    kwargs = next((k for p, k in _SMALL.items() if fnmatch.fnmatchcase(name, p)), {})
    return fixup.create_model(name, norm=norm, **kwargs, **extra)


def _normalised(name: str, **extra: object) -> nn.Module:
    try:
        return _build(name, "batchnorm", **extra)
    except ValueError:
        return _build(name, "layernorm", **extra)


def _example(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Inputs for a registered model: token ids for models that embed, else images or vectors."""
    first = next(m for m in model.modules() if isinstance(m, (nn.Embedding, nn.Conv2d, nn.Linear)))
    if isinstance(first, nn.Embedding):
        count = len(inspect.signature(model.forward).parameters)
        return tuple(torch.randint(1, first.num_embeddings, (2, 5 + i)) for i in range(count))
    if isinstance(first, nn.Conv2d):
        return (torch.randn(2, first.in_channels, 16, 16),)
    return (torch.randn(2, first.in_features),)


def accounting(report: FixupReport) -> dict:
    """What must agree: L, and per branch (by its zeroed layer) m, the factor and the scaled layers."""
    return {
        "L": report.num_branches,
        "branches": sorted((b.zeroed.name, b.m, round(b.factor, 12), tuple(s.name for s in b.scaled))
                           for b in report.branches),
        "classifier": sorted(c.name for c in report.classifier),
        "projections": sorted(s.name for s in report.shortcuts),
    }


@pytest.mark.parametrize("name", [p for n in fixup.list_models() for p in _params(n)])
def test_adapting_the_normalised_form_reproduces_the_native_fixup_accounting(name: str) -> None:
    native = _build(name, "fixup")
    normalised = _normalised(name)
    model, report = adapt(normalised, _example(normalised))
    assert accounting(report) == accounting(native.init_report)
    assert not report.normalization
    # The adapted model starts as the identity where the rule says: every branch outputs zeros.
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, o: outs.append(o)) for m in model.modules()
             if isinstance(m, fixup.Scale)]
    with torch.no_grad():
        model.eval()(*_example(normalised))
    for h in hooks:
        h.remove()
    assert len(outs) == report.num_branches and all(torch.count_nonzero(o) == 0 for o in outs)


def test_pre_norm_transformer_gives_the_same_accounting_as_post_norm() -> None:
    pre = _build("transformer_tiny", "layernorm", pre_norm=True)
    _, report = adapt(pre, _example(pre))
    assert accounting(report) == accounting(_build("transformer_tiny", "fixup").init_report)
    # Pre-norm LayerNorms feed only their branch's first weight layers: each becomes their scalar bias.
    branch_norms = [n for n in report.norms_replaced if n.name.endswith(".pre_norm")]
    assert len(branch_norms) == 10 and all(n.action == "bias" and "next weight layer" in n.why for n in branch_norms)
    # the stacks' final norms sit on the residual stream: removed, no bias kept there
    assert {n.name: n.action for n in report.norms_replaced if not n.name.endswith(".pre_norm")} == {
        "encoder_norm": "removed", "decoder_norm": "removed"}


def test_cifar_resnet_with_projection_shortcuts() -> None:
    native = fixup.create_model("resnet_cifar", depth=14, norm="fixup", shortcut="B")
    _, report = adapt(fixup.create_model("resnet_cifar", depth=14, norm="batchnorm", shortcut="B"),
                      torch.randn(2, 3, 8, 8))
    assert accounting(report) == accounting(native.init_report)
    assert [r.shortcut for r in report.residuals].count("projection") == 2


def test_groupnorm_form_gives_the_same_accounting() -> None:
    native = fixup.create_model("resnet20", norm="fixup")
    _, report = adapt(fixup.create_model("resnet20", norm="groupnorm"), torch.randn(2, 3, 8, 8))
    assert accounting(report) == accounting(native.init_report)
    assert {n.type for n in report.norms_replaced} == {"GroupNorm"} and not report.normalization
