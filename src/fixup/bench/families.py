"""The model families the benchmark measures, each in every variant, from the same weights.

A family is one architecture at a size that a CPU measures in seconds: the CIFAR ResNet (basic blocks),
an ImageNet-layout ResNet with bottleneck blocks, a pre-activation Wide-ResNet and the encoder-decoder
Transformer. Its variants:

- ``none``: the bare network of the family: no normalisation and no scalars (the floor). The Transformer
  has no ``norm="none"`` method; its bare form is the Fixup Transformer without biases and multipliers;
- ``fixup``: Fixup, by each block's lean forward (the default);
- ``fixup-plain``: Fixup written straightforwardly, a new tensor per scalar (``set_lean(model, False)``);
- ``norm``: the normalised baseline: BatchNorm for the ResNets, LayerNorm (post-norm) for the Transformer;
- ``fixup-folded``: Fixup folded for inference (:func:`fixup.fold_for_inference`): forward only;
- ``biased``: the bare network with a zero per-output bias in every convolution and linear layer that has
  none: the floor of any network whose layers have biases. A Fixup scalar's gradient is a reduction over a
  full activation gradient, as a layer bias's is; this variant prices those reductions alone (opt-in, not in
  the default variants).

Every variant starts from the Fixup-initialised weights of the same seed (the parameters they share): a
bare He-initialised ResNet-56 overflows within a few steps, and arithmetic on inf and NaN is not timed
like ordinary arithmetic. The cost of an architecture does not depend on its weights' values.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..method import METHODS, Method
from ..models import create_model
from ..perf.fold import fold_for_inference
from ..perf.ops import set_lean
from ..report import FixupWarning

__all__ = ["FAMILIES", "FLOOR", "VARIANTS", "Family", "build_variant", "make_batch"]

FLOOR = "none"
VARIANTS = ("none", "fixup", "fixup-plain", "norm", "fixup-folded", "biased")
FORWARD_ONLY = ("fixup-folded",)
# The Transformer's bare form: the Fixup architecture with neither scalar biases nor multipliers.
BARE_TRANSFORMER = dataclasses.replace(METHODS["fixup"], init="bare", biases=False, scale=False, stream_bias="none",
                                       description="no normalisation, no scalars (the bare Transformer)")


@dataclass(frozen=True)
class Family:
    """One architecture of the benchmark."""

    name: str
    model: str  # registered builder
    kwargs: dict  # its options
    norm: str  # the normalised baseline: "batchnorm" or "layernorm"
    batch: int  # default examples per step
    text: bool = False  # token inputs (the Transformer) rather than images
    image: int = 32  # image side in pixels
    bare: Method | None = None  # the bare network's method where norm="none" does not exist


FAMILIES: dict[str, Family] = {
    "cifar": Family("cifar", "resnet_cifar", {"depth": 20}, "batchnorm", 64),
    "bottleneck": Family("bottleneck", "resnet_imagenet", {"depth": 50, "width": 16, "num_classes": 10},
                         "batchnorm", 32, image=64),  # the ImageNet layout divides by 32: 64x64 ends at 2x2
    "wide": Family("wide", "wide_resnet", {"depth": 16, "width": 2}, "batchnorm", 64),
    "transformer": Family("transformer", "transformer_tiny", {"dropout": 0.0}, "layernorm", 32, text=True,
                          bare=BARE_TRANSFORMER),
}
SEQUENCE = 32  # tokens per sentence in the Transformer's batches


def _method(family: Family, variant: str) -> Method | str:
    if variant in (FLOOR, "biased"):
        return family.bare or "he"
    return family.norm if variant == "norm" else "fixup"


def family_options(family: Family, *, depth: int | None = None, width: int | None = None) -> dict:
    """``family``'s builder options: ``depth`` overrides the CIFAR ResNet's depth (the other families ignore
    it); ``width`` the ResNets' width option (first-stage channels, or the Wide-ResNet's widening factor) and
    the Transformer's model dimension (its feed-forward layer twice as wide, as the tiny one's)."""
    options = dict(family.kwargs)
    if depth is not None and family.name == "cifar":
        options["depth"] = depth
    if width is not None:
        options.update({"d_model": width, "ffn_dim": 2 * width} if family.text else {"width": width})
    return options


def build_variant(family: Family, variant: str, *, seed: int = 0, depth: int | None = None,
                  width: int | None = None) -> nn.Module:
    """``family``'s model in ``variant`` (see the module's docstring), from the Fixup weights of ``seed``;
    ``depth`` and ``width`` as in :func:`family_options`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    kwargs = family_options(family, depth=depth, width=width)

    def make(method: Method | str) -> nn.Module:
        with warnings.catch_warnings():  # the bare Transformer's report warns that its branches lack scalars
            warnings.simplefilter("ignore", FixupWarning)
            return create_model(family.model, method=method, generator=torch.Generator().manual_seed(seed), **kwargs)

    model = make(_method(family, variant))
    if variant == "biased":
        _add_zero_biases(model)
    if variant not in ("fixup", "fixup-plain", "fixup-folded"):
        reference = make("fixup").state_dict()
        own = model.state_dict()
        model.load_state_dict({k: v for k, v in reference.items() if k in own and own[k].shape == v.shape},
                              strict=False)
    if variant == "fixup-folded":
        return fold_for_inference(model).model
    return set_lean(model, variant != "fixup-plain")


def _add_zero_biases(model: nn.Module) -> None:
    """Give every bias-free ``nn.Conv2d`` and ``nn.Linear`` of ``model`` a zero bias parameter, in place."""
    for module in model.modules():
        if type(module) in (nn.Conv2d, nn.Linear) and module.bias is None:
            out = module.out_channels if isinstance(module, nn.Conv2d) else module.out_features
            module.bias = nn.Parameter(module.weight.new_zeros(out))


def make_batch(family: Family, batch: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
    """Inputs and targets for one step of ``family``."""
    gen = torch.Generator().manual_seed(seed)
    if family.text:
        src = torch.randint(3, 1000, (batch, SEQUENCE), generator=gen)
        tgt = torch.randint(3, 1000, (batch, SEQUENCE + 1), generator=gen)
        return (src, tgt[:, :-1]), tgt[:, 1:]
    x = torch.randn(batch, 3, family.image, family.image, generator=gen)
    return (x,), torch.randint(0, 10, (batch,), generator=gen)


def loss_fn(family: Family) -> Callable[[Tensor, Tensor], Tensor]:
    """Cross-entropy over classes (images) or over every target token (text)."""
    if family.text:
        return lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return F.cross_entropy
