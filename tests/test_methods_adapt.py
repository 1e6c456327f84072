"""fixup.adapt(method=...) for every method of fixup.METHODS: applied where adapt can apply it, refused with what
works instead where it cannot (NF-ResNets, T-Fixup, the Fixup variants and the baselines)."""

from __future__ import annotations

import warnings

import pytest
import torch

import fixup
from adapt_zoo import ZOO
from fixup._adapt import ADAPT_METHODS
from test_adapt_trunk import TinyEfficientNet
from test_adapt_zoo import _needs, as_inputs

# What each refusal must name: the library's builder for the method, or the methods adapt applies.
_INSTEAD = {"nf_resnet": "create_model('resnet50', method='nf_resnet')",
            "nf_resnet_nozero": "create_model('resnet50', method='nf_resnet_nozero')",
            "t_fixup": "create_model('transformer_tiny', method='t_fixup')"}


def _x() -> torch.Tensor:
    return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method", [m for m in fixup.METHODS if m not in ADAPT_METHODS])
def test_a_method_adapt_cannot_apply_is_refused_naming_what_works(method: str) -> None:
    with pytest.raises(ValueError, match=f"got method='{method}': ") as err:
        fixup.adapt(TinyEfficientNet(), _x(), method=method)
    text = str(err.value)
    assert _INSTEAD.get(method, f"method={method!r}") in text
    if fixup.METHODS[method].nf or method == "t_fixup":
        assert "'fixup'" in text and "'rezero'" in text  # what adapts a model written elsewhere instead


def test_an_unknown_method_lists_the_table() -> None:
    with pytest.raises(ValueError, match="unknown method 'nfnet'; choose among fixup, "):
        fixup.adapt(TinyEfficientNet(), _x(), method="nfnet")


# The real classes of docs/adapt.md's training table (timm: skipped where it is not installed), and torchvision's
# ResNet-18 and ResNet-50 layouts, which run everywhere.
_TABLE = [n for n in ZOO if n.split(" ")[0] in ("resnet18", "regnetx_002", "efficientnet_b0", "mobilenetv3_small_050",
                                                  "convnext_atto", "vit_tiny_patch16_224", "resnet50")
          and ZOO[n].source in ("timm", "torchvision (architecture)")]


@pytest.mark.parametrize("name", _TABLE)
@pytest.mark.parametrize("method", ADAPT_METHODS)
def test_every_method_adapt_applies_adapts_the_training_tables_models(name: str, method: str) -> None:
    entry = ZOO[name]
    _needs(entry.needs)
    x = entry.example()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, report = fixup.adapt(entry.build(), x, method=method)
    assert report.num_branches == entry.L and report.to_dict()["method"] == method
    for other in (m for m in fixup.METHODS if m not in ADAPT_METHODS):
        with pytest.raises(ValueError, match=f"got method='{other}'"):
            fixup.adapt(entry.build(), x, method=other)
    out = model(*as_inputs(x))
    assert all(torch.isfinite(t).all() for t in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(t))
