"""Third-party models for ``fixup.adapt``: real classes from transformers and torch, built from tiny configs
(never downloaded), and the architecture code of timm and torchvision written here.

timm and torchvision cannot be imported beside the CPU build of torch 2.13 (torchvision 0.28 is served only
as a CUDA build whose extension fails to load, "operator torchvision::nms does not exist", and every
``import timm`` imports torchvision: ``timm/layers/create_norm.py`` needs ``FrozenBatchNorm2d``). Their
models are therefore written here, module for module as in timm 1.0 and torchvision 0.28: the same
module types, attribute names and forward computations (timm's ``BatchNormAct2d`` applies its activation
inside its own forward; timm's ViT fuses Q, K and V in one Linear; timm's ConvNeXt multiplies by
``gamma.reshape(1, -1, 1, 1)``).

Each entry: ``ZOO[name] = Entry(source, build, example, L, ms)``: the expected number of residual branches
and the set of m per branch kind, counted by hand from the architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from test_adapt import BasicBlock, Bottleneck, ResNet


@dataclass
class Entry:
    source: str                         # "transformers", "torch", "timm (architecture)", "torchvision (architecture)"
    family: str
    build: Callable[[], nn.Module]
    example: Callable[[], torch.Tensor]
    L: int
    ms: dict[str, int]                  # branch kind -> m
    needs: str | None = None            # a package that must import


def _image(size: int = 32) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def _ids() -> torch.Tensor:
    return torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))


# --- timm's architecture (timm 1.0: timm/layers/norm_act.py, timm/models/{vision_transformer,convnext,regnet}.py) ---

class BatchNormAct2d(nn.BatchNorm2d):
    """timm.layers.BatchNormAct2d: batch norm, then ``self.drop`` and ``self.act`` inside its own forward."""

    def __init__(self, num_features: int, apply_act: bool = True, act_layer: type[nn.Module] = nn.ReLU) -> None:
        super().__init__(num_features)
        self.drop = nn.Identity()
        self.act = act_layer() if apply_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn_training = self.training or self.running_mean is None
        x = F.batch_norm(x, self.running_mean if not self.training or self.track_running_stats else None,
                         self.running_var if not self.training or self.track_running_stats else None,
                         self.weight, self.bias, bn_training, self.momentum or 0.0, self.eps)
        return self.act(self.drop(x))


class ConvNormAct(nn.Module):
    """timm.layers.ConvNormAct: a convolution and a BatchNormAct2d."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, apply_act: bool = True,
                 act_layer: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
        self.bn = BatchNormAct2d(cout, apply_act, act_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class RegBottleneck(nn.Module):
    """timm.models.regnet.Bottleneck (RegNetX): three ConvNormAct, a projection shortcut, ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int, group_size: int = 4) -> None:
        super().__init__()
        self.conv1 = ConvNormAct(cin, cout, 1)
        self.conv2 = ConvNormAct(cout, cout, 3, stride, groups=cout // group_size)
        self.conv3 = ConvNormAct(cout, cout, 1, apply_act=False)
        self.downsample = ConvNormAct(cin, cout, 1, stride, apply_act=False) if stride != 1 or cin != cout else None
        self.act3 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv3(self.conv2(self.conv1(x)))
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        return self.act3(x + shortcut)


class TimmRegNet(nn.Module):
    """timm's RegNetX layout at a tiny size: stem ConvNormAct, stages of Bottlenecks, pooled linear head."""

    def __init__(self, widths: tuple[int, ...] = (8, 16), depths: tuple[int, ...] = (1, 2), num_classes: int = 10,
                 in_chans: int = 3) -> None:
        super().__init__()
        self.stem = ConvNormAct(in_chans, 8, 3, 2)
        blocks, cin = [], 8
        for w, d in zip(widths, depths):
            blocks += [RegBottleneck(cin if i == 0 else w, w, 2 if i == 0 else 1) for i in range(d)]
            cin = w
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x).mean((2, 3)))


class SqueezeExcite(nn.Module):
    """timm.models._efficientnet_blocks.SqueezeExcite."""

    def __init__(self, c: int, rd: int) -> None:
        super().__init__()
        self.conv_reduce, self.act1 = nn.Conv2d(c, rd, 1), nn.SiLU()
        self.conv_expand, self.gate = nn.Conv2d(rd, c, 1), nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.conv_expand(self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True))))
        return x * self.gate(s)


