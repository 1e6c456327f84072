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

``norm="layernorm"`` is the paper's baseline: post-norm (fairseq's default) or, with ``pre_norm=True``,
pre-norm with a final LayerNorm on each stack; Xavier-initialised linear layers with biases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..baselines import describe_init, initialise_
from ..branch import Branch
from ..fold import count_scalars, fold_layer
from ..method import Method, as_method
from ..nn import Bias, Scale, residual_add
from ..ops import lean_linear, lean_residual_, observed, plain_linear, scalar_value
from ._common import check_method, name_blocks
from ._registry import register_model

__all__ = ["TRANSFORMER_NORMS", "Transformer", "TransformerConfig", "causal_mask", "sinusoidal_positions"]

TRANSFORMER_NORMS = ("fixup", "layernorm")

Cache = dict[str, Tensor]


@dataclass
class TransformerConfig:
    """Shape and regularisation of an encoder-decoder Transformer."""

    src_vocab: int = 1000  # source vocabulary size (tokens, including specials)
    tgt_vocab: int = 1000  # target vocabulary size; must equal src_vocab when share_embeddings
    d_model: int = 512  # width of the residual stream
    ffn_dim: int = 1024  # hidden width of the feed-forward branch
    heads: int = 4  # attention heads; d_model must be divisible by it
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.3  # on embeddings and branch outputs; the paper picks from 0.3-0.6 (section 5)
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0  # after the feed-forward ReLU
    norm: str = "fixup"  # "fixup" or "layernorm"
    pre_norm: bool = False  # LayerNorm before each branch (only with norm="layernorm")
    share_embeddings: bool = False  # one embedding table for source and target (joint vocabulary)
    pad_id: int = 0  # padding token id, the same on both sides
    max_positions: int = 1024  # longest sequence the sinusoidal table covers

    def __post_init__(self) -> None:
        if self.norm not in TRANSFORMER_NORMS:
            raise ValueError(f"norm={self.norm!r} is not available for the Transformer; choose one of "
                             f"{', '.join(TRANSFORMER_NORMS)}")
        if self.pre_norm and self.norm != "layernorm":
            raise ValueError(f"pre_norm=True places a LayerNorm before each branch; it needs "
                             f"norm='layernorm', got norm={self.norm!r}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}; pick a "
                             "head count that divides the width")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_embeddings needs one joint vocabulary, got src_vocab={self.src_vocab} "
                             f"and tgt_vocab={self.tgt_vocab}; learn a joint vocabulary or set "
                             "share_embeddings=False")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """The (length, dim) table of Vaswani et al. (2017, section 3.5): sines, then cosines."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half - 1, 1))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return F.pad(table, (0, dim - 2 * half))


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """(length, length) boolean mask, True where position i may attend to j (j <= i)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _maybe(module: type[nn.Module], on: bool, *args) -> nn.Module:
    return module(*args) if on else nn.Identity()


