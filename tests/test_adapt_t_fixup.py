"""``fixup.adapt(model, x, method="t_fixup")``: T-Fixup (Huang et al. 2020, section 3.3) on Transformers written
elsewhere (Hugging Face BERT, GPT-2 and ViT configs, ``nn.TransformerEncoder``, ``nn.Transformer``): no LayerNorm
left, each scaled layer's std the Xavier std times the paper's factor for its stack, queries and keys unscaled, the
embeddings N(0, d^-1/2) (9N)^(-1/4), a step that lowers the loss, the method's recipe, and the refusals."""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from _torchvision_shim import install as _install_torchvision_shim
from fixup.cli import main
from fixup.method import model_method

_install_torchvision_shim()  # before transformers imports torchvision where it is installed (the shim's docstring)

D, FFN, N, HEADS = 64, 128, 3, 4  # wide enough for the stds to be measured: a 64x64 slice holds 4,096 draws
ENCODER = 0.67 * N ** -0.25  # the paper's encoder factor, section 3.3
DECODER = (9 * N) ** -0.25  # the paper's decoder factor, and every stack's embedding factor


def _transformers() -> object:
    return pytest.importorskip("transformers", reason="transformers is not installed (the dev extra brings it)")


def _bert() -> nn.Module:
    t = _transformers()
    return t.BertForSequenceClassification(t.BertConfig(  # type: ignore[attr-defined]
        vocab_size=100, hidden_size=D, num_hidden_layers=N, num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=16, num_labels=3))


def _gpt2() -> nn.Module:
    t = _transformers()
    return t.GPT2LMHeadModel(t.GPT2Config(n_layer=N, n_embd=D, n_head=HEADS, vocab_size=100,  # type: ignore
                                          n_positions=16, bos_token_id=1, eos_token_id=1))


def _vit() -> nn.Module:
    t = _transformers()
    return t.ViTForImageClassification(t.ViTConfig(  # type: ignore[attr-defined]
        image_size=32, patch_size=8, hidden_size=D, num_hidden_layers=N, num_attention_heads=HEADS,
        intermediate_size=FFN, num_labels=10))


def _encoder() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # enable_nested_tensor with batch_first: not used here
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, batch_first=True), N)


def _ids() -> torch.Tensor:
    return torch.randint(1, 100, (4, 12), generator=torch.Generator().manual_seed(1))


def _image() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _seq() -> torch.Tensor:
    return torch.randn(4, 12, D, generator=torch.Generator().manual_seed(1))


# name -> (build, example input, loss of the model's output on the example)
def _ce(out: object) -> torch.Tensor:
    logits = out.logits  # type: ignore[attr-defined]
    return F.cross_entropy(logits, torch.arange(logits.shape[0]) % logits.shape[-1])


def _lm(out: object) -> torch.Tensor:
    logits = out.logits[:, :-1]  # type: ignore[attr-defined]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), _ids()[:, 1:].reshape(-1))


def _mse(out: object) -> torch.Tensor:
    return F.mse_loss(out, torch.ones_like(out))  # type: ignore[arg-type]


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], Callable[[object], torch.Tensor]]] = {
    "bert": (_bert, _ids, _ce), "gpt2": (_gpt2, _ids, _lm), "vit": (_vit, _image, _ce),
    "encoder": (_encoder, _seq, _mse),
}


def _adapt(name: str, **kwargs: object) -> tuple[nn.Module, nn.Module, fixup.TFixupAdaptReport]:
    build, example, _ = MODELS[name]
    torch.manual_seed(0)
    model = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)  # PyTorch's Transformer modules run their slow path
        adapted, report = fixup.adapt(model, example(), method="t_fixup", generator=torch.Generator().manual_seed(0),
                                      **kwargs)
    assert isinstance(report, fixup.TFixupAdaptReport)
    return model, adapted, report


