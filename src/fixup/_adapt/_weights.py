"""Weights of an adapted model: tied weights Fixup would zero through, and loading the original weights."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..branch import WeightSlice, find_branches, find_classifier
from ._graph import AdaptError

__all__ = ["WeightsLoaded", "load_original", "untie_"]


def _holders(model: nn.Module) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                names = out.setdefault(id(p), [])
                full = f"{mname}.{pname}" if mname else pname
                if full not in names:
                    names.append(full)
    return out


def untie_(model: nn.Module, layers: Iterable[nn.Module], names: Mapping[int, str], untie: bool) -> list[str]:
    """Give each of ``layers`` (those Fixup zeroes or rescales) its own weight where it shares it with another
    module (GPT-2's ``lm_head`` and ``wte``); return one message per weight untied.

    With ``untie=False`` a shared weight is an :class:`AdaptError` that says how to untie it: initialising
    the layer would otherwise zero or rescale the other module's weight too (a whole embedding table).
    """
    holders = _holders(model)
    messages = []
    for mod in {id(m): m for m in layers}.values():
        p = mod._parameters.get("weight")
        if p is None or len(holders.get(id(p), [])) < 2:
            continue
        mine = f"{names.get(id(mod), type(mod).__name__)}.weight"
        others = [n for n in holders[id(p)] if n != mine]
        if not untie:
            raise AdaptError(
                f"{mine} is the same parameter as {', '.join(others)} (tied weights): Fixup zeroes or rescales "
                f"{mine}, which would change {others[0]} too. Untie it first, e.g. `model.{mine} = "
                f"nn.Parameter(model.{mine}.detach().clone())` (and config.tie_word_embeddings = False for a "
                "Hugging Face model), or pass untie_weights=True")
        mod._parameters["weight"] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        messages.append(f"{mine} was tied to {', '.join(others)}; untied (its own copy, {p.numel():,} more "
                        f"parameters), so that initialising it leaves {others[0]} as it was")
    config = getattr(model, "config", None)
    if messages and hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = False  # so that transformers' tie_weights() does not tie them again
        messages[-1] += "; config.tie_word_embeddings set to False"
    return messages


@dataclass
class WeightsLoaded:
    """What :func:`load_original` did: entries loaded, entries of the original dropped and why, and the
    zero-initialised layers (rule 1) that the loaded values replaced."""

    loaded: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    zeroed_overwritten: list[str] = field(default_factory=list)


def load_original(model: nn.Module, state_dict: Mapping[str, Tensor]) -> WeightsLoaded:
    """Copy into an adapted ``model`` every entry of the original model's ``state_dict`` that still exists
    with the same name and shape (convolutions, linear layers, embeddings), and say what was dropped
    (normalisation statistics and affine vectors: a replaced norm keeps only a scalar ``bias``).

    The entries Fixup added (``fixup_bias``, ``fixup_scale``) keep their initial values. Loading a layer that
    Fixup zeroed (a branch's last layer, the classifier) replaces its zeros: the branches no longer start
    as the identity, and ``zeroed_overwritten`` lists those layers.
    """
    own = model.state_dict()
    zeroed = {}
    for block, branch in find_branches(model):
        for last in branch.zeroed:
            zeroed[id(last.module if isinstance(last, WeightSlice) else last)] = block
    for layer in find_classifier(model):
        zeroed[id(layer)] = "classifier"
    by_param = {id(p): name for name, mod in model.named_modules() if id(mod) in zeroed
                for name in [name] for p in [getattr(mod, "weight", None)] if p is not None}
    out = WeightsLoaded()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, value in state_dict.items():
            if key not in own:
                out.dropped.append(f"{key}: no such entry in the adapted model (a normalisation taken out)")
            elif tuple(own[key].shape) != tuple(value.shape):
                out.dropped.append(f"{key}: shape {tuple(value.shape)}, the adapted model's is {tuple(own[key].shape)}"
                                   " (a normalisation replaced by a scalar bias)")
            else:
                own[key].copy_(value)
                out.loaded.append(key)
                p = params.get(key)
                if p is not None and id(p) in by_param and key.endswith("weight"):
                    out.zeroed_overwritten.append(by_param[id(p)])
    return out
