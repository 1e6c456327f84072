"""Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, CVPR 2025): the layer, the ``dyt`` method of the library's Transformer,
``fixup.adapt(model, x, method="dyt")`` on LayerNorm models written elsewhere, and its refusal of BatchNorm."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from adapt_zoo import ZOO
from fixup.nn import DYT_ALPHA, DyT
from test_adapt_zoo import _needs, as_inputs


@pytest.fixture
def opacus():
    return pytest.importorskip("opacus", reason="opacus is not installed (the dp extra brings it)")


def test_dyt_computes_gamma_tanh_alpha_x_plus_beta_along_its_channels() -> None:
    g = torch.Generator().manual_seed(0)
    for dim, shape in ((-1, (2, 5, 6)), (1, (2, 6, 3, 3))):
        layer = DyT(6, dim, alpha=0.7)
        with torch.no_grad():
            layer.weight.normal_(generator=g)
            layer.bias.normal_(generator=g)
        x = torch.randn(shape, generator=g)
        view = [1] * x.dim()
        view[dim] = 6
        expected = layer.weight.view(view) * torch.tanh(0.7 * x) + layer.bias.view(view)
        torch.testing.assert_close(layer(x), expected)
    fresh = DyT(4)
    assert fresh.alpha.item() == DYT_ALPHA == fixup.METHODS["dyt"].dyt_alpha == 0.5
    assert fresh.weight.eq(1).all() and fresh.bias.eq(0).all() and fresh.alpha.shape == (1,)
    with pytest.raises(ValueError, match="alpha must be a positive finite number, got 0"):
        DyT(4, alpha=0)


def test_the_method_row_replaces_layernorm_in_the_transformer_family() -> None:
    m = fixup.METHODS["dyt"]
    assert (m.norm, m.name, m.family, m.adapt, m.warmup, m.clip) == ("dyt", "dyt", "transformer", "dyt", True, "")
    assert fixup.resolve_method("dyt") is m and fixup.resolve_method(None, "dyt") is m
    with pytest.raises(ValueError, match="dyt is not available for the CIFAR ResNet: it applies to the encoder"):
        fixup.create_model("resnet20", method="dyt")


@pytest.mark.parametrize("pre_norm", [False, True])
def test_the_transformer_has_a_dyt_where_each_layernorm_was(pre_norm: bool) -> None:
    ln = fixup.create_model("transformer_tiny", method="layernorm", pre_norm=pre_norm,
                            generator=torch.Generator().manual_seed(0))
    model = fixup.create_model("transformer_tiny", init="dyt", pre_norm=pre_norm,
                               generator=torch.Generator().manual_seed(0))
    ln_paths = [n for n, m in ln.named_modules() if isinstance(m, nn.LayerNorm)]
    dyt_paths = [n for n, m in model.named_modules() if isinstance(m, DyT)]
    assert dyt_paths == ln_paths and len(dyt_paths) == (12 if pre_norm else 10)  # pre-norm: each stack's final one
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert all(m.alpha.item() == 0.5 and m.weight.eq(1).all() and m.bias.eq(0).all() and m.dim == -1
               for m in model.modules() if isinstance(m, DyT))
    # Everything else as the LayerNorm baseline draws it (the same generator: the same weights).
    ln_state = {k: v for k, v in ln.state_dict().items() if k.rsplit(".", 1)[0] not in ln_paths}
    state = model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in ln_state.items())
    assert model.init_report.method == "dyt" and "a DyT (alpha 0.5, gamma 1, beta 0)" in str(model.init_report)
    with torch.no_grad():  # re-initialisation puts every DyT back at its start
        for m in model.modules():
            if isinstance(m, DyT):
                m.alpha.fill_(3.0)
    fixup.init.initialise_(model)
    assert all(m.alpha.item() == 0.5 for m in model.modules() if isinstance(m, DyT))


def test_post_norm_dyt_warns_with_the_measurement_and_pre_norm_does_not() -> None:
    with pytest.warns(fixup.FixupWarning, match=r"post-norm DyT .* test BLEU 0.1 / 0.0 .* pre_norm=True") as seen:
        model = fixup.create_model("transformer_tiny", method="dyt")
    assert len(seen) == 1 and model.init_report.warnings == [str(seen[0].message)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", fixup.FixupWarning)
        assert not fixup.create_model("transformer_tiny", method="dyt", pre_norm=True).init_report.warnings


def _copy_task(model: nn.Module, steps: int) -> list[float]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 40, (16, 6), generator=g)
    tgt_in = torch.cat([torch.ones(16, 1, dtype=torch.long), src[:, :-1]], 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, 40), src.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("pre_norm", [False, True])
def test_a_few_steps_train_the_dyt_transformer(pre_norm: bool, one_thread) -> None:
    torch.manual_seed(0)
    model = fixup.create_model("transformer_tiny", method="dyt", d_model=32, ffn_dim=64, heads=4, src_vocab=40,
                               tgt_vocab=40, dropout=0.0, pre_norm=pre_norm)
    losses = _copy_task(model, 30)
    assert losses[-1] < 0.7 * losses[0], losses
    assert any(m.alpha.item() != 0.5 for m in model.modules() if isinstance(m, DyT))  # alpha learns


def test_the_per_example_formula_of_dyt_is_exact(opacus) -> None:
    from fixup.private import _dyt_grad_sample

    g = torch.Generator().manual_seed(0)
    for dim, shape in ((-1, (3, 4, 5)), (1, (3, 5, 2, 2))):
        layer = DyT(5, dim, alpha=0.8).double()
        with torch.no_grad():
            layer.weight.normal_(generator=g)
            layer.bias.normal_(generator=g)
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        grad_out = torch.randn(shape, generator=g, dtype=torch.float64)
        per_example = _dyt_grad_sample(layer, [x], grad_out)
        for i in range(shape[0]):
            layer.zero_grad()
            (layer(x[i:i + 1]) * grad_out[i:i + 1]).sum().backward()
            for p in (layer.alpha, layer.weight, layer.bias):
                torch.testing.assert_close(per_example[p][i], p.grad)


def test_the_pre_norm_dyt_transformer_gives_exact_per_example_gradients(opacus, one_thread) -> None:
    from test_private import _token_batch, _transformer, check_per_example_gradients

    for mode in ("hooks", "functorch"):
        torch.manual_seed(0)
        inputs, target = _token_batch()
        check_per_example_gradients(_transformer(method="dyt", pre_norm=True), inputs, target, mode)


# --- adapt ---

class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class _Tokens(nn.Module):
    """A hand-written pre-norm model: two blocks, a final LayerNorm without bias, a LayerNorm shared by two paths."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.Sequential(_Block(16), _Block(16))
        self.final = nn.LayerNorm(16, bias=False)
        self.also = self.blocks[0].norm
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.final(self.blocks(self.embed(x))).mean(1))