def _tensor(model: nn.Module, name: str) -> torch.Tensor:
    """The tensor a report line names: ``path.param[a:b]``, ``path.param.T[a:b]`` (a Conv1D's transposed rows), a
    module's weight, or a parameter."""
    sliced = re.fullmatch(r"(.*?)\.(\w+)(\.T)?\[(\d+):(\d+)\]", name)
    if sliced:
        path, param, transposed, a, b = sliced.groups()
        weight = getattr(model.get_submodule(path), param)
        return (weight.t() if transposed else weight)[int(a):int(b)]
    try:
        return model.get_submodule(name).weight
    except AttributeError:
        return model.get_parameter(name)


def _close(sample: torch.Tensor, std: float) -> None:
    """The sample std of n draws lies within 5 standard errors (std / sqrt(2n)) of ``std``."""
    n = sample.numel()
    assert float(sample.detach().std()) == pytest.approx(std, abs=5 * std / math.sqrt(2 * n))


def _xavier(shape: list[int]) -> float:
    """Glorot & Bengio's std from a weight's shape (its receptive field counted on both fans)."""
    field = math.prod(shape[2:]) if len(shape) > 2 else 1
    return math.sqrt(2.0 / ((shape[0] + shape[1]) * field))


@pytest.mark.parametrize("name", list(MODELS))
def test_no_layernorm_remains_the_model_keeps_its_class_and_keys_and_runs_finite(name: str, one_thread) -> None:
    model, adapted, report = _adapt(name)
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert norms and not any(isinstance(m, nn.LayerNorm) for m in adapted.modules())
    assert sorted(n.name for n in report.norms_removed) == sorted(norms)  # the final ones too (ln_f, BERT's own)
    assert isinstance(adapted, type(model))
    kept = {k for k in model.state_dict() if k.rpartition(".")[0] not in norms}
    assert set(adapted.state_dict()) == kept
    _, example, _ = MODELS[name]
    with torch.no_grad():
        out = adapted(example())
    logits = out if isinstance(out, torch.Tensor) else out.logits
    assert torch.isfinite(logits).all() and logits.abs().max() > 0
    assert model_method(adapted) is fixup.METHODS["t_fixup"] and not adapted.adapted_method.warmup
    assert str(report).startswith("Adapt report: method t_fixup") and f"N = {N} layers" in str(report)
    assert report.to_dict()["num_branches"] == 2 * N and not report.untouched


@pytest.mark.parametrize("name", list(MODELS))
def test_each_scaled_layer_has_the_xavier_std_times_the_encoder_factor(name: str, one_thread) -> None:
    """Encoder-only and decoder-only stacks (two sub-blocks per layer) take the encoder's 0.67 N^(-1/4)."""
    _, adapted, report = _adapt(name)
    (stack,) = report.stacks
    assert (stack.layers, stack.sublayers, stack.rule) == (N, 2, "encoder")
    assert stack.factor == pytest.approx(ENCODER) and stack.embedding_factor == pytest.approx(DECODER)
    assert len(stack.scaled) == 4 * N  # value, output projection, both feed-forward weights per layer
    for rec in stack.scaled:
        expected = _xavier(rec.shape) * ENCODER
        assert rec.std == pytest.approx(expected)
        _close(_tensor(adapted, rec.name), expected)
    assert len(report.xavier) >= 2 * N  # queries and keys at least
    for rec in report.xavier:
        assert rec.std == pytest.approx(_xavier(rec.shape))
        _close(_tensor(adapted, rec.name), _xavier(rec.shape))


def test_bert_scales_its_value_and_output_projections_and_not_its_queries_and_keys(one_thread) -> None:
    _, adapted, report = _adapt("bert")
    scaled = {r.name for r in report.stacks[0].scaled}
    unscaled = {r.name for r in report.xavier}
    for i in range(N):
        layer = f"bert.encoder.layer.{i}"
        assert {f"{layer}.attention.self.value", f"{layer}.attention.output.dense", f"{layer}.intermediate.dense",
                f"{layer}.output.dense"} <= scaled
        assert {f"{layer}.attention.self.query", f"{layer}.attention.self.key"} <= unscaled
        attn = adapted.bert.encoder.layer[i].attention.self
        _close(attn.value.weight, D ** -0.5 * ENCODER)  # Xavier of a DxD matrix is D^-1/2
        _close(attn.query.weight, D ** -0.5)
        _close(attn.key.weight, D ** -0.5)


