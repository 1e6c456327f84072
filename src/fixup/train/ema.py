"""An exponential moving average of the weights, evaluated in place of the live ones (``ema_decay``).

After each optimiser step the average moves towards the live weights: ``avg += (1 - d_t) (w - avg)`` with
``d_t = min(decay, (1 + t) / (10 + t))`` after ``t`` updates, the warm-up of TensorFlow's
``ExponentialMovingAverage(num_updates=...)``: early on the average follows the weights closely, so a short run is
not dominated by its initialisation. Floating-point buffers (BatchNorm's running statistics) are averaged the same
way; other buffers are the live ones. Under DP-SGD the average is post-processing of the released weights and
costs no privacy; it averages out part of the noise's random walk (De et al. 2022 average the weights of every
private run this way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """The running average of ``model``'s floating-point parameters and buffers (a copy, on their device)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1), got {decay}; 0.999 suits runs of many thousand steps, "
                             "0.9-0.99 runs of a few hundred")
        self.decay, self.updates = decay, 0
        named = [(n, t) for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_floating_point()]
        self.names = [n for n, _ in named]
        self._live = [t.detach() for _, t in named]  # the model's own tensors, found once (updated in place)
        self.average = [t.clone() for t in self._live]

    def current_decay(self) -> float:
        """The decay the next update uses (the warm-up's, while it is below ``decay``)."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the live weights (call after each optimiser step)."""
        torch._foreach_lerp_(self.average, self._live, 1.0 - self.current_decay())
        self.updates += 1

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """Inside, the model holds the averaged weights; the live ones come back on exit (also after an error)."""
        live = self._live
        kept = [t.clone() for t in live]
        torch._foreach_copy_(live, self.average)
        try:
            yield
        finally:
            torch._foreach_copy_(live, kept)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Put the averaged weights into the model for good (the live ones are lost)."""
        torch._foreach_copy_(self._live, self.average)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates,
                "average": {n: t.detach().cpu() for n, t in zip(self.names, self.average, strict=True)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved average; a different set of tensors or shapes is a ValueError that names the first."""
        saved = state["average"]
        if sorted(saved) != sorted(self.names):
            missing = sorted(set(self.names) ^ set(saved))
            raise ValueError(f"the saved weight average holds other tensors than this model (first: {missing[0]})")
        for name, t in zip(self.names, self.average, strict=True):
            if saved[name].shape != t.shape:
                raise ValueError(f"the saved weight average's {name} has shape {tuple(saved[name].shape)}, this "
                                 f"model's {tuple(t.shape)}")
            t.copy_(saved[name])
        self.updates = int(state["updates"])