def test_adapt_puts_a_dyt_in_each_layernorm_s_place_keeping_its_affine_and_everything_else() -> None:
    model = _Tokens()
    with torch.no_grad():
        model.blocks[0].norm.weight.uniform_(0.5, 2.0)
        model.blocks[1].norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(4, 5, 8)
    adapted, report = fixup.adapt(model, x, method="dyt")
    assert isinstance(report, fixup.DyTAdaptReport) and type(adapted) is _Tokens
    assert [(r.name, r.type, r.channels, r.dim, r.gamma, r.beta) for r in report.replaced] == [
        ("blocks.0.norm", "LayerNorm", 16, -1, "copied", "copied"),
        ("blocks.1.norm", "LayerNorm", 16, -1, "copied", "copied"),
        ("final", "LayerNorm", 16, -1, "copied", "zeros")]
    assert not any(isinstance(m, nn.LayerNorm) for m in adapted.modules())
    assert adapted.also is adapted.blocks[0].norm and isinstance(adapted.also, DyT)  # shared stays shared
    for name in ("blocks.0.norm", "blocks.1.norm", "final"):
        old, new = model.get_submodule(name), adapted.get_submodule(name)
        assert new.alpha.item() == 0.5 and torch.equal(new.weight, old.weight)
        assert torch.equal(new.bias, old.bias if old.bias is not None else torch.zeros(16))
    old_state, new_state = model.state_dict(), adapted.state_dict()
    assert set(new_state) == set(old_state) | {"blocks.0.norm.alpha", "blocks.1.norm.alpha", "final.alpha",
                                                "also.alpha", "final.bias"}
    assert all(torch.equal(v, new_state[k]) for k, v in old_state.items())  # every other tensor as it was
    assert isinstance(model.blocks[0].norm, nn.LayerNorm)  # the model itself is not modified
    assert "3 norm(s) replaced by DyT" in str(report) and "final: LayerNorm(16) -> DyT" in str(report)
    assert report.private.startswith("ready for private training")