def test_vit_s_value_projection_is_found_among_its_three_separate_projections(one_thread) -> None:
    """Read from the recording (the projection whose output the softmax does not reach), never from its name."""
    _, _, report = _adapt("vit")
    names = [r.name for r in report.stacks[0].scaled]
    values = [n for n in names if n.rpartition(".")[2] in ("value", "v_proj")]  # transformers 4.x / 5.x
    assert len(values) == N and not [n for n in names if n.rpartition(".")[2] in ("query", "key", "q_proj", "k_proj")]


def test_a_pre_norm_encoder_is_adapted_alike(one_thread) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, batch_first=True, norm_first=True)
        model = nn.TransformerEncoder(layer, N, norm=nn.LayerNorm(D), enable_nested_tensor=False)
        adapted, report = fixup.adapt(model, _seq(), method="t_fixup")
    (stack,) = report.stacks
    assert (stack.layers, stack.sublayers, stack.factor) == (N, 2, pytest.approx(ENCODER))
    assert len(report.norms_removed) == 2 * N + 1 and not any(isinstance(m, nn.LayerNorm) for m in adapted.modules())
    with torch.no_grad():
        assert torch.isfinite(adapted(_seq())).all()


@pytest.mark.parametrize("name", ["gpt2", "encoder"])
def test_only_the_value_slice_of_a_fused_qkv_weight_is_scaled(name: str, one_thread) -> None:
    """GPT-2's ``c_attn`` (a Conv1D, stored in x out) and ``nn.MultiheadAttention.in_proj_weight``: rows Q, K, V,
    each drawn Xavier as a DxD layer, only V times the factor."""
    _, adapted, _ = _adapt(name)
    for i in range(N):
        if name == "gpt2":
            attn = adapted.transformer.h[i].attn
            rows = attn.c_attn.weight.t()
            assert torch.count_nonzero(attn.c_attn.bias) == 0
        else:
            rows = adapted.layers[i].self_attn.in_proj_weight
        q, k, v = rows[:D], rows[D:2 * D], rows[2 * D:]
        _close(q, D ** -0.5)
        _close(k, D ** -0.5)
        _close(v, D ** -0.5 * ENCODER)


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
def test_the_input_embeddings_are_normal_d_to_the_minus_half_times_the_embedding_factor(name: str,
                                                                                        one_thread) -> None:
    _, adapted, report = _adapt(name)
    (stack,) = report.stacks
    tables = [r for r in stack.embeddings if r.type != "Conv2d"]
    assert tables
    for rec in tables:  # token, position and token-type tables; ViT's class token and position tensor
        assert rec.std == pytest.approx(D ** -0.5 * DECODER)
        _close(_tensor(adapted, rec.name), D ** -0.5 * DECODER)
    if name == "gpt2":  # the LM head is tied to the token table and keeps the tie, with the table's draw
        assert adapted.lm_head.weight is adapted.transformer.wte.weight and report.tied
        assert {r.name for r in tables} == {"transformer.wte.weight", "transformer.wpe.weight"}
    if name == "bert":
        assert len(tables) == 3  # word, position and token-type tables
    if name == "vit":  # the patch projection is the stack's input layer: Xavier times the embedding factor
        (proj,) = [r for r in stack.embeddings if r.type == "Conv2d"]
        _close(_tensor(adapted, proj.name), _xavier(proj.shape) * DECODER)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_few_steps_under_param_groups_lower_the_loss_on_a_fixed_batch(name: str, one_thread) -> None:
    _, adapted, _ = _adapt(name)
    _, example, loss_of = MODELS[name]
    groups = fixup.param_groups(adapted, lr=1e-3)
    assert [g["name"] for g in groups] == ["weights"]  # no scalars, no gates: T-Fixup trains every weight alike
    opt = torch.optim.Adam(groups, lr=1e-3)  # at the full rate from the first step: no warm-up
    adapted.eval()  # no dropout draws: the same function at each step
    x = example()
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = loss_of(adapted(x))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses


