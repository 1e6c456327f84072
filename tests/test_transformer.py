"""The Fixup Transformer: accounting, exact identity at init, masks, padding, incremental decoding."""

from __future__ import annotations

import math

import pytest
import torch

import fixup
from fixup.models.transformer import AttentionBlock, FeedForwardBlock, Transformer, TransformerConfig

SMALL = {"d_model": 32, "ffn_dim": 64, "heads": 4, "src_vocab": 50, "tgt_vocab": 60, "dropout": 0.0}


def small(norm: str = "fixup", seed: int = 0, **kw) -> Transformer:
    return fixup.create_model("transformer_tiny", norm=norm, generator=torch.Generator().manual_seed(seed),
                              **{**SMALL, **kw})


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter (zeroed ones, scalar biases) random values, so that tests are not vacuous."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def tokens(B: int, T: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def test_accounting_counts_branches_and_factors():
    model = small(encoder_layers=3, decoder_layers=2)
    report = model.init_report
    L = 3 * 2 + 2 * 3
    assert report.num_branches == L
    kinds = [b.kind for b in report.branches]
    assert kinds.count("self-attn") == 5 and kinds.count("cross-attn") == 2 and kinds.count("ffn") == 5
    for b in report.branches:
        if b.kind == "ffn":
            assert b.m == 2 and b.factor == pytest.approx(L ** -0.5)
            assert [s.name.rsplit(".", 1)[-1] for s in b.scaled] == ["fc1"] and b.zeroed.name.endswith("fc2")
        else:
            assert b.m == 4 and b.factor == pytest.approx(L ** (-1 / 6))
            assert [s.name.rsplit(".", 1)[-1] for s in b.scaled] == ["q", "k", "v"]
            assert b.zeroed.name.endswith(".out")
        assert b.has_scale and b.num_biases == (3 if b.kind == "ffn" else 2)
    assert report.base_init == "xavier"
    assert [c.name for c in report.classifier] == ["output"]
    assert set(report.untouched) == {"src_embed (Embedding)", "tgt_embed (Embedding)"}
    assert report.normalization == [] and report.warnings == []
    # Q has the Xavier std of the fused (3d, d) Q/K/V matrix (the authors' fairseq code) times L^-1/6; fc1 Xavier
    # times L^-1/2.
    q = model.encoder[0].self_attn.q.weight
    assert q.std().item() == pytest.approx(math.sqrt(2 / (4 * 32)) * L ** (-1 / 6), rel=0.1)
    fc1 = model.decoder[1].ffn.fc1.weight
    assert fc1.std().item() == pytest.approx(math.sqrt(2 / 96) * L ** -0.5, rel=0.1)


def test_iwslt_configuration():
    model = fixup.create_model("transformer_iwslt_de_en", src_vocab=100, tgt_vocab=100)
    cfg = model.cfg
    shape = (cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, cfg.ffn_dim, cfg.heads)
    assert shape == (6, 6, 512, 1024, 4)
    assert model.init_report.num_branches == 30
    assert {round(b.factor, 6) for b in model.init_report.branches} == {round(30 ** (-1 / 6), 6),
                                                                       round(30 ** -0.5, 6)}


@pytest.mark.parametrize("train", [False, True])
def test_fixup_blocks_are_identity_and_logits_zero_at_init(train):
    model = small(dropout=0.2)
    model.train(train)
    seen = []

    def check(module, inputs, output):
        seen.append(type(module).__name__)
        assert torch.equal(output, inputs[0]), f"{module.block_name} changed its input at init"

    for mod in model.modules():
        if isinstance(mod, (AttentionBlock, FeedForwardBlock)):
            mod.register_forward_hook(check)
    src, tgt = tokens(3, 7, 50), tokens(3, 5, 60, seed=1)
    src[0, 5:] = 0  # padding
    logits = model(src, tgt)
    assert logits.shape == (3, 5, 60)
    assert torch.count_nonzero(logits) == 0
    assert len(seen) == 2 * 2 + 3 * 2


@pytest.mark.parametrize("norm,pre", [("fixup", False), ("layernorm", False), ("layernorm", True)])
def test_causal_mask(norm, pre):
    model = randomize_(small(norm, pre_norm=pre)).eval()
    src, tgt = tokens(2, 6, 50), tokens(2, 8, 60, seed=1)
    base = model(src, tgt)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = tokens(2, tgt.shape[1] - t - 1, 60, seed=2 + t)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])


@pytest.mark.parametrize("norm", ["fixup", "layernorm"])
def test_padding_does_not_change_real_positions(norm):
    model = randomize_(small(norm)).eval()
    long_src, long_tgt = tokens(1, 9, 50), tokens(1, 7, 60, seed=1)
    short_src, short_tgt = tokens(1, 4, 50, seed=2), tokens(1, 3, 60, seed=3)
    src = torch.zeros(2, 9, dtype=torch.long)
    tgt = torch.zeros(2, 7, dtype=torch.long)
    src[0], tgt[0] = long_src[0], long_tgt[0]
    src[1, :4], tgt[1, :3] = short_src[0], short_tgt[0]
    batched = model(src, tgt)
    torch.testing.assert_close(batched[1, :3], model(short_src, short_tgt)[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(batched[0], model(long_src, long_tgt)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm", ["fixup", "layernorm"])
def test_incremental_decoding_matches_full_forward(norm):
    model = randomize_(small(norm)).eval()
    src, tgt = tokens(2, 6, 50), tokens(2, 5, 60, seed=1)
    src[1, 3:] = 0
    full = model(src, tgt)
    memory, mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t:t + 1], memory, mask, cache, start=t) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


def test_norm_options_are_checked():
    with pytest.raises(ValueError, match="fixup, layernorm"):
        small("batchnorm")
    with pytest.raises(ValueError, match="pre_norm"):
        small("fixup", pre_norm=True)
    with pytest.raises(ValueError, match="share_embeddings"):
        small(share_embeddings=True)
    with pytest.raises(ValueError, match="unknown Transformer option"):
        small(widht=3)
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(d_model=30, heads=4)


def test_layernorm_placement_and_shared_embeddings():
    post = small("layernorm", encoder_layers=2, decoder_layers=2)
    pre = small("layernorm", pre_norm=True, encoder_layers=2, decoder_layers=2)
    n_norms = [sum(isinstance(m, torch.nn.LayerNorm) for m in x.modules()) for x in (post, pre)]
    assert n_norms == [2 * 2 + 3 * 2, 2 * 2 + 3 * 2 + 2]  # pre-norm adds a final norm per stack
    assert post.init_report.method == "layernorm" and not post.init_report.is_fixup
    assert post.encoder[0].ffn.fc1.bias is not None
    fix = small()
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in fix.modules())
    assert fix.encoder[0].ffn.fc1.bias is None  # scalar biases replace the vector ones
    shared = small(share_embeddings=True, tgt_vocab=50)
    assert shared.tgt_embed is shared.src_embed
    assert shared.init_report.untouched == ["src_embed (Embedding)"]


def test_embeddings_follow_fairseq_and_padding_row_is_zero():
    model = small(d_model=64)
    w = model.src_embed.weight
    assert torch.count_nonzero(w[0]) == 0
    assert w[1:].std().item() == pytest.approx(64 ** -0.5, rel=0.1)


def test_same_generator_same_model():
    a, b = small(seed=3), small(seed=3)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na