def test_adapt_dyt_starts_alpha_where_asked_or_fitted_to_each_layernorm() -> None:
    model, x = _Tokens(), torch.randn(64, 5, 8)
    with torch.no_grad():  # the first norm's inputs small, as GPT-2's at its 0.02 draws
        model.embed.weight.normal_(0.0, 0.01)
        model.embed.bias.zero_()
    with pytest.warns(fixup.FixupWarning, match=r"1 of 3 norms see inputs so small .*\(smallest: blocks.0.norm"):
        fixup.adapt(model, x, method="dyt")  # at 0.5: tanh(alpha x) passes about 1% of a LayerNorm's scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", fixup.FixupWarning)  # neither 16 nor a fitted alpha warns
        adapted, report = fixup.adapt(model, x, method="dyt", alpha0=16)
        fitted, fitted_report = fixup.adapt(model, x, method="dyt", alpha0="fitted")
    assert report.alpha == 16.0 and {r.alpha for r in report.replaced} == {16.0}
    assert all(m.alpha.item() == 16.0 for m in adapted.modules() if isinstance(m, DyT))
    report = fitted_report
    assert report.alpha == "fitted" and "alpha fitted per norm" in str(report)
    first = report.replaced[0]
    assert (f"blocks.0.norm: LayerNorm(16) -> DyT over dim -1, gamma copied, beta copied, alpha {first.alpha:.3g}, "
            f"its input's RMS {first.input_rms:.3g}") in str(report)
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            inputs.setdefault(name, args[0].detach())
        return hook

    hooks = [model.get_submodule(r.name).register_forward_hook(keep(r.name)) for r in report.replaced]
    model.eval()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for r in report.replaced:
        norm, dyt, xin = model.get_submodule(r.name), fitted.get_submodule(r.name), inputs[r.name]
        assert dyt.alpha.item() == pytest.approx(r.alpha) and r.input_rms == pytest.approx(xin.pow(2).mean().sqrt())
        target = norm(xin)

        def err(alpha: float, dyt=dyt, xin=xin, target=target) -> float:
            with torch.no_grad():
                dyt.alpha.fill_(alpha)
                return float((dyt(xin) - target).pow(2).mean())

        best = err(r.alpha)
        assert best <= min(err(r.alpha * 0.9), err(r.alpha * 1.1), err(DYT_ALPHA))  # a minimum, below 0.5's
        assert best < err(DYT_ALPHA)
    assert first.name == "blocks.0.norm" and first.input_rms < 0.05 and first.alpha > 10  # alpha x at LN's scale


def test_adapt_dyt_refuses_an_alpha0_it_cannot_use() -> None:
    for bad in (0, -1.0, float("inf"), "fit", True):
        with pytest.raises(ValueError, match="alpha0 must be a positive finite number"):
            fixup.adapt(_Tokens(), torch.randn(2, 5, 8), method="dyt", alpha0=bad)
    with pytest.raises(ValueError, match="method='fixup' puts none"):
        fixup.adapt(_Tokens(), torch.randn(2, 5, 8), alpha0=2.0)
    with pytest.raises(ValueError, match="its one option is alpha0="):
        fixup.adapt(_Tokens(), torch.randn(2, 5, 8), method="dyt", alpha0=2.0, mode="fan_in")
    with pytest.raises(ValueError, match="has no option 'alpha'"):
        fixup.adapt(_Tokens(), torch.randn(2, 5, 8), method="dyt", alpha0=2.0, alpha=1.0)
    zeros = _Tokens()
    with torch.no_grad():
        zeros.embed.weight.zero_()
        zeros.embed.bias.zero_()
    with pytest.raises(fixup.AdaptError, match="has RMS 0, which fits no alpha"):
        fixup.adapt(zeros, torch.randn(2, 5, 8), method="dyt", alpha0="fitted")


def test_the_lab_measures_the_stream_of_a_dyt_adapted_model_at_the_same_blocks() -> None:
    from fixup.lab.signal import compare_signal

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        signal = compare_signal(_Tokens(), torch.randn(4, 5, 8), method="dyt")
    assert set(signal) == {"normalised", "adapted"}
    assert [s.name for s in signal["adapted"].stages] == [s.name for s in signal["normalised"].stages]


