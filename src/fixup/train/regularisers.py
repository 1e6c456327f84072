"""Explicit regularisers applied to training batches: Mixup, Cutout and label smoothing.

The Fixup paper (section 4.2 and appendix C) leans on them: without BatchNorm's implicit
regularisation, Fixup networks fit the training set faster and need explicit regularisation to
generalise as well. Each function draws its randomness from an explicit ``torch.Generator``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["cutout", "mixup", "soft_targets"]


def soft_targets(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """One-hot rows ``(B, num_classes)`` with ``smoothing`` of the mass spread uniformly over all classes."""
    onehot = F.one_hot(labels, num_classes).float()
    return onehot * (1.0 - smoothing) + smoothing / num_classes


def mixup(x: Tensor, targets: Tensor, alpha: float, generator: torch.Generator) -> tuple[Tensor, Tensor, float]:
    """Mixup (Zhang et al. 2018): one ``lam ~ Beta(alpha, alpha)`` for the batch, partners by a random permutation.

    Returns ``(lam * x + (1 - lam) * x[perm], lam * t + (1 - lam) * t[perm], lam)`` for soft targets
    ``t`` (rows summing to 1, so the mixed rows do too).
    """
    if alpha <= 0:
        raise ValueError(f"mixup needs alpha > 0, got {alpha}")
    # torch's Beta sampler cannot take a generator; numpy's can be seeded from ours, keeping one stream.
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
    return lam * x + (1.0 - lam) * x[perm], lam * targets + (1.0 - lam) * targets[perm], lam


def cutout(x: Tensor, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Cutout (DeVries & Taylor 2017): zero one ``size x size`` square per image, centred anywhere.

    The centre is uniform over the image, so squares near a border are clipped by it. Returns the
    images and the boxes ``(B, 4)`` as ``(top, bottom, left, right)`` (bottom/right exclusive).
    """
    b, _, h, w = x.shape
    cy = torch.randint(0, h, (b,), generator=generator)
    cx = torch.randint(0, w, (b,), generator=generator)
    top, left = (cy - size // 2).clamp(0, h), (cx - size // 2).clamp(0, w)
    bottom, right = (cy - size // 2 + size).clamp(0, h), (cx - size // 2 + size).clamp(0, w)
    rows, cols = torch.arange(h)[None, :], torch.arange(w)[None, :]
    inside_r = (rows >= top[:, None]) & (rows < bottom[:, None])  # (B, H)
    inside_c = (cols >= left[:, None]) & (cols < right[:, None])  # (B, W)
    keep = ~(inside_r[:, :, None] & inside_c[:, None, :])  # (B, H, W)
    boxes = torch.stack([top, bottom, left, right], 1)
    return x.masked_fill(~keep[:, None].to(x.device), 0.0), boxes
