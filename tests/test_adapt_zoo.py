"""``fixup.adapt`` on third-party models: timm, transformers and torch classes, torchvision's ResNet layout.

For every model of tests/adapt_zoo.py: the adapted model is the same class, L, the kinds of branch, the
number of each kind and every branch's m match the count by hand, the factor is L^(-1/(2m-2)), no
normalisation is left, no non-linearity is lost, the weight layers keep their state_dict keys and one SGD
step on ``fixup.param_groups`` is finite. timm's tests are skipped, with the reason, where timm does not
import (it needs torchvision: tests/_torchvision_shim.py).
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
import fixup.branch
from adapt_zoo import ZOO, import_timm, timm_model
from fixup import AdaptError, FixupWarning, adapt, branch_scale

_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def _needs(package: str | None) -> None:
    """Skip, saying why, where ``package`` does not import."""
    if package == "timm":
        try:
            import_timm()
        except ImportError as err:
            pytest.skip(f"timm does not import here ({err}); .ci/run installs it beside torchvision --no-deps "
                        "(docs/adapt.md, Packages)")
    elif package is not None:
        pytest.importorskip(package, reason=f"{package} is not installed (the dev extra brings it)")


def _params(name: str) -> object:
    entry = ZOO[name]
    return pytest.param(name, id=name.split(" ")[0] + f"-{entry.source.split(' ')[0]}")


def as_inputs(x: object) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _logits(out: object) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        if key in out:  # type: ignore[operator]
            return out[key]  # type: ignore[index]
    raise AssertionError(f"no logits in {type(out).__name__}")


@pytest.mark.parametrize("name", [_params(n) for n in ZOO])
def test_adapt_counts_each_model_as_written(name: str) -> None:
    entry = ZOO[name]
    _needs(entry.needs)
    torch.manual_seed(0)
    original = entry.build()
    example = as_inputs(entry.example())
    weight_keys = {f"{n}.weight" for n, m in original.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        model, report = adapt(original, example)
    assert isinstance(model, type(original)) and model is not original
    assert report.num_branches == entry.L
    # Every branch, not one per kind: the kinds, how many of each, and each branch's m.
    assert Counter(b.kind for b in report.branches) == {kind: n for kind, (n, _) in entry.branches.items()}
    seen: Counter[str] = Counter()
    for b in report.branches:  # each branch's m: the kind's, or the kind's i-th where they differ
        m = entry.branches[b.kind][1]
        assert b.m == (m if isinstance(m, int) else m[seen[b.kind]]), b.name
        seen[b.kind] += 1
    assert all(b.factor == pytest.approx(branch_scale(entry.L, b.m)) for b in report.branches)
    assert 0 < report.nonlinearities_before == report.nonlinearities_after
    assert not any(isinstance(m, _NORMS) for m in model.modules())
    assert weight_keys <= set(model.state_dict())
    # It trains with fixup.param_groups: one SGD step at lr 0.1, momentum 0.9, finite.
    model.train()
    opt = torch.optim.SGD(fixup.param_groups(model, 0.1), lr=0.1, momentum=0.9)
    out = _logits(model(*example))
    loss = out.float().pow(2).mean() + out.float().mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())


class Attention(nn.Module):
    """Q, K and V fused in one Linear(dim, 3 * dim), as timm's ViT writes it."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
        q, k, v = qkv.unbind(0)
        x = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _encoder_layer(kind: str, dim: int = 32, heads: int = 4) -> nn.Module:
    class Separate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, N, C = x.shape
            q, k, v = (f(x).reshape(B, N, heads, C // heads).transpose(1, 2) for f in (self.q, self.k, self.v))
            return self.o(torch.softmax(q @ k.transpose(-1, -2) / (C // heads) ** 0.5, -1).matmul(v)
                          .transpose(1, 2).reshape(B, N, C))

    class MHA(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, x, x, need_weights=False)[0]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = {"fused": lambda: Attention(dim, heads), "separate": Separate, "mha": MHA}[kind]()
            self.mlp = Mlp(dim, 2 * dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    return nn.Sequential(Block(), Block(), Block(), nn.Linear(dim, 5))


def test_attention_counts_the_same_however_it_is_written() -> None:
    rows = {}
    for kind in ("fused", "separate", "mha"):
        _, report = adapt(_encoder_layer(kind), torch.randn(2, 6, 32))
        rows[kind] = [(b.kind, b.m, round(b.factor, 12), len(b.scaled)) for b in report.branches]
    assert rows["fused"] == rows["separate"] == rows["mha"]
    assert rows["fused"][0] == ("attention", 4, round(6 ** (-1 / 6), 12), 3)


def test_fused_qkv_is_declared_as_three_layers_with_their_own_fan() -> None:
    _, report = adapt(_encoder_layer("fused"), torch.randn(2, 6, 32))
    assert report.fused_qkv == ["0.attn.qkv", "1.attn.qkv", "2.attn.qkv"]
    scaled = report.branches[0].scaled
    assert [s.name for s in scaled] == [f"0.attn.qkv.weight[{a}:{a + 32}]" for a in (0, 32, 64)]
    # Each slice is drawn as one 32x32 layer (He fan_out = 32), times 6^(-1/6).
    assert all(s.std == pytest.approx((2 / 32) ** 0.5 * 6 ** (-1 / 6)) for s in scaled)


def _regnet() -> nn.Module:
    _needs("timm")
    return timm_model("regnetx_002")


def test_fused_norm_act_keeps_its_activation() -> None:
    original = _regnet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)  # timm's forward branches on self.training
        model, report = adapt(original, torch.randn(2, 3, 32, 32))
    relus = sum(isinstance(m, nn.ReLU) for m in model.modules())
    assert relus == sum(isinstance(m, nn.ReLU) for m in original.modules())
    # The stem's, then 5 blocks x (conv1's, conv2's, the one after the sum):
    assert report.nonlinearities_before == report.nonlinearities_after == 16
    assert isinstance(model.s1.b1.conv1.bn.act, nn.ReLU) and isinstance(model.s1.b1.conv1.bn, fixup.Bias)
    assert all("keeps its drop, act" in n.why for n in report.norms_replaced if n.name.endswith("conv1.bn"))
    assert hasattr(model, "forward_features")


def test_a_fused_norm_computing_its_activation_as_a_function_is_refused() -> None:
    class NormReLU(nn.BatchNorm2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(super().forward(x))

    model = _regnet()
    model.stem.bn = NormReLU(8)
    with pytest.raises(AdaptError, match=r"stem.bn \(NormReLU\) computes 'relu' itself.*child module"):
        adapt(model, torch.randn(2, 3, 32, 32))


def test_layer_scale_is_the_branch_multiplier() -> None:
    _needs("timm")
    model, report = adapt(timm_model("convnext_atto"), torch.randn(2, 3, 32, 32))
    blocks = ["stages.0.blocks.0", "stages.1.blocks.0", "stages.2.blocks.0", "stages.2.blocks.1", "stages.3.blocks.0"]
    assert report.layer_scales == [f"{b}.gamma" for b in blocks]
    widths = (8, 16, 24, 24, 32)  # TIMM_TINY's dims, stage by stage
    assert all(torch.equal(model.get_submodule(b).gamma, torch.ones(w)) for b, w in zip(blocks, widths))
    assert all(b.has_scale for b in report.branches)
    assert not any(isinstance(m, fixup.Scale) for m in model.stages.modules())  # no second multiplier
    assert report.warnings == []
    # timm's ViT has LayerScale modules (ls1, ls2) where init_values is given.
    vit, vit_report = adapt(timm_model("vit_tiny_patch16_224", init_values=1e-5), torch.randn(2, 3, 32, 32))
    assert vit_report.layer_scales == [f"blocks.{i}.ls{j}.gamma" for i in range(2) for j in (1, 2)]
    assert torch.equal(vit.blocks[0].ls1.gamma, torch.ones(32))


def test_tied_classifier_is_untied_with_a_warning_never_zeroing_the_embedding() -> None:
    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(50, 16)
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
            self.lm_head = nn.Linear(16, 50, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.wte(ids)
            return self.lm_head(x + self.fc2(torch.relu(self.fc1(x))))

    ids = torch.randint(0, 50, (2, 7))
    original = TiedLM()
    table = original.wte.weight.detach().clone()
    with pytest.warns(FixupWarning, match=r"lm_head.weight was tied to wte.weight; untied"):
        model, report = adapt(original, ids)
    assert torch.equal(model.wte.weight, table) and torch.count_nonzero(model.lm_head.weight) == 0
    assert model.lm_head.weight is not model.wte.weight and len(report.untied) == 1
    with pytest.raises(AdaptError, match=r"lm_head.weight is the same parameter as wte.weight.*Untie it first"):
        adapt(TiedLM(), ids, untie_weights=False)


def test_a_decision_on_tensor_values_is_an_error_under_strict() -> None:
    class Decides(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f, self.g, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                x = x + self.g(torch.relu(self.f(x)))
            return self.head(x)

    with pytest.raises(AdaptError, match=r"decision on tensor values \(__bool__ of gt in the root\)"):
        adapt(Decides(), torch.ones(2, 8))
    with pytest.warns(FixupWarning, match="decision on tensor values"):
        _, report = adapt(Decides(), torch.ones(2, 8), strict=False)
    assert report.num_branches == 1


def test_original_weights_load_with_a_report_of_what_was_dropped() -> None:
    original = _regnet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        model, report = adapt(original, torch.randn(2, 3, 32, 32), state_dict=original.state_dict())
    convs = [k for k in original.state_dict() if k.endswith("conv.weight")]
    assert set(convs) <= set(report.weights_loaded)
    assert all(torch.equal(model.state_dict()[k], original.state_dict()[k]) for k in convs)
    assert any(d.startswith("stem.bn.running_mean: no such entry") for d in report.weights_dropped)
    assert any(d.startswith("stem.bn.bias: shape (8,)") for d in report.weights_dropped)
    assert any("no longer start at zero" in w for w in report.warnings)
    # The same, later, on an adapted model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        fresh, _ = adapt(_regnet(), torch.randn(2, 3, 32, 32))
    loaded = fixup.load_original(fresh, original.state_dict())
    assert loaded.loaded == report.weights_loaded and loaded.dropped == report.weights_dropped


def test_gpt2_conv1d_and_tied_head() -> None:
    entry = ZOO["gpt2 (GPT2LMHeadModel)"]
    _needs(entry.needs)
    original = entry.build()
    wte = original.transformer.wte.weight.detach().clone()
    with pytest.warns(FixupWarning, match=r"lm_head.weight was tied to transformer.wte.weight; untied"):
        model, report = adapt(original, entry.example())
    assert torch.equal(model.transformer.wte.weight, wte) and torch.count_nonzero(model.lm_head.weight) == 0
    assert model.config.tie_word_embeddings is False
    attention = report.branches[0]
    # transformers' Conv1D stores its weight (in, out): declared transposed, Q, K and V as three layers.
    assert [s.name for s in attention.scaled] == [f"transformer.h.0.attn.c_attn.weight.T[{a}:{a + 32}]"
                                                  for a in (0, 32, 64)]
    assert attention.zeroed.name == "transformer.h.0.attn.c_proj.weight.T"
    assert all(s.std == pytest.approx((2 / 32) ** 0.5 * 4 ** (-1 / 6)) for s in attention.scaled)


def test_fixup_train_adapts_a_users_model(tmp_path: object) -> None:
    from pathlib import Path

    from fixup.train import TrainConfig, fit

    _needs("timm")
    zoo = Path(__file__).with_name("adapt_zoo.py")
    config = TrainConfig(adapt=f"{zoo}:timm_regnet", channels=3, image_size=16, batch_size=64, max_updates=3,
                         epochs=1, checkpoint=False, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        result = fit(config, out_dir=None, progress=False)
    assert result.outcome.status == "completed"
    groups = {g["name"]: g for g in result.param_groups}
    # The adapted model's scalars learn at lr/10, its 5 stream biases (bn of each block's conv3) share lr/10.
    assert groups["scalars"]["lr"] == pytest.approx(0.01) and groups["stream_biases"]["lr"] == pytest.approx(0.01 / 5)


_IMAGE_MODELS = [n for n, e in ZOO.items() if e.source.startswith("timm") or "Image" in n or "torchvision" in n]


@pytest.mark.parametrize("name", [_params(n) for n in _IMAGE_MODELS])
def test_every_image_model_adapts_under_the_gated_methods_and_the_stream_keeps_its_scale(name: str) -> None:
    """adapt(method="rezero") on each image model of the zoo: a Gate at 0 on every branch, each branch outputs zero,
    one SGD step over param_groups moves every gate; and under Fixup, SkipInit and ReZero (each at the default
    trunk rule) no stage of the stream leaves 0.5x-2x the input's RMS at initialisation."""
    entry = ZOO[name]
    _needs(entry.needs)
    torch.manual_seed(0)
    x = entry.example()

    def adapted(method: str) -> tuple[nn.Module, object]:
        # each method on the same draw of the model. Over draws 0-4 of every model here and the three methods, 5 of
        # 225 stages dip to 0.41-0.48, each where a ReLU after the sum halves a unit stream's second moment (0.71x
        # expected) on a two-image example (docs/adapt.md, "The stream at initialisation under every method")
        torch.manual_seed(1)
        return adapt(entry.build(), x, method=method)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, report = adapted("rezero")
        _, fixup_report = adapted("fixup")
        _, skipinit_report = adapted("skipinit")
    for r in (fixup_report, skipinit_report, report):
        assert r.stream and all(0.5 <= s.ratio <= 2.0 for s in r.stream), (type(r).__name__, [
            (s.name, round(s.ratio, 3)) for s in r.stream])
    gates = [b.scale for _, b in fixup.branch.find_branches(model)]
    assert len(gates) == report.num_branches == entry.L
    assert all(isinstance(g, fixup.Gate) and float(g.scale.detach()) == 0.0 for g in gates)
    opt = torch.optim.SGD(fixup.param_groups(model, lr=0.1), lr=0.1, momentum=0.9)
    model.train()
    logits = _logits(model(*as_inputs(x)))
    target = torch.zeros(logits.shape[0], dtype=torch.long)
    F.cross_entropy(logits.reshape(logits.shape[0], -1)[:, :2], target).backward()
    opt.step()
    assert all(float(g.scale.detach()) != 0.0 for g in gates)