# --- the encoder-decoder: nn.Transformer against the library's own T-Fixup Transformer ---

class _Seq2Seq(nn.Module):
    """nn.Transformer between two embedding tables and an output projection: the library's Transformer's shape."""

    def __init__(self, vocab: int, d: int, ffn: int, heads: int, enc: int, dec: int) -> None:
        super().__init__()
        self.src, self.tgt = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.core = nn.Transformer(d, heads, enc, dec, ffn, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.out(self.core(self.src(src), self.tgt(tgt)))


def test_nn_transformer_agrees_with_the_library_s_t_fixup_transformer_on_every_shared_factor(one_thread) -> None:
    shape = {"d_model": D, "ffn_dim": FFN, "heads": HEADS, "encoder_layers": 3, "decoder_layers": 2,
             "src_vocab": 300, "tgt_vocab": 300}
    ours = fixup.create_model("transformer_tiny", method="t_fixup", **shape).init_report
    src = torch.randint(1, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapted, report = fixup.adapt(_Seq2Seq(300, D, FFN, HEADS, 3, 2), (src, src[:, :5]), method="t_fixup")
    enc, dec = report.stacks
    assert (enc.layers, enc.sublayers, enc.rule, dec.layers, dec.sublayers, dec.rule) == (3, 2, "encoder", 2, 3,
                                                                                          "decoder")
    assert enc.factor == pytest.approx(ours.encoder_factor) and dec.factor == pytest.approx(ours.decoder_factor)
    assert len(enc.scaled) == 4 * 3 and len(dec.scaled) == 6 * 2  # the decoder's cross-attention too
    # Each scaled layer's std, stack by stack (value, output, fc1, fc2 of the same shapes): the same numbers.
    lib = {name: sorted(round(r.std, 6) for r in ours.scaled if r.name.startswith(name)) for name in ("encoder",
                                                                                                      "decoder")}
    assert sorted(round(r.std, 6) for r in enc.scaled) == lib["encoder"]
    assert sorted(round(r.std, 6) for r in dec.scaled) == lib["decoder"]
    # The embeddings: N(0, d^-1/2) times (9N)^(-1/4), N each stack's own, as the library's.
    assert [(r.name, round(r.std, 6)) for r in [*enc.embeddings, *dec.embeddings]] == [
        ("src.weight", round(sorted(r.std for r in ours.embeddings)[0], 6)),  # the deeper stack: the smaller
        ("tgt.weight", round(sorted(r.std for r in ours.embeddings)[1], 6))]
    with torch.no_grad():
        assert torch.isfinite(adapted(src, src[:, :5])).all()


# --- the method's recipe ---

FACTORY = '''
import torch
from torch import nn


class PatchTransformer(nn.Module):
    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.patch = nn.Conv2d(in_channels, 32, 2, 2)
        self.pos = nn.Parameter(torch.zeros(1, 16, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, num_classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.encoder(tokens)).mean(1))


def build(num_classes=10, in_channels=1):
    return PatchTransformer(num_classes, in_channels)


def build_with_input():
    return PatchTransformer(), torch.randn(2, 1, 8, 8)
'''


@pytest.fixture
def factory(tmp_path: Path) -> Path:
    path = tmp_path / "user_transformer.py"
    path.write_text(FACTORY)
    return path


def test_fixup_train_adapts_by_t_fixup_and_trains_without_warm_up(factory: Path, one_thread) -> None:
    from fixup.train import TrainConfig, fit

    config = TrainConfig(adapt=f"{factory}:build", init="t_fixup", batch_size=64, max_updates=2, epochs=1,
                         checkpoint=False, device="cpu", warmup_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        result = fit(config, out_dir=None, progress=False)
    assert result.outcome.status == "completed"
    recipe = result.recipe if isinstance(result.recipe, dict) else result.recipe.to_dict()
    assert recipe["method"] == "t_fixup" and recipe["warmup_from"] == "method" and recipe["warmup_steps"] == 0


def test_fixup_inspect_prints_the_t_fixup_report(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        assert main(["inspect", "--adapt", f"{factory}:build_with_input", "--method", "t_fixup"]) == 0
    text = capsys.readouterr().out
    assert "adapted to t_fixup: " in text and "(trunk" not in text
    assert "stack encoder.layers: N = 2 layers of 2 sub-blocks" in text and "embedding pos" in text
    assert "embedding patch (Conv2d" in text and "norm: LayerNorm removed" in text
    out = factory.parent / "report.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        assert main(["inspect", "--adapt", f"{factory}:build_with_input", "--method", "t_fixup", "--json",
                     str(out)]) == 0
    saved = json.loads(out.read_text())
    (stack,) = saved["report"]["stacks"]
    assert saved["method"] == "t_fixup" and stack["layers"] == 2 and stack["factor"] == pytest.approx(0.67 * 2 ** -0.25)
    assert saved["report"]["num_branches"] == 4 and len(stack["scaled"]) == 8


# --- refusals: each names the model, what is missing and what to do instead ---

class _ConvBlock(nn.Module):
    def __init__(self, norm: bool) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn(self.conv2(torch.relu(self.conv1(x))))


class _MLPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class _Attention(nn.Module):
    def __init__(self, functional_norm: bool = False) -> None:
        super().__init__()
        self.attn, self.functional = nn.MultiheadAttention(16, 2, batch_first=True), functional_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.attn(x, x, x, need_weights=False)[0]
        return F.layer_norm(y, (16,)) if self.functional else y  # post-norm, on the stream


@pytest.mark.parametrize("model, x, words", [
    (nn.Sequential(nn.Conv2d(3, 8, 3), _ConvBlock(True), _ConvBlock(True)), torch.randn(2, 3, 8, 8),
     ("Sequential has 1.bn (BatchNorm2d)", "defined for Transformers", "Use method='fixup'")),
    (nn.Sequential(nn.Conv2d(3, 8, 3), _ConvBlock(False), _ConvBlock(False)), torch.randn(2, 3, 8, 8),
     ("cannot apply T-Fixup to Sequential", "a convolutional or other branch", "use method='fixup'")),
    (nn.Sequential(nn.Linear(4, 16), _MLPBlock(), _MLPBlock()), torch.randn(2, 4),
     ("found no attention sub-block in Sequential", "use method='fixup'")),
    (nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)), torch.randn(2, 4),
     ("no residual sum", "Sequential", "Use method='fixup'")),
    (nn.Sequential(_Attention(), _Attention(), _MLPBlock()), torch.randn(2, 5, 16),
     ("self -> self -> ffn", "repeat self-attention, [cross-attention,] feed-forward", "use method='fixup'")),
    (nn.Sequential(_Attention(functional_norm=True), _MLPBlock()), torch.randn(2, 5, 16),
     ("cannot remove every LayerNorm of Sequential", "by a function", "nn.LayerNorm")),
], ids=["resnet_batchnorm", "conv_branches", "no_attention", "no_residual", "two_attentions", "functional_norm"])
def test_what_t_fixup_cannot_apply_to_is_refused_naming_the_model_and_the_fix(model: nn.Module, x: torch.Tensor,
                                                                              words: tuple[str, ...]) -> None:
    with pytest.raises(fixup.AdaptError) as err:
        fixup.adapt(model, x, method="t_fixup")
    assert all(w in str(err.value) for w in words), str(err.value)


def test_options_that_set_another_rule_are_refused_before_the_model_runs() -> None:
    with pytest.raises(ValueError, match=r"mode= sets .* method='t_fixup' draws every weight by T-Fixup's own rule"):
        fixup.adapt(_encoder(), _seq(), method="t_fixup", mode="fan_in")
    with pytest.raises(ValueError, match=r"trunk='fan_in' sets the rule .* Leave trunk out"):
        fixup.adapt(_encoder(), _seq(), method="t_fixup", trunk="fan_in")
