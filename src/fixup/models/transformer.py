"""The encoder-decoder Transformer for translation (Vaswani et al. 2017), in Fixup and LayerNorm forms.

Fixup, section 5 (Zhang, Dauphin & Ma, ICLR 2019) replaces every LayerNorm of the fairseq Transformer
with the Fixup parameterisation. Each sublayer is one residual block ``x + F(x)``:

- attention (self- or cross-): ``F(x) = scale * out(bias_out + attend(q(x + b), k(.), v(.)))``, declared
  with ``layers=[q, k, v, out]`` and m = 4: queries, keys and values are three parallel projections
  that multiply with the output projection, so rule 2 scales Q, K and V by L^(-1/6) and rule 1 zeroes
  ``out``;
- feed-forward: ``F(x) = scale * fc2(relu(fc1(x + b1) + b2) + b3)``, m = 2: fc1 scaled by L^(-1/2),
  fc2 zeroed;

with L = 2 per encoder layer + 3 per decoder layer. The output projection (the classifier) starts at
zero. The base initialisation is Xavier, as in the authors' fairseq code (normal draws of the same
variance as its uniform ones). Embeddings keep fairseq's N(0, d^-1/2) (multiplied by sqrt(d) in the
forward pass) and are left alone by ``fixup_init_``, which lists them in its report.

``norm="none"`` builds the gated methods (``skipinit``, ``rezero``): no LayerNorm, every branch times its gate
(0 at the start), Xavier-initialised linear layers with biases, no Fixup scalar; and ``t_fixup`` (Huang et al.
2020): no LayerNorm, no gate or scalar, Xavier linear layers with biases, the value, output and MLP weights and the
embeddings scaled by each stack's depth (:mod:`fixup.init.t_fixup`, through :meth:`Transformer.stacks`).

``norm="layernorm"`` is the paper's baseline: post-norm (fairseq's default) or, with ``pre_norm=True``,
pre-norm with a final LayerNorm on each stack; Xavier-initialised linear layers with biases. ``norm="dyt"`` (Zhu et
al., CVPR 2025) is the same model with a :class:`fixup.nn.DyT` at each of those places instead of the LayerNorm.

The config and the two residual blocks (each with its lean forward and its folding) live in
:mod:`fixup.models.transformer_blocks`; this module assembles the encoder-decoder model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..init import describe_init, initialise_
from ..method import Method, as_method
from ..nn import Bias, DyT, Scale
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import scalar_value
from ..report import warn_report
from ._common import check_method, name_blocks
from ._registry import register_model
from .transformer_blocks import (
    NORMED,
    TRANSFORMER_NORMS,
    AttentionBlock,
    Cache,
    FeedForwardBlock,
    TransformerConfig,
    _maybe,
    causal_mask,
    sinusoidal_positions,
    token_norm,
)

__all__ = ["TRANSFORMER_NORMS", "Transformer", "TransformerConfig", "causal_mask", "sinusoidal_positions"]

# benchmarks/results/dyt_translation.json: transformer_tiny on the tiny translation recipe, seeds 0 and 1.
POST_NORM_DYT = ("post-norm DyT (DyT after each residual sum, where this Transformer's LayerNorm stands by default) "
                 "is not its authors' layout, and did not learn the tiny translation recipe: test BLEU 0.1 / 0.0 "
                 "(seeds 0, 1) where pre-norm DyT reached 94.9 / 94.1 and post-norm LayerNorm 93.4 / 91.2; build it "
                 "with pre_norm=True (docs/methods.md)")

class EncoderLayer(nn.Module):
    """Self-attention then feed-forward: two residual branches."""

    def __init__(self, cfg: TransformerConfig, method: Method) -> None:
        super().__init__()
        self.self_attn, self.ffn = AttentionBlock(cfg, "self-attn", method), FeedForwardBlock(cfg, method)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        return self.ffn(self.self_attn(x, key_mask=src_mask))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder output, feed-forward: three branches."""

    def __init__(self, cfg: TransformerConfig, method: Method) -> None:
        super().__init__()
        self.self_attn = AttentionBlock(cfg, "self-attn", method)
        self.cross_attn = AttentionBlock(cfg, "cross-attn", method)
        self.ffn = FeedForwardBlock(cfg, method)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor,
                cache: dict[str, Cache] | None = None) -> Tensor:
        self_cache = None if cache is None else cache.setdefault("self", {})
        cross_cache = None if cache is None else cache.setdefault("cross", {})
        x = self.self_attn(x, causal=True, cache=self_cache)
        x = self.cross_attn(x, memory, src_mask, cache=cross_cache)
        return self.ffn(x)

    def fold_memory_(self, scale: Tensor | None, shift: Tensor | None) -> None:
        """The memory will arrive without ``scale * (memory + shift)``: the cross-attention takes it in."""
        self.cross_attn.fold_memory_(scale, shift)


