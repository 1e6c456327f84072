"""Batch-level image augmentation and normalisation written with plain torch ops.

Everything here works on a whole batch ``(B, C, H, W)`` at once and draws its randomness from an
explicit ``torch.Generator``, so an epoch's augmentation is a pure function of the generator's seed:
that is what makes resumed runs bit-exact and multi-process runs reproducible. (torchvision is not
used: it does not import beside every torch build.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["adapt_channels", "normalize", "random_crop", "random_flip", "resize_images"]


def adapt_channels(x: Tensor, channels: int) -> Tensor:
    """Make a batch have ``channels`` channels: 0 keeps it, 1 <-> 3 by averaging or repeating."""
    c = x.shape[1]
    if channels in (0, c):
        return x
    if c == 1:
        return x.expand(-1, channels, -1, -1).contiguous()
    if channels == 1:
        return x.mean(1, keepdim=True)
    raise ValueError(f"cannot turn {c}-channel images into {channels} channels; use channels=0 (as stored), 1 or 3")


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(x - mean) / std`` per channel for a batch ``(B, C, H, W)`` of floats."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    if m.shape[1] != x.shape[1]:
        raise ValueError(f"normalisation has {m.shape[1]} channel means but the images have {x.shape[1]} channels")
    return (x - m) / s


def random_crop(x: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Zero-pad each image by ``padding`` pixels and crop a random window of the original size.

    The standard CIFAR augmentation (He et al. 2016, section 4.2: "4 pixels are padded on each
    side, and a 32x32 crop is randomly sampled"). Each image of the batch gets its own offset.
    """
    if padding <= 0:
        return x
    b, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[bi, ci, rows, cols]  # (B, C, H, W)


def random_flip(x: Tensor, generator: torch.Generator, p: float = 0.5) -> Tensor:
    """Mirror each image left-right with probability ``p``."""
    flip = (torch.rand(x.shape[0], generator=generator) < p).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(3), x)


def resize_images(x: Tensor, size: int, mode: str = "interpolate") -> Tensor:
    """Bring a batch of square-ish images to ``size x size``.

    ``mode="interpolate"`` resamples bilinearly; ``mode="pad"`` centres the image on a zero canvas
    (it must not be larger than ``size``).
    """
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    if mode == "interpolate":
        return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=size < max(h, w))
    if mode == "pad":
        if h > size or w > size:
            raise ValueError(f"cannot pad {h}x{w} images to the smaller size {size}; use resize='interpolate'")
        top, left = (size - h) // 2, (size - w) // 2
        return F.pad(x, (left, size - w - left, top, size - h - top))
    raise ValueError(f"resize mode must be 'interpolate' or 'pad', got {mode!r}")