class AttentionBlock(nn.Module):
    """``x + F(x)`` with F multi-head attention of ``x`` over itself (causal or not) or over ``memory``."""

    def __init__(self, cfg: TransformerConfig, kind: str, method: Method) -> None:
        super().__init__()
        fixup, d = method.fixup, cfg.d_model
        self.kind, self.heads, self.block_name = kind, cfg.heads, kind
        self.dropout, self.attention_dropout = cfg.dropout, cfg.attention_dropout
        self.bias_in, self.bias_out = _maybe(Bias, fixup and method.biases), _maybe(Bias, fixup and method.biases)
        self.q, self.k, self.v, self.out = (nn.Linear(d, d, bias=not fixup) for _ in range(4))
        self.scale = _maybe(Scale, fixup and method.scale)
        self.pre_norm = _maybe(nn.LayerNorm, cfg.pre_norm, d)
        self.post_norm = _maybe(nn.LayerNorm, cfg.norm == "layernorm" and not cfg.pre_norm, d)
        self.lean = True  # compute forward by fixup.ops where it applies: same function, less memory

    def residual_branches(self) -> Sequence[Branch]:
        biases = [b for b in (self.bias_in, self.bias_out) if isinstance(b, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        return [Branch([self.q, self.k, self.v, self.out], self.kind, m=4, biases=biases, scale=scale)]

    def _heads(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        return x.view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, H, T, D/H)

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the modules would: no LayerNorm, plain
        ``nn.Linear`` projections, no hooks on the inner modules."""
        if type(self.pre_norm) is not nn.Identity or type(self.post_norm) is not nn.Identity:
            return False
        layers = (self.q, self.k, self.v, self.out)
        return all(plain_linear(m) for m in layers) and not observed(*layers, self.bias_in, self.bias_out, self.scale)

    def forward(self, x: Tensor, memory: Tensor | None = None, key_mask: Tensor | None = None,
                causal: bool = False, cache: Cache | None = None) -> Tensor:
        """``key_mask``: (B, S) True at real (non-padding) keys. ``cache`` holds keys and values of earlier
        steps (self-attention) or of the memory (cross-attention) for incremental decoding."""
        if self.lean and self.lean_ready():
            return self.lean_forward(x, memory, key_mask, causal, cache)
        h = self.bias_in(self.pre_norm(x))
        a = self._attend(x, self.q(h), lambda: h if memory is None else memory, self.k, self.v, memory, key_mask,
                         causal, cache)
        out = self.scale(F.dropout(self.out(self.bias_out(a)), self.dropout, self.training))
        return self.post_norm(residual_add(x, out, self.block_name))

    def lean_forward(self, x: Tensor, memory: Tensor | None = None, key_mask: Tensor | None = None,
                     causal: bool = False, cache: Cache | None = None) -> Tensor:
        """The forward with the scalars folded into the projections on the fly (:func:`fixup.ops.lean_linear`):
        ``W (x + b) = W x + b W.sum(1)`` for queries (and keys and values of self-attention), the output bias
        and multiplier in the output projection. Call where :meth:`lean_ready`."""
        b_in, b_out, s = (scalar_value(m) for m in (self.bias_in, self.bias_out, self.scale))
        shift = b_in if memory is None else None  # cross-attention's keys and values read the memory, unshifted

        def project(layer: nn.Linear) -> Callable[[Tensor], Tensor]:
            return lambda src: lean_linear(src, layer, shift=shift)

        q = lean_linear(x, self.q, shift=b_in)
        a = self._attend(x, q, lambda: x if memory is None else memory, project(self.k), project(self.v), memory,
                         key_mask, causal, cache)
        out = F.dropout(lean_linear(a, self.out, shift=b_out, scale=s), self.dropout, self.training)
        return lean_residual_(out, x, self.block_name)

    def _attend(self, x: Tensor, q: Tensor, source: Callable[[], Tensor], k_proj: Callable[[Tensor], Tensor],
                v_proj: Callable[[Tensor], Tensor], memory: Tensor | None, key_mask: Tensor | None, causal: bool,
                cache: Cache | None) -> Tensor:
        """Multi-head attention of the projected queries ``q`` (B, T, D) over keys and values projected from
        ``source()`` (or taken from ``cache``); returns (B, T, D) before the output projection."""
        q = self._heads(q)
        if cache is not None and "k" in cache and memory is not None:
            k, v = cache["k"], cache["v"]  # cross-attention: the memory's keys and values never change
        else:
            src = source()
            k, v = self._heads(k_proj(src)), self._heads(v_proj(src))
            if cache is not None:
                if memory is None and "k" in cache:  # self-attention: append this step
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S)
        is_causal = causal and (cache is None or q.shape[2] > 1)
        if is_causal and mask is not None:
            mask = mask & causal_mask(k.shape[2], x.device)[-q.shape[2]:]
            is_causal = False
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                           dropout_p=self.attention_dropout if self.training else 0.0)
        return a.transpose(1, 2).reshape(x.shape)  # (B, T, D)

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold the scalars into the projections (exact: all are linear layers); returns how many folded.

        Self-attention's keys and values take ``bias_in`` too; cross-attention's read the memory, whose own
        scalars the model folds in through :meth:`fold_memory_`.
        """
        if type(self.pre_norm) is not nn.Identity or type(self.post_norm) is not nn.Identity:
            return 0
        b_in, b_out, s = (scalar_value(m) for m in (self.bias_in, self.bias_out, self.scale))
        n = count_scalars(self.bias_in, self.bias_out, self.scale)
        self.q = fold_layer(self.q, shift=b_in)
        if self.kind != "cross-attn":
            self.k, self.v = fold_layer(self.k, shift=b_in), fold_layer(self.v, shift=b_in)
        self.out = fold_layer(self.out, shift=b_out, scale=s)
        self.bias_in, self.bias_out, self.scale = nn.Identity(), nn.Identity(), nn.Identity()
        return n

    @torch.no_grad()
    def fold_memory_(self, scale: Tensor | None, shift: Tensor | None) -> None:
        """The memory will arrive without ``scale * (memory + shift)`` applied: fold that into keys and values."""
        self.k = fold_layer(self.k, shift=shift, pre_scale=scale)
        self.v = fold_layer(self.v, shift=shift, pre_scale=scale)


class FeedForwardBlock(nn.Module):
    """``x + F(x)`` with F a two-layer ReLU network applied at every position."""

    def __init__(self, cfg: TransformerConfig, method: Method) -> None:
        super().__init__()
        fixup, d = method.fixup, cfg.d_model
        self.block_name, self.dropout, self.activation_dropout = "ffn", cfg.dropout, cfg.activation_dropout
        self.bias1, self.bias2, self.bias3 = (_maybe(Bias, fixup and method.biases) for _ in range(3))
        self.fc1 = nn.Linear(d, cfg.ffn_dim, bias=not fixup)
        self.fc2 = nn.Linear(cfg.ffn_dim, d, bias=not fixup)
        self.scale = _maybe(Scale, fixup and method.scale)
        self.pre_norm = _maybe(nn.LayerNorm, cfg.pre_norm, d)
        self.post_norm = _maybe(nn.LayerNorm, cfg.norm == "layernorm" and not cfg.pre_norm, d)
        self.lean = True  # compute forward by fixup.ops where it applies: same function, less memory

    def residual_branches(self) -> Sequence[Branch]:
        biases = [b for b in (self.bias1, self.bias2, self.bias3) if isinstance(b, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        return [Branch([self.fc1, self.fc2], "ffn", biases=biases, scale=scale)]

    def _scalar_modules(self) -> tuple[nn.Module, ...]:
        return self.bias1, self.bias2, self.bias3, self.scale

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the modules would: no LayerNorm, plain
        ``nn.Linear`` layers, no hooks on the inner modules."""
        if type(self.pre_norm) is not nn.Identity or type(self.post_norm) is not nn.Identity:
            return False
        return (plain_linear(self.fc1) and plain_linear(self.fc2)
                and not observed(self.fc1, self.fc2, *self._scalar_modules()))

    def lean_forward(self, x: Tensor) -> Tensor:
        """``x + s * fc2(relu(fc1(x + b1) + b2) + b3)`` with every scalar inside the two ``F.linear`` calls
        (:func:`fixup.ops.lean_linear`). Call where :meth:`lean_ready`."""
        b1, b2, b3, s = (scalar_value(m) for m in self._scalar_modules())
        h = lean_linear(x, self.fc1, shift=b1, bias=b2).relu_()
        h = F.dropout(h, self.activation_dropout, self.training)
        out = F.dropout(lean_linear(h, self.fc2, shift=b3, scale=s), self.dropout, self.training)
        return lean_residual_(out, x, self.block_name)

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold the scalars into fc1 and fc2 (exact); returns how many folded."""
        if type(self.pre_norm) is not nn.Identity or type(self.post_norm) is not nn.Identity:
            return 0
        b1, b2, b3, s = (scalar_value(m) for m in self._scalar_modules())
        n = count_scalars(*self._scalar_modules())
        self.fc1 = fold_layer(self.fc1, shift=b1, bias=b2)
        self.fc2 = fold_layer(self.fc2, shift=b3, scale=s)
        self.bias1, self.bias2, self.bias3, self.scale = (nn.Identity() for _ in range(4))
        return n

    def forward(self, x: Tensor) -> Tensor:
        if self.lean and self.lean_ready():
            return self.lean_forward(x)
        h = F.relu(self.bias2(self.fc1(self.bias1(self.pre_norm(x)))))
        h = F.dropout(h, self.activation_dropout, self.training)
        out = self.scale(F.dropout(self.fc2(self.bias3(h)), self.dropout, self.training))
        return self.post_norm(residual_add(x, out, self.block_name))


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

    def __init__(self, cfg: TransformerConfig, method: Method | str | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        method = check_method(cfg.norm if method is None else method, TRANSFORMER_NORMS, "the Transformer")
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
        self.encoder_norm = _maybe(nn.LayerNorm, cfg.pre_norm, d)
        self.decoder_norm = _maybe(nn.LayerNorm, cfg.pre_norm, d)
        self.output = nn.Linear(d, cfg.tgt_vocab, bias=False)
        name_blocks(self)
        stds = self.reset_parameters(generator)  # embeddings (and, for the baseline, everything) from `generator`
        if fixup:
            self.init_report = initialise_(self, method, generator=generator, base="xavier")
        else:
            self.init_report = describe_init(self, method.name, "fairseq: Xavier-uniform linear layers, zero "
                                             "biases, N(0, d^-1/2) embeddings and output projection", stds)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> dict[str, float]:
        """fairseq's initialisation: Xavier-uniform linear layers with zero biases, N(0, d^-1/2)
        embeddings and output projection, zero padding embedding, unit LayerNorm gains. Returns the std
        each linear layer was drawn with, by name."""
        d = self.cfg.d_model
        stds = {}
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear):
                bound = math.sqrt(6.0 / (mod.in_features + mod.out_features))
                mod.weight.uniform_(-bound, bound, generator=generator)
                stds[name] = bound / math.sqrt(3.0)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.normal_(0.0, d ** -0.5, generator=generator)
                mod.weight[self.cfg.pad_id].zero_()
            elif isinstance(mod, (nn.LayerNorm, Bias, Scale)):
                mod.reset_parameters()
        self.output.weight.normal_(0.0, d ** -0.5, generator=generator)
        stds["output"] = d ** -0.5
        return stds

    def classifier_layers(self) -> Sequence[nn.Module]:
        return [self.output]

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
