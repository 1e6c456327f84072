"""torch.compile captures every model family in one graph (no graph breaks), lean path included."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo as dynamo
from torch import nn

from fixup.models import create_model, list_models
from fixup.perf.checkpointing import enable_checkpointing
from fixup.perf.ops import set_lean

Inputs = tuple[torch.Tensor, ...]


def _cifar(**kw) -> tuple[nn.Module, Inputs]:
    return create_model("resnet_cifar", depth=8, **kw), (torch.randn(2, 3, 8, 8),)


def _imagenet(**kw) -> tuple[nn.Module, Inputs]:
    return create_model("resnet_imagenet_tiny", **kw), (torch.randn(2, 3, 32, 32),)


def _bottleneck(**kw) -> tuple[nn.Module, Inputs]:
    return create_model("resnet_imagenet_bottleneck_tiny", **kw), (torch.randn(2, 3, 32, 32),)


def _wide(**kw) -> tuple[nn.Module, Inputs]:
    return create_model("wide_resnet", depth=10, width=1, **kw), (torch.randn(2, 3, 8, 8),)


def _transformer(**kw) -> tuple[nn.Module, Inputs]:
    model = create_model("transformer_tiny", dropout=0.0, **kw)
    return model, (torch.randint(4, 100, (2, 5)), torch.randint(4, 100, (2, 6)))


# A small instance of each registered family (same classes, small sizes), with the names it stands for.
# A newly registered model needs its family named here.
_SMALL: dict[str, Callable[..., tuple[nn.Module, Inputs]]] = {
    "cifar": _cifar, "imagenet": _imagenet, "bottleneck": _bottleneck, "wide": _wide, "transformer": _transformer,
}
_NAMES = {
    "cifar": {"resnet_cifar", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "resnet1202"},
    "imagenet": {"resnet_imagenet", "resnet18", "resnet34", "resnet_imagenet_tiny"},
    "bottleneck": {"resnet50", "resnet101", "resnet152", "resnet_imagenet_bottleneck_tiny"},
    "wide": {"wide_resnet", "wrn28_10", "wrn40_10"},
    "transformer": {"transformer_tiny", "transformer_iwslt_de_en"},
}


def _family(name: str) -> str:
    for family, names in _NAMES.items():
        if name in names:
            return family
    raise AssertionError(f"registered model {name!r} has no small configuration in tests/test_speed_compile.py; "
                         "name its family in _NAMES (or add one to _SMALL) so that its torch.compile capture "
                         "is tested")


def _breaks(model: nn.Module, inputs: Inputs) -> list:
    dynamo.reset()
    explanation = dynamo.explain(model)(*inputs)
    return [str(r) for r in explanation.break_reasons] + ([] if explanation.graph_count == 1 else ["graphs"])


def test_every_registered_model_has_a_small_configuration():
    assert {_family(name) for name in list_models()} <= set(_SMALL)


@pytest.mark.parametrize(("norm", "lean"), [("fixup", True), ("fixup", False), ("none", True),
                                            ("batchnorm", True), ("groupnorm", True)])
def test_cifar_resnet_compiles_without_graph_breaks(norm, lean):
    model, inputs = _cifar(norm=norm)
    assert _breaks(set_lean(model, lean), inputs) == []


# the Transformer and the bottleneck ResNet in the default run; the ImageNet and wide ResNets (a few seconds each on
# 2 cores) with -m slow
@pytest.mark.parametrize("family", ["transformer", "bottleneck", *(pytest.param(f, marks=pytest.mark.slow)
                                                                   for f in ("imagenet", "wide"))])
def test_other_families_compile_without_graph_breaks(family):
    assert _breaks(*_SMALL[family]()) == []


def test_checkpointed_model_compiles_without_graph_breaks():
    model, inputs = _cifar()
    assert _breaks(enable_checkpointing(model, 3), inputs) == []


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_SMALL))
def test_compiled_training_step_matches_eager(family):
    """fullgraph=True through AOTAutograd: the backward is compiled too and gives eager's gradients."""
    model, inputs = _SMALL[family]()
    dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(*inputs)
    grads = torch.autograd.grad(out.float().square().mean(), list(model.parameters()), allow_unused=True)
    ref = torch.autograd.grad(model(*inputs).float().square().mean(), list(model.parameters()), allow_unused=True)
    for g, r in zip(grads, ref):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
