"""Third-party models for ``fixup.adapt``: real classes from timm, transformers and torch, built from tiny
configurations (never downloaded), and torchvision's ResNet layout written out (tests/test_adapt.py).

timm imports here through tests/_torchvision_shim.py (installed on import of this module, before anything
imports torchvision): see that file for why. Where timm is not installed, its entries are skipped.

Each entry: ``ZOO[name] = Entry(source, family, build, example, branches)``, ``branches`` the number of
residual branches of each kind and their m, counted by hand from the architecture (comments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from _torchvision_shim import install as _install_torchvision_shim
from test_adapt import BasicBlock, Bottleneck, ResNet

_install_torchvision_shim()  # before timm, or transformers where torchvision is installed, imports torchvision


@dataclass
class Entry:
    source: str                         # "timm", "transformers", "torch", "torchvision (architecture)"
    family: str
    build: Callable[[], nn.Module]
    example: Callable[[], torch.Tensor]
    # branch kind -> (number of branches of that kind, m of each, or each one's m in order where they differ)
    branches: dict[str, tuple[int, int | tuple[int, ...]]]
    needs: str | None = None            # a package that must import

    @property
    def L(self) -> int:
        return sum(n for n, _ in self.branches.values())


def _image(size: int = 32) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def _ids() -> torch.Tensor:
    return torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))


def import_timm() -> object:
    """timm, or ImportError saying why not (an error of torchvision's import is one too)."""
    try:
        import timm
    except ImportError:
        raise
    except Exception as err:  # torchvision failing in a way the shim does not cover: a skip, not a crash
        raise ImportError(f"timm is installed but does not import: {type(err).__name__}: {err}") from err
    return timm


# --- timm (real classes; tiny where timm's kwargs allow) ---

TIMM_TINY: dict[str, dict[str, object]] = {
    # ResNet-18 as registered: its 7x7 stem is 64 wide whatever `channels` says, so the width stays.
    "resnet18": {},
    # RegNetX-200MF's class and blocks with depth 5 and widths 8-40: w_j = 8 + 8j quantised on 1.5^k gives
    # stages of widths 8, 16, 24, 40 and depths 1, 1, 2, 1 (RegNetCfg fields are kwargs).
    "regnetx_002": {"depth": 5, "w0": 8, "wa": 8, "wm": 1.5, "group_size": 4, "stem_width": 8},
    # EfficientNet-B0 and MobileNetV3-Small-0.5 as registered (their builders fix the multipliers).
    "efficientnet_b0": {},
    "mobilenetv3_small_050": {},
    "convnext_atto": {"depths": (1, 1, 2, 1), "dims": (8, 16, 24, 32)},
    "vit_tiny_patch16_224": {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 32, "num_heads": 4},
    # GhostNet-1.0 as registered (its builder fixes the width), without the head's functional dropout (0.2 by
    # default: F.dropout, which no module switches off, would make two forward passes in train mode differ).
    "ghostnet_100": {"drop_rate": 0.0},
}


def timm_model(name: str, num_classes: int = 10, in_chans: int = 3, **overrides: object) -> nn.Module:
    """``timm.create_model(name)`` at its tiny configuration of TIMM_TINY, with ``overrides`` on top."""
    return import_timm().create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans,
                                      **{**TIMM_TINY[name], **overrides})


