"""T-Fixup (Huang et al. 2020, section 3.3): no LayerNorm, the value, output and MLP weights and the embeddings have
the stds of the paper's factors times Xavier, each stack by its own depth, and Adam without warm-up stays finite on
the generated translation task."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fixup
from fixup.init.t_fixup import decoder_factor, encoder_factor
from fixup.nn import Bias, Scale
from fixup.report import TFixupReport
from fixup.train.task import Shard
from fixup.translation.task import TranslationTask, translation_config

SHAPE = {"d_model": 64, "ffn_dim": 128, "heads": 4, "encoder_layers": 3, "decoder_layers": 2, "src_vocab": 300,
         "tgt_vocab": 300}


def _xavier(layer: nn.Linear) -> float:
    return math.sqrt(2.0 / (layer.in_features + layer.out_features))


def _close(sample: torch.Tensor, std: float) -> None:
    """The sample std of n draws lies within 5 standard errors (std / sqrt(2n)) of ``std``."""
    n = sample.numel()
    assert float(sample.std()) == pytest.approx(std, abs=5 * std / math.sqrt(2 * n))


def test_no_layernorm_and_no_scalar_is_present() -> None:
    model = fixup.create_model("transformer_tiny", method="t_fixup", **SHAPE)
    assert not [m for m in model.modules() if isinstance(m, (nn.LayerNorm, Bias, Scale))]
    assert isinstance(model.init_report, TFixupReport) and model.init_report.method == "t_fixup"
    assert not model.init_report.normalization and not model.init_report.warnings
    assert str(model.init_report).startswith("Accounting report: method t_fixup")
    assert TFixupReport.from_dict(model.init_report.to_dict()) == model.init_report


def test_scaled_weights_have_the_paper_s_factor_times_xavier() -> None:
    model = fixup.create_model("transformer_tiny", method="t_fixup", generator=torch.Generator().manual_seed(0),
                               **SHAPE)
    enc, dec = encoder_factor(3), decoder_factor(2)
    assert enc == pytest.approx(0.67 * 3 ** -0.25) and dec == pytest.approx(18 ** -0.25)
    report = model.init_report
    assert (report.encoder_layers, report.decoder_layers) == (3, 2)
    scaled = {r.name for r in report.scaled}
    for stack, factor, blocks in (("encoder", enc, ("self_attn", "ffn")), ("decoder", dec,
                                                                           ("self_attn", "cross_attn", "ffn"))):
        for i, layer in enumerate(getattr(model, stack)):
            for block in blocks:
                part = getattr(layer, block)
                for name in (("fc1", "fc2") if block == "ffn" else ("v", "out")):
                    linear = getattr(part, name)
                    _close(linear.weight.detach(), factor * _xavier(linear))
                    assert f"{stack}.{i}.{block}.{name}" in scaled and not linear.bias.detach().any()
                if block != "ffn":  # queries and keys: Xavier, unscaled
                    _close(part.q.weight.detach(), _xavier(part.q))
                    _close(part.k.weight.detach(), _xavier(part.k))
    assert len(scaled) == 3 * 4 + 2 * 6
    d = SHAPE["d_model"]
    for embed, n in ((model.src_embed, 3), (model.tgt_embed, 2)):  # N(0, d^-1/2) times (9N)^(-1/4), padding row 0
        assert not embed.weight[0].detach().any()
        _close(embed.weight.detach()[1:], d ** -0.5 * decoder_factor(n))
    _close(model.output.weight.detach(), d ** -0.5)


def test_other_families_refuse_it_and_it_refuses_a_model_without_stacks() -> None:
    with pytest.raises(ValueError, match=r"t_fixup is not available for the CIFAR ResNet: it applies to the encoder"):
        fixup.create_model("resnet20", method="t_fixup")
    with pytest.raises(ValueError, match=r"t_fixup is not available for the Wide-ResNet"):
        fixup.create_model("wide_resnet", depth=10, method="t_fixup")
    with pytest.raises(ValueError, match=r"t_fixup is not available for CifarResNet: it applies to the encoder"):
        fixup.init.initialise_(fixup.create_model("resnet20"), "t_fixup")  # a model without stacks()
    assert not fixup.METHODS["t_fixup"].warmup and fixup.METHODS["t_fixup"].family == "transformer"


def test_a_few_adam_steps_without_warmup_stay_finite_on_the_generated_task(tmp_path) -> None:
    extra = {"work_dir": str(tmp_path / "work"), "synthetic_train": 200, "synthetic_eval": 40, "max_tokens": 512,
             "vocab_size": 200, "bleu_limit": 10,
             "model": {"d_model": 32, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2}}
    cfg = translation_config(model="transformer_tiny", device="cpu", norm="none", init="t_fixup", warmup_steps=0,
                             schedule="constant", lr=1e-3, extra=extra)
    task = TranslationTask(cfg)
    torch.manual_seed(0)
    model = task.build_model(cfg)
    assert model.method.name == "t_fixup" and not [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))  # the full rate from the first step
    batches = list(task.train_batches(0, Shard()))
    losses = []
    for batch in batches[:6]:
        opt.zero_grad()
        loss, _ = task.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert all(torch.isfinite(p).all() for p in model.parameters())