def test_adapt_dyt_takes_no_initialiser_option_and_no_trunk() -> None:
    for kw, words in (({"mode": "fan_in"}, "mode= sets"), ({"trunk": "none"}, "trunk='none'"),
                      ({"gate_biases": True}, "gate_biases=True")):
        with pytest.raises(ValueError, match=words) as err:
            fixup.adapt(_Tokens(), torch.randn(2, 5, 8), method="dyt", **kw)
        assert "method='dyt' puts a DyT in place of each LayerNorm" in str(err.value)


def test_adapt_dyt_refuses_a_model_without_layernorm() -> None:
    with pytest.raises(fixup.AdaptError, match="has none; DyT is a Transformer's norm"):
        fixup.adapt(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(2, 4), method="dyt")


def test_adapt_dyt_refuses_batchnorm_with_the_measurement() -> None:
    from fixup._adapt._dyt import BATCHNORM_MEASURED

    with pytest.raises(fixup.AdaptError) as err:
        fixup.adapt(fixup.create_model("resnet20", method="batchnorm"), torch.randn(2, 3, 32, 32), method="dyt")
    text = str(err.value)
    assert "DyT does not replace BatchNorm" in text and BATCHNORM_MEASURED in text and "method='fixup'" in text
    assert "%" in BATCHNORM_MEASURED  # the numbers themselves, not a placeholder


def test_adapt_dyt_keeps_batchnorm_beside_layernorm_with_a_warning() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(2), _Transposed(), _Block(8))
    with pytest.warns(fixup.FixupWarning, match="BatchNorm kept .*DyT does not replace BatchNorm"):
        adapted, report = fixup.adapt(model, torch.randn(2, 3, 6, 6), method="dyt")
    assert [r.name for r in report.replaced] == ["4.norm"] and report.kept == ["1 (BatchNorm2d)"]
    assert isinstance(adapted[1], nn.BatchNorm2d) and report.private.startswith("not ready")


def test_adapt_dyt_runs_pytorch_s_transformer_modules_by_their_documented_slow_path() -> None:
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(16, 3)).eval()
    x = torch.randn(2, 5, 16)
    with pytest.warns(fixup.FixupWarning, match="non-fast-path"):
        adapted, report = fixup.adapt(model, x, method="dyt")
    assert [r.name for r in report.replaced] == [f"0.layers.{i}.norm{j}" for i in (0, 1) for j in (1, 2)]
    with torch.no_grad():  # eval and no grad: where the fused path would read the norms
        assert torch.isfinite(adapted(x)).all()


class _Transposed(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


# The zoo's LayerNorm models: Hugging Face BERT, GPT-2 and ViT configs, timm's ViT and its ConvNeXt (channels-first
# LayerNorm2d in its stem and downsampling layers, read from its output); skipped where the package is missing.
_LAYERNORM = ["bert (BertForSequenceClassification)", "gpt2 (GPT2LMHeadModel)", "vit (ViTForImageClassification)",
              "vit_tiny_patch16_224 (timm VisionTransformer, fused qkv)", "convnext_atto (timm ConvNeXt, conv_mlp)"]


@pytest.mark.parametrize("name", _LAYERNORM)
def test_adapt_dyt_replaces_every_layernorm_of_real_models(name: str, one_thread) -> None:
    entry = ZOO[name]
    _needs(entry.needs)
    torch.manual_seed(0)
    model, x = entry.build(), entry.example()
    norms = {n: m for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        adapted, report = fixup.adapt(model, x, method="dyt")
    assert {r.name for r in report.replaced} == set(norms) and norms
    assert not any(isinstance(m, nn.LayerNorm) for m in adapted.modules())
    for r in report.replaced:
        new = adapted.get_submodule(r.name)
        assert isinstance(new, DyT) and torch.equal(new.weight, norms[r.name].weight)
        assert new.dim == (1 if type(norms[r.name]).__name__ == "LayerNorm2d" else -1)
    kept = {k: v for k, v in model.state_dict().items() if not k.endswith(".alpha")}
    state = adapted.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in kept.items())
    out = adapted(*as_inputs(x))
    logits = out if isinstance(out, torch.Tensor) else out[0]
    assert torch.isfinite(logits).all()