class InvertedResidual(nn.Module):
    """timm.models._efficientnet_blocks.InvertedResidual (EfficientNet's MBConv): BatchNormAct2d after each conv."""

    def __init__(self, c: int, expand: int = 4) -> None:
        super().__init__()
        mid = c * expand
        self.conv_pw, self.bn1 = nn.Conv2d(c, mid, 1, bias=False), BatchNormAct2d(mid, act_layer=nn.SiLU)
        self.conv_dw = nn.Conv2d(mid, mid, 3, 1, 1, groups=mid, bias=False)
        self.bn2 = BatchNormAct2d(mid, act_layer=nn.SiLU)
        self.se = SqueezeExcite(mid, max(1, c // 4))
        self.conv_pwl, self.bn3 = nn.Conv2d(mid, c, 1, bias=False), BatchNormAct2d(c, apply_act=False)
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.bn2(self.conv_dw(self.bn1(self.conv_pw(x))))
        x = self.bn3(self.conv_pwl(self.se(x)))
        return self.drop_path(x) + shortcut


class TimmEfficientNet(nn.Module):
    """timm's EfficientNet layout at a tiny size: ConvNormAct stem, MBConv blocks, conv head, classifier."""

    def __init__(self, c: int = 8, blocks: int = 3, num_classes: int = 10, in_chans: int = 3) -> None:
        super().__init__()
        self.conv_stem, self.bn1 = nn.Conv2d(in_chans, c, 3, 2, 1, bias=False), BatchNormAct2d(c, act_layer=nn.SiLU)
        self.blocks = nn.Sequential(*[InvertedResidual(c) for _ in range(blocks)])
        self.conv_head, self.bn2 = nn.Conv2d(c, 32, 1, bias=False), BatchNormAct2d(32, act_layer=nn.SiLU)
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn2(self.conv_head(self.blocks(self.bn1(self.conv_stem(x)))))
        return self.classifier(x.mean((2, 3)))


class Attention(nn.Module):
    """timm.models.vision_transformer.Attention: Q, K and V fused in one Linear(dim, 3 * dim)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class LayerScale(nn.Module):
    """timm.layers.LayerScale: ``x * gamma``, gamma a per-channel parameter."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    """timm.models.vision_transformer.Block: pre-norm attention and MLP, each with a LayerScale."""

    def __init__(self, dim: int, heads: int, init_values: float | None = 1e-5) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 2 * dim)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class TimmViT(nn.Module):
    """timm's VisionTransformer at a tiny size: conv patch embedding, class token, pre-norm blocks, head."""

    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 4, patch: int = 8, img: int = 32,
                 num_classes: int = 10, in_chans: int = 3, init_values: float | None = 1e-5) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(in_chans, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads, init_values) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.norm(self.blocks(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x)[:, 0])


class LayerNorm2d(nn.LayerNorm):
    """timm.layers.LayerNorm2d: LayerNorm over channels of an NCHW tensor (permute, F.layer_norm, permute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """timm.models.convnext.ConvNeXtBlock (conv_mlp): depthwise conv, LayerNorm2d, 1x1 MLP, ``gamma``."""

    def __init__(self, dim: int, ls_init_value: float = 1e-6) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = LayerNorm2d(dim)
        self.fc1, self.act, self.fc2 = nn.Conv2d(dim, 4 * dim, 1), nn.GELU(), nn.Conv2d(4 * dim, dim, 1)
        self.gamma = nn.Parameter(ls_init_value * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.fc2(self.act(self.fc1(self.norm(self.conv_dw(x)))))
        x = x.mul(self.gamma.reshape(1, -1, 1, 1))
        return x + shortcut


class TimmConvNeXt(nn.Module):
    """timm's ConvNeXt at a tiny size: patchify stem, stages with LayerNorm2d + strided conv downsampling."""

    def __init__(self, dims: tuple[int, ...] = (8, 16), depths: tuple[int, ...] = (1, 2), num_classes: int = 10,
                 in_chans: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_chans, dims[0], 4, 4), LayerNorm2d(dims[0]))
        stages, cin = [], dims[0]
        for i, (d, n) in enumerate(zip(dims, depths)):
            down = nn.Identity() if i == 0 else nn.Sequential(LayerNorm2d(cin), nn.Conv2d(cin, d, 2, 2))
            stages.append(nn.Sequential(down, *[ConvNeXtBlock(d) for _ in range(n)]))
            cin = d
        self.stages = nn.Sequential(*stages)
        self.norm, self.fc = nn.LayerNorm(cin), nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.stages(self.stem(x)).mean((2, 3))))


# --- transformers (tiny configs, built from code) ---

