"""``fixup.adapt`` on residual structures written elsewhere: what it finds, counts, replaces and refuses."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import fixup
from fixup import AdaptError, Bias, Scale, adapt, branch_scale

# --- torchvision-style ResNet (the module structure of torchvision.models.resnet, written here) ---

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: type[nn.Module], layers: list[int], width: int = 64, num_classes: int = 10,
                 in_channels: int = 3, small_input: bool = False) -> None:
        super().__init__()
        self.inplanes = width
        if small_input:
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        for i, n in enumerate(layers):
            stages.append(self._make_layer(block, width * 2 ** i, n, 1 if i == 0 else 2))
        self.layer1, self.layer2, self.layer3, self.layer4 = (stages + [nn.Identity()] * 4)[:4]
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.inplanes, num_classes)

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50_structure(width: int = 16, num_classes: int = 10) -> ResNet:
    """torchvision's ResNet-50 layout (Bottleneck, [3, 4, 6, 3]) at a quarter of its width."""
    return ResNet(Bottleneck, [3, 4, 6, 3], width=width, num_classes=num_classes)


def branch_outputs(model: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """The output of every branch multiplier (the branch F just before the residual sum)."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: outs.append(out.detach().clone()))
             for m in model.modules() if isinstance(m, Scale)]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    return outs


def no_norm_left(model: nn.Module) -> bool:
    norms = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
    return not any(isinstance(m, norms) for m in model.modules())


def test_resnet50_structure_counts_bottlenecks_and_is_the_identity_at_init() -> None:
    torch.manual_seed(0)
    original = resnet50_structure()
    before = copy.deepcopy(original.state_dict())
    model, report = adapt(original, torch.randn(2, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    assert report.num_branches == 16
    assert {b.m for b in report.branches} == {3}
    assert all(b.factor == pytest.approx(0.5) for b in report.branches)  # 16 ** (-1/4)
    assert [b.zeroed.name for b in report.branches][:4] == [f"layer1.{i}.conv3" for i in range(3)] + ["layer2.0.conv3"]
    assert [s.name for s in report.branches[0].scaled] == ["layer1.0.conv1", "layer1.0.conv2"]
    # One projection shortcut per stage, He-initialised and not scaled; identity shortcuts elsewhere.
    assert [r.shortcut for r in report.residuals].count("projection") == 4
    assert [s.name for s in report.shortcuts] == [f"layer{i}.0.downsample.0" for i in range(1, 5)]
    assert [c.name for c in report.classifier] == ["fc"]
    assert report.warnings == []
    assert no_norm_left(model)
    # 53 BatchNorms: the stem's (before a ReLU) and the branches' become scalar biases, the 4 on
    # projection shortcuts are removed.
    actions = {(n.name, n.action) for n in report.norms_replaced}
    assert ("bn1", "bias") in actions and ("layer1.0.downsample.1", "removed") in actions
    assert len(report.norms_replaced) == 53 and sum(a == "removed" for _, a in actions) == 4
    # Each branch: scalar biases before each conv and each ReLU (the BN before a ReLU becomes that
    # bias), one after the last conv (its BN), and one multiplier.
    assert all(b.num_biases == 6 and b.has_scale for b in report.branches)
    # Identity at init: every branch outputs zeros, and so does the classifier.
    x = torch.randn(2, 3, 32, 32)
    outs = branch_outputs(model, x)
    assert len(outs) == 16 and all(torch.count_nonzero(o) == 0 for o in outs)
    assert torch.count_nonzero(model(x)) == 0
    # The input model is untouched, and weight layers keep their names.
    assert all(torch.equal(before[k], v) for k, v in original.state_dict().items())
    assert "layer3.5.conv2.weight" in model.state_dict() and "layer3.5.bn2.bias" in model.state_dict()


def test_basic_block_resnet_and_the_report_round_trip() -> None:
    _model, report = adapt(ResNet(BasicBlock, [2, 2], width=8), torch.randn(1, 3, 16, 16))
    assert report.num_branches == 4 and {b.m for b in report.branches} == {2}
    assert report.branches[0].factor == pytest.approx(branch_scale(4, 2))
    assert [r.shortcut for r in report.residuals] == ["identity", "identity", "projection", "identity"]
    text = str(report)
    assert "residual sums found: 4" in text and "BatchNorm2d -> scalar Bias" in text
    again = fixup.AdaptReport.from_dict(report.to_dict())
    assert again == report


def test_adapted_model_survives_deepcopy_pickling_and_reinitialisation() -> None:
    model, report = adapt(ResNet(BasicBlock, [1, 1], width=8), torch.randn(1, 3, 8, 8))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        again = fixup.fixup_init_(clone)
        assert again.num_branches == report.num_branches == 2
        assert [c.name for c in again.classifier] == ["fc"]
        assert [b.name for b in again.branches] == ["layer1.0", "layer2.0"]


# --- pre-activation, squeeze-excite, MLP ---

class PreActBlock(nn.Module):
    def __init__(self, inp: int, out: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(inp), nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(out), nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(inp, out, 1, stride, bias=False) if stride != 1 or inp != out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(x))
        shortcut = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + shortcut


class PreActNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, 1, 1, bias=False)
        self.blocks = nn.Sequential(PreActBlock(8, 8), PreActBlock(8, 16, 2), PreActBlock(16, 16))
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.blocks(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def test_preactivation_blocks() -> None:
    model, report = adapt(PreActNet(), torch.randn(2, 1, 8, 8))
    assert report.num_branches == 3 and {b.m for b in report.branches} == {2}
    assert [b.zeroed.name for b in report.branches] == [f"blocks.{i}.conv2" for i in range(3)]
    assert [r.shortcut for r in report.residuals] == ["identity", "projection", "identity"]
    assert [s.name for s in report.shortcuts] == ["blocks.1.shortcut"]
    # The shortcut projection starts from relu(bn1(x)), so the branch forks there, after bn1.
    assert report.residuals[1].layers == ["blocks.1.conv1", "blocks.1.conv2"]
    assert no_norm_left(model) and all(n.action == "bias" for n in report.norms_replaced)
    assert all(torch.count_nonzero(o) == 0 for o in branch_outputs(model, torch.randn(2, 1, 8, 8)))


class SEBlock(nn.Module):
    """Basic block with squeeze-excite (Hu et al. 2018) after its second convolution."""

    def __init__(self, ch: int, reduction: int = 4) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch)
        self.conv2, self.bn2 = nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch)
        self.fc1, self.fc2 = nn.Conv2d(ch, ch // reduction, 1), nn.Conv2d(ch // reduction, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(out.mean((2, 3), keepdim=True)))))
        return torch.relu(x + out * gate)


def test_squeeze_excite_layers_are_gates_not_branch_layers() -> None:
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), SEBlock(16), SEBlock(16), nn.Flatten(), nn.Linear(16 * 64, 4))
    model, report = adapt(net, torch.randn(2, 3, 8, 8))
    assert report.num_branches == 2 and {b.m for b in report.branches} == {2}
    assert [b.zeroed.name for b in report.branches] == ["1.conv2", "2.conv2"]
    assert report.residuals[0].gates == ["1.fc1", "1.fc2"]
    # Gate layers are He-initialised without depth scaling, like any other layer outside a branch.
    assert {r.name for r in report.other_layers} >= {"1.fc1", "1.fc2", "2.fc1", "2.fc2"}
    assert all(torch.count_nonzero(o) == 0 for o in branch_outputs(model, torch.randn(2, 3, 8, 8)))


class SkipMLP(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(64, dim)
        self.fc1 = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(depth))
        self.fc2 = nn.ModuleList(nn.Linear(2 * dim, dim) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for fc1, fc2, norm in zip(self.fc1, self.fc2, self.norms):
            h = h + fc2(nn.functional.gelu(fc1(norm(h))))
        return self.out(h)


def test_mlp_with_skip_connections_declared_by_the_root() -> None:
    model, report = adapt(SkipMLP(), torch.randn(3, 64))
    assert report.num_branches == 4 and {b.m for b in report.branches} == {2}
    assert [b.name for b in report.branches] == [f"SkipMLP[{i}]" for i in range(4)]
    assert [b.zeroed.name for b in report.branches] == [f"fc2.{i}" for i in range(4)]
    assert report.branches[0].factor == pytest.approx(0.5)
    # Each skip's LayerNorm feeds only fc1: it becomes fc1's scalar bias.
    assert all(n.action == "bias" and "next weight layer" in n.why for n in report.norms_replaced)
    x = torch.randn(3, 64)
    assert torch.equal(model(x), torch.zeros(3, 10))


# --- PyTorch's Transformer layers ---

def encoder(norm_first: bool, layers: int = 3, dim: int = 32) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True, norm_first=norm_first)
    return nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(dim) if norm_first else None,
                                 enable_nested_tensor=False)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_transformer_encoder_is_the_identity_at_init(norm_first: bool) -> None:
    model, report = adapt(encoder(norm_first), torch.randn(2, 5, 32))
    assert report.num_branches == 6
    assert [b.kind for b in report.branches] == ["attention", "mlp"] * 3
    assert [b.m for b in report.branches] == [4, 2] * 3
    attention, ffn = report.branches[:2]
    assert attention.factor == pytest.approx(6 ** (-1 / 6)) and ffn.factor == pytest.approx(6 ** (-1 / 2))
    assert [s.name for s in attention.scaled] == [f"layers.0.self_attn.in_proj_weight[{a}:{a + 32}]"
                                                  for a in (0, 32, 64)]
    assert attention.zeroed.name == "layers.0.self_attn.out_proj" and ffn.zeroed.name == "layers.0.linear2"
    # Post-norm: every LayerNorm is on the residual stream and goes. Pre-norm: norm1/norm2 feed only the
    # branch's first layers and become their scalar bias; the final norm is on the stream and goes.
    actions = {n.name: n.action for n in report.norms_replaced}
    expected = {name: "bias" if norm_first and name.rpartition(".")[2] in ("norm1", "norm2") else "removed"
                for name in actions}
    assert no_norm_left(model) and actions == expected
    assert any("no classifier" in w for w in report.warnings)
    # The stock MultiheadAttention stays (its fused weight and its kernels); the block is exact identity.
    assert isinstance(model.get_submodule("layers.0.self_attn"), nn.MultiheadAttention)
    model.eval()
    x = torch.randn(2, 5, 32)
    assert torch.equal(model(x), x)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_transformer_decoder_counts_self_and_cross_attention(norm_first: bool) -> None:
    layer = nn.TransformerDecoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
    decoder = nn.TransformerDecoder(layer, 2)
    tgt, memory = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    model, report = adapt(decoder, (tgt, memory))
    assert report.num_branches == 6
    assert [b.kind for b in report.branches] == ["attention", "attention", "mlp"] * 2
    assert report.branches[1].zeroed.name == "layers.0.multihead_attn.out_proj"
    assert [b.factor for b in report.branches[:3]] == pytest.approx([6 ** (-1 / 6)] * 2 + [6 ** -0.5])
    model.eval()
    assert torch.equal(model(tgt, memory), tgt)


def test_full_nn_transformer() -> None:
    _model, report = adapt(nn.Transformer(32, 4, 2, 2, 64, batch_first=True),
                          (torch.randn(2, 5, 32), torch.randn(2, 3, 32)))
    assert report.num_branches == 2 * 2 + 2 * 3
    assert sum(b.kind == "attention" for b in report.branches) == 6


# --- what it refuses ---

class TwoSided(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a1, self.a2, self.b1, self.b2 = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a2(torch.relu(self.a1(x))) + self.b2(torch.relu(self.b1(x)))


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.g, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.g(torch.relu(self.f(x)))
        x = x + self.g(torch.relu(self.f(x)))  # the same layers in two branches
        return self.head(x)


class EndsInActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.g, self.h, self.k = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.k(torch.relu(self.h(x)))
        return x + torch.tanh(self.g(torch.relu(self.f(x))))


class HiddenWeights(nn.Module):
    """Weights on a branch that are not Linear/Conv modules: a transposed conv, a bare parameter."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        self.functional = functional
        self.f, self.g = nn.Linear(8, 8), nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 8))
        self.up = nn.ConvTranspose1d(1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.f(x))
        h = nn.functional.linear(h, self.w) if self.functional else self.up(h.unsqueeze(1)).squeeze(1)
        return x + self.g(h)


