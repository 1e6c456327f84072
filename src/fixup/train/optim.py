"""Optimisers over Fixup's parameter groups (:func:`fixup.param_groups`), and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..groups import param_groups as fixup_param_groups
from .config import TrainConfig

__all__ = ["build_optimizer", "build_scheduler", "config_groups", "lr_factor"]


def config_groups(model: nn.Module, config: TrainConfig) -> list[dict[str, Any]]:
    """:func:`fixup.param_groups` with the config's rates: weights, scalars, the budgeted stream biases, gates."""
    wd = None if config.scalar_weight_decay < 0 else config.scalar_weight_decay
    return fixup_param_groups(model, config.effective_lr, config.weight_decay, scalar_lr_mult=config.scalar_lr_mult,
                              scalar_weight_decay=wd, gate_lr_mult=config.gate_lr_mult)


def build_optimizer(model: nn.Module, config: TrainConfig) -> tuple[torch.optim.Optimizer, list[dict[str, Any]]]:
    """The optimiser over :func:`config_groups`, and a JSON-able description of its groups for the log."""
    groups = config_groups(model, config)
    summary = [{"name": g["name"], "lr": g["lr"], "weight_decay": g["weight_decay"], "count": len(g["params"]),
                "numel": sum(p.numel() for p in g["params"]), "params": g["param_names"]} for g in groups]
    torch_groups = [{k: v for k, v in g.items() if k != "param_names"} for g in groups]  # names stay in the log
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
      CIFAR ResNet recipe: divide by 10 at 50% and 75%); the first step always runs at the peak rate.
    - ``cosine``: half a cosine from 1 to 0 over the steps after warm-up (Loshchilov & Hutter 2017).
    - ``inverse_sqrt``: with a warm-up of W steps, ``sqrt(W / (step + 1))`` after it (Vaswani et al. 2017,
      section 5.3); without one, ``sqrt(P / (P + step))`` from the first step, P = ``decay_period`` (the T-Fixup
      authors' ``inverse_sqrt_nowarmup``: 1, 0.707, 0.577 at steps 0, P, 2P).

    Linear warm-up multiplies by ``(step + 1) / warmup_steps`` during the first ``warmup_steps``.
    """
    warm = config.warmup_steps
    factor = (step + 1) / warm if step < warm else 1.0
    if config.schedule == "step":
        factor *= config.gamma ** sum(step >= max(1, round(m * total)) for m in config.milestones)
    elif config.schedule == "cosine":
        progress = min(1.0, max(0.0, (step - warm) / max(1, total - warm)))
        factor *= 0.5 * (1.0 + math.cos(math.pi * progress))
    elif config.schedule == "inverse_sqrt" and config.decay_period:
        factor *= math.sqrt(config.decay_period / (config.decay_period + step))
    elif config.schedule == "inverse_sqrt" and step >= warm:
        factor *= math.sqrt(warm / (step + 1))
    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, total: int,
                    config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-optimiser-step ``LambdaLR`` applying :func:`lr_factor` to every group's own peak rate."""

    def factor(step: int) -> float:
        return lr_factor(step, total, config)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