def _hf(cls_name: str, config_name: str, **config: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers
        return getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
    return build


_TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 16}

ZOO: dict[str, Entry] = {
    "bert (BertForSequenceClassification)": Entry(
        "transformers", "BERT", _hf("BertForSequenceClassification", "BertConfig", num_labels=3, **_TEXT),
        _ids, 4, {"attention": 4, "mlp": 2}, "transformers"),
    "bert (BertModel)": Entry(
        "transformers", "BERT", _hf("BertModel", "BertConfig", **_TEXT), _ids, 4, {"attention": 4, "mlp": 2},
        "transformers"),
    "gpt2 (GPT2LMHeadModel)": Entry(
        "transformers", "GPT-2", _hf("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                     n_positions=16, bos_token_id=1, eos_token_id=1),
        _ids, 4, {"attention": 4, "mlp": 2}, "transformers"),
    "vit (ViTForImageClassification)": Entry(
        "transformers", "ViT", _hf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8,
                                   hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   num_labels=10),
        _image(), 4, {"attention": 4, "mlp": 2}, "transformers"),
    "convnext (ConvNextForImageClassification)": Entry(
        "transformers", "ConvNeXt", _hf("ConvNextForImageClassification", "ConvNextConfig", hidden_sizes=[8, 16],
                                        depths=[1, 2], num_stages=2, num_labels=10),
        _image(), 3, {"mixed": 3}, "transformers"),
    "resnet (ResNetForImageClassification)": Entry(
        "transformers", "ResNet", _hf("ResNetForImageClassification", "ResNetConfig", embedding_size=8,
                                      hidden_sizes=[8, 16], depths=[1, 2], layer_type="bottleneck", num_labels=10),
        _image(), 3, {"conv": 3}, "transformers"),
    "regnet (RegNetForImageClassification)": Entry(
        "transformers", "RegNet", _hf("RegNetForImageClassification", "RegNetConfig", embedding_size=8,
                                      hidden_sizes=[8, 16], depths=[1, 2], groups_width=4, num_labels=10),
        _image(), 3, {"conv": 3}, "transformers"),
    "mobilenet_v2 (MobileNetV2ForImageClassification)": Entry(
        "transformers", "MobileNet", _hf("MobileNetV2ForImageClassification", "MobileNetV2Config",
                                         depth_multiplier=0.25, image_size=32, num_labels=10),
        _image(), 10, {"conv": 3}, "transformers"),
    "efficientnet (EfficientNetForImageClassification)": Entry(
        "transformers", "EfficientNet", _hf("EfficientNetForImageClassification", "EfficientNetConfig", image_size=32,
                                            width_coefficient=0.25, depth_coefficient=0.5, hidden_dim=320,
                                            num_labels=10),
        _image(), 3, {"conv": 3}, "transformers"),
    "regnetx (timm RegNet, BatchNormAct2d)": Entry(
        "timm (architecture)", "RegNet", TimmRegNet, _image(), 3, {"conv": 3}),
    "efficientnet (timm MBConv, BatchNormAct2d + SE)": Entry(
        "timm (architecture)", "EfficientNet", TimmEfficientNet, _image(), 3, {"conv": 3}),
    "vit (timm VisionTransformer, fused qkv, LayerScale)": Entry(
        "timm (architecture)", "ViT", TimmViT, _image(), 4, {"attention": 4, "mlp": 2}),
    "convnext (timm ConvNeXt, gamma)": Entry(
        "timm (architecture)", "ConvNeXt", TimmConvNeXt, _image(), 3, {"conv": 3}),
    "resnet18 (torchvision ResNet)": Entry(
        "torchvision (architecture)", "ResNet", lambda: ResNet(BasicBlock, [2, 2, 2, 2], width=16), _image(), 8,
        {"conv": 2}),
    "resnet50 (torchvision ResNet, width 16)": Entry(
        "torchvision (architecture)", "ResNet", lambda: ResNet(Bottleneck, [3, 4, 6, 3], width=16), _image(), 16,
        {"conv": 3}),
    "nn.TransformerEncoder (post-norm)": Entry(
        "torch", "Transformer", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2, enable_nested_tensor=False),
        lambda: torch.randn(2, 5, 32), 4, {"attention": 4, "mlp": 2}),
    "nn.Transformer (pre-norm)": Entry(
        "torch", "Transformer", lambda: nn.Transformer(32, 4, 1, 1, 64, batch_first=True, norm_first=True),
        lambda: (torch.randn(2, 5, 32), torch.randn(2, 4, 32)), 5, {"attention": 4, "mlp": 2}),
}