@pytest.mark.parametrize("model, node, why", [
    (TwoSided(), "add", "both operands of this add pass through weight layers"),
    (HiddenWeights(functional=True), "linear", "parameter 'w' is used as a weight directly"),
    (HiddenWeights(functional=False), "conv_transpose1d", "parameter 'up.weight' is used as a weight directly"),
    (Shared(), "g", "called 2 times"),
    (EndsInActivation(), "add_1", "branch ends in 'tanh'"),
])
def test_unattributable_structures_are_errors_naming_the_node(model: nn.Module, node: str, why: str) -> None:
    with pytest.raises(AdaptError, match=rf"node '{node}'.*{why}"):
        adapt(model, torch.randn(2, 8))


def test_without_strict_they_are_warnings_and_left_out_of_L() -> None:
    _model, report = adapt(EndsInActivation(), torch.randn(2, 8), strict=False)
    assert report.num_branches == 1 and report.branches[0].zeroed.name == "k"
    assert any("branch ends in 'tanh'" in w for w in report.warnings)
    with pytest.raises(AdaptError, match="found no residual sum"):
        adapt(TwoSided(), torch.randn(2, 8), strict=False)


def test_a_model_without_residual_sums_is_refused() -> None:
    with pytest.raises(AdaptError, match="no residual sum"):
        adapt(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(1, 4))