def timm_regnet(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """A factory for ``fixup train --adapt tests/adapt_zoo.py:timm_regnet``: timm's RegNetX, tiny."""
    return timm_model("regnetx_002", num_classes=num_classes, in_chans=in_channels)


def _timm(name: str) -> Callable[[], nn.Module]:
    return lambda: timm_model(name)


# --- transformers (tiny configs, built from code) ---

def _hf(cls_name: str, config_name: str, **config: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers
        return getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
    return build


_TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 16}

_TRANSFORMER = {"attention": (2, 4), "mlp": (2, 2)}  # two layers: Q, K, V, out; fc1, fc2

ZOO: dict[str, Entry] = {
    "bert (BertForSequenceClassification)": Entry(
        "transformers", "BERT", _hf("BertForSequenceClassification", "BertConfig", num_labels=3, **_TEXT),
        _ids, _TRANSFORMER, "transformers"),
    "bert (BertModel)": Entry(
        "transformers", "BERT", _hf("BertModel", "BertConfig", **_TEXT), _ids, _TRANSFORMER, "transformers"),
    "gpt2 (GPT2LMHeadModel)": Entry(
        "transformers", "GPT-2", _hf("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                     n_positions=16, bos_token_id=1, eos_token_id=1),
        _ids, _TRANSFORMER, "transformers"),
    "vit (ViTForImageClassification)": Entry(
        "transformers", "ViT", _hf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8,
                                   hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   num_labels=10),
        _image(), _TRANSFORMER, "transformers"),
    "convnext (ConvNextForImageClassification)": Entry(  # 1 + 2 blocks: dwconv, then two Linear layers
        "transformers", "ConvNeXt", _hf("ConvNextForImageClassification", "ConvNextConfig", hidden_sizes=[8, 16],
                                        depths=[1, 2], num_stages=2, num_labels=10),
        _image(), {"mixed": (3, 3)}, "transformers"),
    "resnet (ResNetForImageClassification)": Entry(  # 1 + 2 bottlenecks of three convolutions
        "transformers", "ResNet", _hf("ResNetForImageClassification", "ResNetConfig", embedding_size=8,
                                      hidden_sizes=[8, 16], depths=[1, 2], layer_type="bottleneck", num_labels=10),
        _image(), {"conv": (3, 3)}, "transformers"),
    "regnet (RegNetForImageClassification)": Entry(  # 1 + 2 RegNetY blocks (SE convolutions are gates)
        "transformers", "RegNet", _hf("RegNetForImageClassification", "RegNetConfig", embedding_size=8,
                                      hidden_sizes=[8, 16], depths=[1, 2], groups_width=4, num_labels=10),
        _image(), {"conv": (3, 3)}, "transformers"),
    "mobilenet_v2 (MobileNetV2ForImageClassification)": Entry(  # 17 inverted residuals, 10 with a skip
        "transformers", "MobileNet", _hf("MobileNetV2ForImageClassification", "MobileNetV2Config",
                                         depth_multiplier=0.25, image_size=32, num_labels=10),
        _image(), {"conv": (10, 3)}, "transformers"),
    "efficientnet (EfficientNetForImageClassification)": Entry(
        "transformers", "EfficientNet", _hf("EfficientNetForImageClassification", "EfficientNetConfig", image_size=32,
                                            width_coefficient=0.25, depth_coefficient=0.5, hidden_dim=320,
                                            num_labels=10),
        _image(), {"conv": (3, 3)}, "transformers"),
    # timm: real classes. BasicBlock [2, 2, 2, 2]: 8 branches of two 3x3 convolutions.
    "resnet18 (timm ResNet)": Entry("timm", "ResNet", _timm("resnet18"), _image(), {"conv": (8, 2)}, "timm"),
    # 1 + 1 + 2 + 1 Bottlenecks (1x1, grouped 3x3, 1x1), each with its shortcut (a projection first in a stage).
    "regnetx_002 (timm RegNet, BatchNormAct2d)": Entry(
        "timm", "RegNet", _timm("regnetx_002"), _image(), {"conv": (5, 3)}, "timm"),
    # A block has a skip where stride 1 and in == out: none in stage 1 (DepthwiseSeparable 32 -> 16) and stage 7,
    # the last block of stage 2 (r2) and 3 (r2), two of stage 4 (r3) and 5 (r3, 80 -> 112 first), three of
    # stage 6 (r4): 1 + 1 + 2 + 2 + 3 = 9 InvertedResiduals of pw, dw, pwl (SqueezeExcite's convolutions gate).
    "efficientnet_b0 (timm EfficientNet, BatchNormAct2d + SE)": Entry(
        "timm", "EfficientNet", _timm("efficientnet_b0"), _image(), {"conv": (9, 3)}, "timm"),
    # Channels x0.5 rounded to multiples of 8; blocks per stage: 16 (stride 2) | 16 (s2), 16 | 24 (s2), 24, 24 |
    # 24, 24 | 48 (s2), 48, 48. A block keeps its skip at stride 1 with in == out: 1 + 2 + 2 + 2 = 7 (40 -> 48 at
    # full width, the fourth stage's first block is 24 -> 24 here and keeps its skip). pw, dw, pwl; SE gates.
    "mobilenetv3_small_050 (timm MobileNetV3, hardswish + SE)": Entry(
        "timm", "MobileNet", _timm("mobilenetv3_small_050"), _image(), {"conv": (7, 3)}, "timm"),
    # depths 1, 1, 2, 1: dwconv 7x7, then the 1x1 convolutions of its ConvMlp; gamma is the multiplier.
    "convnext_atto (timm ConvNeXt, conv_mlp)": Entry(
        "timm", "ConvNeXt", _timm("convnext_atto"), _image(), {"conv": (5, 3)}, "timm"),
    # 2 blocks: fused qkv (three layers) and proj; fc1 and fc2.
    "vit_tiny_patch16_224 (timm VisionTransformer, fused qkv)": Entry(
        "timm", "ViT", _timm("vit_tiny_patch16_224"), _image(), _TRANSFORMER, "timm"),
    # 16 GhostBottlenecks: ghost1 (a primary 1x1 conv, a cheap 3x3 depthwise conv on its output, concatenated),
    # at stride 2 a depthwise conv, SE in some (its convolutions gate), ghost2 the same as ghost1: each branch ends
    # in the concatenation of ghost2's two convolutions, both zeroed; m is the longest path, primary1 -> cheap1 ->
    # (dw) -> primary2 -> cheap2: 4, or 5 at stride 2 (blocks 1.0, 3.0, 5.0, 7.0). A first block of a stage that
    # changes width has a depthwise + pointwise projection shortcut (two layers, no nonlinearity between).
    "ghostnet_100 (timm GhostNet, concatenated ends)": Entry(
        "timm", "GhostNet", _timm("ghostnet_100"), _image(),
        {"conv": (16, (4, 5, 4, 5, 4, 5, 4, 4, 4, 4, 4, 5, 4, 4, 4, 4))}, "timm"),
    "resnet18 (torchvision ResNet)": Entry(
        "torchvision (architecture)", "ResNet", lambda: ResNet(BasicBlock, [2, 2, 2, 2], width=16), _image(),
        {"conv": (8, 2)}),
    "resnet50 (torchvision ResNet, width 16)": Entry(
        "torchvision (architecture)", "ResNet", lambda: ResNet(Bottleneck, [3, 4, 6, 3], width=16), _image(),
        {"conv": (16, 3)}),
    "nn.TransformerEncoder (post-norm)": Entry(
        "torch", "Transformer", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2, enable_nested_tensor=False),
        lambda: torch.randn(2, 5, 32), _TRANSFORMER),
    "nn.Transformer (pre-norm)": Entry(  # encoder self-attention, decoder self- and cross-attention; two MLPs
        "torch", "Transformer", lambda: nn.Transformer(32, 4, 1, 1, 64, batch_first=True, norm_first=True),
        lambda: (torch.randn(2, 5, 32), torch.randn(2, 4, 32)), {"attention": (3, 4), "mlp": (2, 2)}),
}


def as_inputs(x: object) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


@torch.no_grad()
def trained_statistics_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm statistics and an affine as training would: not the identity a fresh one nearly is."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
            m.num_batches_tracked.fill_(1000)
            if m.affine:
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.3)
    return model