class Transformer(nn.Module):
    """Encoder-decoder Transformer. ``forward(src, tgt_in)`` returns logits (B, T, tgt_vocab).

    ``src`` and ``tgt_in`` are (B, S) and (B, T) token ids padded with ``pad_id`` on the right;
    ``tgt_in`` starts with the beginning-of-sentence token (teacher forcing).

    ``method`` (default: ``cfg.norm``'s default method) decides the scalars; its norm must be ``cfg.norm``.
    The constructor ends by initialising the model: fairseq's initialisation, then for Fixup the rule
    with Xavier as its base; ``init_report`` says what was done.
    """

    init_base = "xavier"  # the standard initialisation its layers start from (the authors' fairseq code)

    def __init__(self, cfg: TransformerConfig, method: Method | str | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        method = check_method(cfg.norm if method is None else method, TRANSFORMER_NORMS, "the Transformer",
                              "transformer")
        if method.norm != cfg.norm:
            raise ValueError(f"method {method.name!r} has norm={method.norm!r} but the config has norm={cfg.norm!r}; "
                             "build the config with the method's norm")
        self.method = method
        self.cfg, fixup, d = cfg, method.fixup, cfg.d_model
        self.embed_scale = math.sqrt(d)
        self.src_embed = nn.Embedding(cfg.src_vocab, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab, d,
                                                                                  padding_idx=cfg.pad_id)
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, d), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, method) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, method) for _ in range(cfg.decoder_layers))
        # Fixup: the stream leaving the encoder gets a bias and a multiplier (the bias before every
        # cross-attention key/value projection), the decoder's a bias before the output projection.
        biases, scale = fixup and method.biases, fixup and method.scale
        self.encoder_bias, self.encoder_scale = _maybe(Bias, biases), _maybe(Scale, scale)
        self.decoder_bias = _maybe(Bias, biases)
        self.encoder_norm = token_norm(method, d, cfg.pre_norm)
        self.decoder_norm = token_norm(method, d, cfg.pre_norm)
        self.output = nn.Linear(d, cfg.tgt_vocab, bias=False)
        name_blocks(self)
        stds = self.reset_parameters(generator)  # embeddings (and, for the baseline, everything) from `generator`
        if method.norm not in NORMED:  # the Fixup rule, the gates (from Xavier, init_base) or T-Fixup
            self.init_report = initialise_(self, method, generator=generator)
        else:
            dyt = (f"; a DyT (alpha {method.dyt_alpha:g}, gamma 1, beta 0) where each LayerNorm was"
                   if method.norm == "dyt" else "")
            self.init_report = describe_init(self, method.name, "fairseq: Xavier-uniform linear layers, zero "
                                             f"biases, N(0, d^-1/2) embeddings and output projection{dyt}", stds)
            if method.norm == "dyt" and not cfg.pre_norm:
                self.init_report.warnings.append(POST_NORM_DYT)
                warn_report(self.init_report)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> dict[str, float]:
        """fairseq's initialisation: Xavier-uniform linear layers with zero biases (Q, K and V with the fans of
        the (3d, d) matrix fairseq draws them as), N(0, d^-1/2)
        embeddings and output projection, zero padding embedding, unit LayerNorm gains (DyT: alpha at its alpha0,
        gamma 1, beta 0). Returns the std
        each linear layer was drawn with, by name."""
        d = self.cfg.d_model
        stds = {}
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear):
                bound = math.sqrt(6.0 / (mod.in_features + mod.out_features * getattr(mod, "fan_out_mult", 1)))
                mod.weight.uniform_(-bound, bound, generator=generator)
                stds[name] = bound / math.sqrt(3.0)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.normal_(0.0, d ** -0.5, generator=generator)
                mod.weight[self.cfg.pad_id].zero_()
            elif isinstance(mod, (nn.LayerNorm, DyT, Bias, Scale)):
                mod.reset_parameters()
        self.output.weight.normal_(0.0, d ** -0.5, generator=generator)
        stds["output"] = d ** -0.5
        return stds

    def classifier_layers(self) -> Sequence[nn.Module]:
        return [self.output]

    def stacks(self) -> list[tuple[str, nn.ModuleList, nn.Embedding]]:
        """The encoder and the decoder, each with its layers and its input embedding (T-Fixup scales each stack by
        its own depth, :mod:`fixup.init.t_fixup`)."""
        return [("encoder", self.encoder, self.src_embed), ("decoder", self.decoder, self.tgt_embed)]

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold the model's own scalars: the encoder output's bias and multiplier into every cross-attention's
        keys and values, the decoder output's bias into the output projection (the blocks fold themselves)."""
        if type(self.encoder_norm) is not nn.Identity or type(self.decoder_norm) is not nn.Identity:
            return 0
        shift, scale = scalar_value(self.encoder_bias), scalar_value(self.encoder_scale)
        n = count_scalars(self.encoder_bias, self.encoder_scale, self.decoder_bias)
        if shift is not None or scale is not None:
            for layer in self.decoder:
                layer.fold_memory_(scale, shift)
        self.output = fold_layer(self.output, shift=scalar_value(self.decoder_bias))
        self.encoder_bias, self.encoder_scale, self.decoder_bias = nn.Identity(), nn.Identity(), nn.Identity()
        return n

    def _embed(self, embed: nn.Embedding, tokens: Tensor, start: int = 0) -> Tensor:
        T = tokens.shape[1]
        if start + T > self.cfg.max_positions:
            raise ValueError(f"sequence of {start + T} tokens is longer than max_positions="
                             f"{self.cfg.max_positions}; filter long sentences or raise max_positions")
        x = self.embed_scale * embed(tokens) + self.positions[start:start + T]
        return F.dropout(x, self.cfg.dropout, self.training)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, d) and the source mask (B, S), True at real tokens."""
        src_mask = src.ne(self.cfg.pad_id)
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_scale(self.encoder_bias(self.encoder_norm(x))), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: list[dict[str, Cache]] | None = None, start: int = 0) -> Tensor:
        """Logits (B, T, V) for ``tgt_in`` at positions ``start..start+T-1``. With ``cache`` (one dict per
        decoder layer, empty at the first step) earlier steps are not recomputed."""
        x = self._embed(self.tgt_embed, tgt_in, start)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, src_mask, None if cache is None else cache[i])
        return self.output(self.decoder_bias(self.decoder_norm(x)))

    def new_cache(self) -> list[dict[str, Cache]]:
        """An empty incremental-decoding cache."""
        return [{} for _ in self.decoder]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)


def reorder_cache(cache: list[dict[str, Cache]], order: Tensor) -> None:
    """Select rows ``order`` of every cached tensor in place (beam search keeps its surviving hypotheses)."""
    for layer in cache:
        for part in layer.values():
            for key, value in part.items():
                part[key] = value.index_select(0, order)


def build_transformer(method: Method | str = "fixup", generator: torch.Generator | None = None,
                      **overrides) -> Transformer:
    """A Transformer from :class:`TransformerConfig` fields (``overrides``), built and initialised for ``method``."""
    known = set(TransformerConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown Transformer option(s) {unknown}; valid ones are "
                         f"{sorted(known - {'norm'})}")
    method = as_method(method)
    return Transformer(TransformerConfig(**{**overrides, "norm": method.norm}), method, generator)


@register_model
def transformer_iwslt_de_en(**kwargs) -> Transformer:
    """The paper's IWSLT'14 De-En configuration (fairseq ``transformer_iwslt_de_en``): 6+6 layers,
    d_model 512, FFN 1024, 4 heads."""
    return build_transformer(**{"d_model": 512, "ffn_dim": 1024, "heads": 4, "encoder_layers": 6,
                                "decoder_layers": 6, "src_vocab": 10000, "tgt_vocab": 10000, **kwargs})


@register_model
def transformer_tiny(**kwargs) -> Transformer:
    """A small Transformer for CPUs and tests: 2+2 layers, d_model 128, FFN 256, 4 heads."""
    return build_transformer(**{"d_model": 128, "ffn_dim": 256, "heads": 4, "encoder_layers": 2,
                                "decoder_layers": 2, "dropout": 0.1, "src_vocab": 1000, "tgt_vocab": 1000,
                                **kwargs})