def test_positional_embedding_sum_is_not_a_residual_branch() -> None:
    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Linear(8, 16), nn.Embedding(10, 16)
            self.f, self.g, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.tok(x) + self.pos(torch.arange(x.size(1)))  # depends on x's shape only
            h = h + self.g(torch.relu(self.f(h)))
            return self.head(h.mean(1))

    original = Embed()
    pos = original.pos.weight.detach().clone()
    model, report = adapt(original, torch.randn(2, 5, 8))
    assert report.num_branches == 1 and report.branches[0].zeroed.name == "g"
    # The scalars sit on the one branch (f, g) and the classifier, none on the embedding sum.
    scalars = {n: type(m) for n, m in model.named_modules() if isinstance(m, Bias | Scale)}
    assert scalars == {"f.fixup_bias": Bias, "f.fixup_out_bias": Bias, "g.fixup_bias": Bias, "g.fixup_scale": Scale,
                       "head.fixup_bias": Bias}
    assert report.branches[0].num_biases == 3 and report.branches[0].has_scale
    assert torch.equal(model.pos.weight, pos) and "pos (Embedding)" in str(report)  # left alone


class ModeDependent(nn.Module):
    """Stochastic depth written with a Python branch on ``self.training``, and functional dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.f, self.g, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.g(nn.functional.dropout(torch.relu(self.f(x)), 0.5, self.training))
        if self.training:
            h = h * (torch.rand_like(h[:, :1]) < 0.9)
        return self.head(x + h)


def test_train_eval_dependence_is_reported_and_the_model_keeps_following_its_mode() -> None:
    model, report = adapt(ModeDependent(), torch.randn(4, 8))
    assert isinstance(model, ModeDependent)
    assert any("computes differently in train mode" in w for w in report.warnings)
    # The model runs its own forward: functional dropout and the stochastic depth follow train()/eval().
    with torch.no_grad():
        model.head.weight.normal_()
        model.g.weight.normal_()
    x = torch.randn(64, 8)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
    _, quiet = adapt(SkipMLP(), torch.randn(2, 64))
    assert not any("computes differently" in w for w in quiet.warnings)


def test_new_scalars_take_the_models_dtype() -> None:
    model, _ = adapt(SkipMLP().double(), torch.randn(3, 64, dtype=torch.float64))
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_a_residual_sum_nested_in_another_branch_is_refused() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c, self.d = (nn.Linear(8, 8) for _ in range(4))
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            h = h + self.c(torch.relu(self.b(h)))  # inner residual inside the outer branch
            return self.head(x + self.d(h))

    with pytest.raises(AdaptError, match="lies in two residual branches"):
        adapt(Nested(), torch.randn(2, 8))


def test_leaf_modules_are_kept_whole() -> None:
    class Stem(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x))

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block, self.head = Stem(), Stem(), nn.Linear(8, 2)
            self.block.conv = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.stem(x)
            return self.head((h + self.block(h)).mean((2, 3)))

    # Kept whole, the branch's weights are hidden in a module that cannot be counted: refused.
    with pytest.raises(AdaptError, match=r"node 'add'.*'block' \(Stem\) on one of them holds a weight matrix"):
        adapt(Branchy(), torch.randn(1, 3, 8, 8), leaf_modules=(Stem,))
    with pytest.raises(AdaptError, match="branch ends in 'relu_1'"):
        adapt(Branchy(), torch.randn(1, 3, 8, 8))
