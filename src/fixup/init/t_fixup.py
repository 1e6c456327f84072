"""T-Fixup (Huang, Perez, Ba & Volkovs, "Improving Transformer Optimization Through Better Initialization",
ICML 2020, section 3.3) for the encoder-decoder Transformer: no LayerNorm and no learning-rate warm-up.

1. Xavier for every linear layer, N(0, d^-1/2) for the input embeddings (d the embedding width);
2. in the decoder (N layers), the value and output projections of every attention block (self and cross), both
   MLP weights and the input embeddings times (9N)^(-1/4);
3. in the encoder (N layers), the value and output projections of every attention block and both MLP weights
   times 0.67 N^(-1/4) (its input embeddings, like the decoder's, times (9N)^(-1/4)).

A model takes part by defining ``stacks()``: ``[(name, layers, input_embedding), ...]`` for ``"encoder"`` and
``"decoder"``; its attention blocks declare ``[q, k, v, out]`` as their branch (the value and output projections
are the last two), its feed-forward blocks ``[fc1, fc2]``. Our deviations are listed in docs/methods.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..branch import find_branches, find_classifier
from ..method import Method
from ..report import TFixupReport
from ._layers import record
from ._skeleton import module_names, norm_warnings, remaining_norms, sweep_rest_
from .fans import xavier_std

# Its report lives in fixup.report with the others; it is named here too, for the imports that predate the move.
__all__ = ["TFixupReport", "decoder_factor", "encoder_factor", "initialise_"]

ATTENTION = ("self-attn", "cross-attn")


def encoder_factor(n: int) -> float:
    """T-Fixup's factor for the encoder's value, output and MLP weights: 0.67 N^(-1/4) (section 3.3)."""
    return 0.67 * n ** -0.25


def decoder_factor(n: int) -> float:
    """T-Fixup's factor for the decoder's value, output and MLP weights and the input embeddings: (9N)^(-1/4)."""
    return (9 * n) ** -0.25


def _stacks(model: nn.Module, method: Method) -> list[tuple[str, nn.Module, nn.Embedding]]:
    stacks = model.stacks() if callable(getattr(model, "stacks", None)) else None
    if not stacks or {name for name, _, _ in stacks} != {"encoder", "decoder"}:
        raise ValueError(f"{method.name} is not available for {type(model).__name__}: it applies to the "
                         "encoder-decoder Transformer (a model whose stacks() names its encoder and decoder), e.g. "
                         f"fixup.create_model('transformer_tiny', method={method.name!r})")
    return stacks


def _scaled_layers(stack: nn.Module, name: str) -> list[nn.Linear]:
    """The value and output projections of each attention branch and both MLP weights, in module order."""
    out = []
    for block, branch in find_branches(stack):
        if branch.kind in ATTENTION and len(branch.layers) == 4:
            out += list(branch.layers[2:])  # [q, k, v, out]: the value and output projections
        elif branch.kind == "ffn":
            out += list(branch.layers)
        else:
            raise ValueError(f"{name}.{block}: T-Fixup knows attention branches declared as [q, k, v, out] and "
                             f"feed-forward branches [fc1, fc2], got {branch.kind!r} with {len(branch.layers)} layers")
    if any(not isinstance(layer, nn.Linear) for layer in out):
        raise ValueError(f"{name}: T-Fixup scales nn.Linear layers; the branches declare other layers")
    return out


@torch.no_grad()
def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> TFixupReport:
    """Draw every linear layer Xavier (uniform, biases 0), the input embeddings N(0, d^-1/2) (padding row 0) and a
    separate output projection N(0, d^-1/2), then scale by section 3.3; return the report. ``base`` is unused
    (T-Fixup starts from Xavier). Raises, before any weight changes, on a model that is not an encoder-decoder."""
    stacks = _stacks(model, method)
    plan = {name: (layers, embed, _scaled_layers(layers, name)) for name, layers, embed in stacks}
    depth = {name: len(list(layers)) for name, (layers, _, _) in plan.items()}
    factor = {"encoder": encoder_factor(depth["encoder"]), "decoder": decoder_factor(depth["decoder"])}
    embed_factor = {name: decoder_factor(n) for name, n in depth.items()}  # (9N)^(-1/4), N the stack's own
    names = module_names(model)
    classifier = find_classifier(model)
    norms = remaining_norms(model)
    warnings = norm_warnings(norms, "T-Fixup removes every LayerNorm")

    stds: dict[int, float] = {}
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            std = xavier_std(mod.weight)
            mod.weight.uniform_(-math.sqrt(3.0) * std, math.sqrt(3.0) * std, generator=generator)
            if mod.bias is not None:
                mod.bias.zero_()
            stds[id(mod)] = std
    for layer in classifier:  # a separate output projection: fairseq's N(0, d^-1/2)
        std = layer.weight.shape[1] ** -0.5
        layer.weight.normal_(0.0, std, generator=generator)
        stds[id(layer)] = std
    scaled = []
    for name, (_, _, layers) in plan.items():
        for layer in layers:
            layer.weight.mul_(factor[name])
            stds[id(layer)] *= factor[name]
            scaled.append(record(names[id(layer)], layer, stds[id(layer)]))
    embeddings, seen = [], set()
    for name, (_, embed, _) in plan.items():
        if id(embed) in seen:  # one table shared by both stacks: the encoder's factor, as the authors' code
            continue
        seen.add(id(embed))
        std = embed.weight.shape[1] ** -0.5 * embed_factor[name]
        embed.weight.normal_(0.0, std, generator=generator)
        if embed.padding_idx is not None:
            embed.weight[embed.padding_idx].zero_()
        embeddings.append(record(names[id(embed)], embed, std))
    special = {id(layer) for _, (_, _, layers) in plan.items() for layer in layers} | {id(c) for c in classifier}
    other = [record(names[id(mod)], mod, stds[id(mod)]) for mod in model.modules()
             if isinstance(mod, nn.Linear) and id(mod) not in special]
    rest = sweep_rest_(model, seen | set(stds))  # every linear layer and embedding is drawn above
    return TFixupReport(method=method.name, num_branches=len(find_branches(model)), scheme="Xavier uniform",
                        other_layers=other, untouched=rest.untouched, num_scalars=rest.num_scalars, normalization=norms,
                        warnings=warnings, fan_mode="xavier", encoder_layers=depth["encoder"],
                        decoder_layers=depth["decoder"], encoder_factor=factor["encoder"],
                        decoder_factor=factor["decoder"], scaled=scaled, embeddings=embeddings,
                        classifier=[record(names[id(c)], c, stds[id(c)]) for c in classifier])
