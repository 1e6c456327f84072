"""The Transformer's parts: its config, positions, masks and its two residual blocks.

Each block is one residual branch ``x + F(x)`` (Fixup, section 5: every LayerNorm of the fairseq
Transformer replaced by the Fixup parameterisation) and owns its branch declaration, its lean forward
(the scalars inside the projections, :func:`fixup.perf.ops.lean_linear`) and its folding (``fold_``).
:mod:`fixup.models.transformer` assembles them into the encoder-decoder model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import Branch
from ..method import Method
from ..nn import Bias, DyT, Scale, residual_add
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import lean_linear, lean_residual_, observed, plain_linear, scalar_value
from ._common import branch_multiplier

__all__ = ["NORMED", "TRANSFORMER_NORMS", "AttentionBlock", "Cache", "FeedForwardBlock", "TransformerConfig",
           "causal_mask", "sinusoidal_positions", "token_norm"]

# "none": the gated methods (skipinit, rezero) and t_fixup; "dyt": Dynamic Tanh where each LayerNorm was
TRANSFORMER_NORMS = ("fixup", "layernorm", "none", "dyt")
NORMED = ("layernorm", "dyt")  # the norms with a layer at each of the LayerNorm's places (post- or pre-norm)

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
    norm: str = "fixup"  # "fixup", "layernorm", "dyt" (DyT at the LayerNorm's places), or "none" (skipinit, rezero,
    # t_fixup)
    pre_norm: bool = False  # LayerNorm (or DyT) before each branch, and one ending each stack (norm "layernorm"/"dyt")
    share_embeddings: bool = False  # one embedding table for source and target (joint vocabulary)
    pad_id: int = 0  # padding token id, the same on both sides
    max_positions: int = 1024  # longest sequence the sinusoidal table covers

    def __post_init__(self) -> None:
        if self.norm not in TRANSFORMER_NORMS:
            raise ValueError(f"norm={self.norm!r} is not available for the Transformer; choose one of "
                             f"{', '.join(TRANSFORMER_NORMS)}")
        if self.pre_norm and self.norm not in NORMED:
            raise ValueError(f"pre_norm=True places a LayerNorm (or DyT) before each branch; it needs "
                             f"norm='layernorm' or 'dyt', got norm={self.norm!r}")
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


def token_norm(method: Method, d: int, on: bool) -> nn.Module:
    """What stands at one of the LayerNorm's places: a LayerNorm over the last dimension, a :class:`fixup.nn.DyT`
    in its place (norm "dyt", alpha from the method: Zhu et al. 2025), or nothing where ``on`` is False."""
    if not on:
        return nn.Identity()
    return DyT(d, -1, method.dyt_alpha) if method.norm == "dyt" else nn.LayerNorm(d)


class AttentionBlock(nn.Module):
    """``x + F(x)`` with F multi-head attention of ``x`` over itself (causal or not) or over ``memory``."""

    def __init__(self, cfg: TransformerConfig, kind: str, method: Method) -> None:
        super().__init__()
        fixup, d = method.fixup, cfg.d_model
        self.kind, self.heads, self.block_name = kind, cfg.heads, kind
        self.dropout, self.attention_dropout = cfg.dropout, cfg.attention_dropout
        self.bias_in, self.bias_out = _maybe(Bias, fixup and method.biases), _maybe(Bias, fixup and method.biases)
        self.q, self.k, self.v, self.out = (nn.Linear(d, d, bias=not fixup) for _ in range(4))
        for proj in (self.q, self.k, self.v):  # fairseq draws Q, K, V as one (3d, d) matrix: Xavier std (2d)^-1/2
            proj.fan_out_mult = 3  # read by the standard initialisation (Transformer.reset_parameters, fixup.init)
        self.scale = branch_multiplier(method)  # Fixup's multiplier, or the gate of skipinit / rezero
        self.pre_norm = token_norm(method, d, cfg.pre_norm)
        self.post_norm = token_norm(method, d, cfg.norm in NORMED and not cfg.pre_norm)
        self.lean = True  # compute forward by fixup.perf.ops where it applies: same function, less memory

    def residual_branches(self) -> Sequence[Branch]:
        biases = [b for b in (self.bias_in, self.bias_out) if isinstance(b, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        return [Branch([self.q, self.k, self.v, self.out], self.kind, m=4, biases=biases, scale=scale)]

    def _heads(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        return x.view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, H, T, D/H)

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the modules would: no LayerNorm (or DyT), plain
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
        """The forward with the scalars folded into the projections on the fly (:func:`fixup.perf.ops.lean_linear`):
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
        self.scale = branch_multiplier(method)  # Fixup's multiplier, or the gate of skipinit / rezero
        self.pre_norm = token_norm(method, d, cfg.pre_norm)
        self.post_norm = token_norm(method, d, cfg.norm in NORMED and not cfg.pre_norm)
        self.lean = True  # compute forward by fixup.perf.ops where it applies: same function, less memory

    def residual_branches(self) -> Sequence[Branch]:
        biases = [b for b in (self.bias1, self.bias2, self.bias3) if isinstance(b, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        return [Branch([self.fc1, self.fc2], "ffn", biases=biases, scale=scale)]

    def _scalar_modules(self) -> tuple[nn.Module, ...]:
        return self.bias1, self.bias2, self.bias3, self.scale

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the modules would: no LayerNorm (or DyT), plain
        ``nn.Linear`` layers, no hooks on the inner modules."""
        if type(self.pre_norm) is not nn.Identity or type(self.post_norm) is not nn.Identity:
            return False
        return (plain_linear(self.fc1) and plain_linear(self.fc2)
                and not observed(self.fc1, self.fc2, *self._scalar_modules()))

    def lean_forward(self, x: Tensor) -> Tensor:
        """``x + s * fc2(relu(fc1(x + b1) + b2) + b3)`` with every scalar inside the two ``F.linear`` calls
        (:func:`fixup.perf.ops.lean_linear`). Call where :meth:`lean_ready`."""
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


