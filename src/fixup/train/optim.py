"""Optimisers with Fixup's parameter groups, and the learning-rate schedules.

Fixup's scalar biases and multipliers (rule 3) are single numbers that steer whole tensors; the
paper (section 4.2) lowers their learning rate tenfold under strong regularisation (Mixup). They are
found by module type (:class:`fixup.nn.Bias`, :class:`fixup.nn.Scale`), never by parameter name, and
form the ``scalars`` group; every other parameter is in ``weights``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..nn import Bias, Scale
from .config import TrainConfig

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "param_groups"]


def param_groups(model: nn.Module, config: TrainConfig) -> list[dict[str, Any]]:
    """The optimiser's parameter groups, each ``{"name", "params", "lr", "weight_decay", "param_names"}``.

    ``param_names`` is for the run log only (strip it before handing groups to an optimiser, as
    :func:`build_optimizer` does).
    """
    scalars = {id(p) for m in model.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters(recurse=False)}
    lr = config.effective_lr
    wd_scalar = config.weight_decay if config.scalar_weight_decay < 0 else config.scalar_weight_decay
    groups = {
        "weights": {"name": "weights", "params": [], "param_names": [], "lr": lr, "weight_decay": config.weight_decay},
        "scalars": {"name": "scalars", "params": [], "param_names": [], "lr": lr * config.scalar_lr_mult,
                    "weight_decay": wd_scalar},
    }
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = groups["scalars" if id(p) in scalars else "weights"]
        g["params"].append(p)
        g["param_names"].append(name)
    return [g for g in groups.values() if g["params"]]


def build_optimizer(model: nn.Module, config: TrainConfig) -> tuple[torch.optim.Optimizer, list[dict[str, Any]]]:
    """The optimiser over :func:`param_groups`, and a JSON-able description of its groups for the log."""
    groups = param_groups(model, config)
    summary = [{"name": g["name"], "lr": g["lr"], "weight_decay": g["weight_decay"], "count": len(g["params"]),
                "numel": sum(p.numel() for p in g["params"]), "params": g["param_names"]} for g in groups]
    torch_groups = [{k: v for k, v in g.items() if k != "param_names"} for g in groups]
    if config.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(torch_groups, lr=config.effective_lr, momentum=config.momentum,
                                                     nesterov=config.nesterov)
    elif config.optimizer == "adam":
        opt = torch.optim.Adam(torch_groups, lr=config.effective_lr, betas=config.betas, eps=config.eps)
    elif config.optimizer == "adamw":
        opt = torch.optim.AdamW(torch_groups, lr=config.effective_lr, betas=config.betas, eps=config.eps)
    else:  # validate() rejects anything else
        raise ValueError(f"unknown optimizer {config.optimizer!r}")
    return opt, summary


def lr_factor(step: int, total: int, config: TrainConfig) -> float:
    """The multiplier of the peak learning rate for optimiser step ``step`` (0-based) of ``total``.

    - ``constant``: 1.
    - ``step``: ``gamma`` to the number of ``milestones`` (fractions of ``total``) already passed (the
      CIFAR ResNet recipe: divide by 10 at 50% and 75%).
    - ``cosine``: half a cosine from 1 to 0 over the steps after warm-up (Loshchilov & Hutter 2017).
    - ``inverse_sqrt``: ``sqrt(warmup / (step + 1))`` after warm-up (Vaswani et al. 2017, section 5.3).

    Linear warm-up multiplies by ``(step + 1) / warmup_steps`` during the first ``warmup_steps``.
    """
    warm = config.warmup_steps
    factor = (step + 1) / warm if step < warm else 1.0
    if config.schedule == "step":
        factor *= config.gamma ** sum(step >= round(m * total) for m in config.milestones)
    elif config.schedule == "cosine":
        progress = min(1.0, max(0.0, (step - warm) / max(1, total - warm)))
        factor *= 0.5 * (1.0 + math.cos(math.pi * progress))
    elif config.schedule == "inverse_sqrt" and step >= warm:
        factor *= math.sqrt(warm / (step + 1))
    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, total: int,
                    config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-optimiser-step ``LambdaLR`` applying :func:`lr_factor` to every group's own peak rate."""

    def factor(step: int) -> float:
        return lr_factor(step, total, config)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
