"""Watching a run for collapse: a network whose units have all died, named instead of trained on in silence.

Two signatures, measured on the model's own declarations (no parameter names):

- **live units**: the fraction of the classifier's input features that vary across the training batch.
  When every unit after the last activation is dead (0 for every example), the classifier sees the same
  vector for every input, every gradient below it is exactly 0 and the loss stays at the entropy of
  the class prior for good. This is what collapse is.
- **stream offsets**: per stage, the sum of the stream biases (each branch's bias after its last layer,
  ``Branch.stream_bias``). Every stream bias of a stage receives the same gradient, so their sum is the
  shift of the whole stage's residual stream; a large negative offset before a ReLU is how collapse
  happens in the paper's parameterisation (docs/training.md).

:class:`CollapseWatch` records both; a run with no live unit for ``patience`` consecutive steps is
stopped with the outcome ``collapsed``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn

from ..branch import find_branches, find_classifier

__all__ = ["CollapseWatch", "live_fraction", "stage_of", "stream_offsets"]


def live_fraction(features: Tensor) -> Tensor:
    """The fraction of features (last dimension) that vary across all other dimensions, as a 0-dim tensor.

    ``features`` is a classifier's input: (B, C), or (B, T, C) for a sequence model. A feature is live when
    its spread over the batch exceeds 1e-6 of its magnitude (a constant, however large, is dead).
    """
    flat = features.detach().float().reshape(-1, features.shape[-1])
    if flat.shape[0] < 2:
        return flat.new_ones(())
    spread = flat.std(0, correction=0)
    return (spread > 1e-6 * flat.abs().mean(0).clamp_min(1e-12)).float().mean()


def stage_of(block: str) -> str:
    """The stage of a block's qualified name: its parent module (``layer2.3`` -> ``layer2``)."""
    return block.split("[")[0].rpartition(".")[0] or "model"


def stream_offsets(model: nn.Module) -> dict[str, float]:
    """Per stage (a block's parent module, e.g. ``layer2``), the sum of the stream biases of its branches."""
    stages: dict[str, list[Tensor]] = defaultdict(list)
    for block, branch in find_branches(model):
        if branch.stream_bias is not None:
            stages[stage_of(block)].append(branch.stream_bias.bias)
    with torch.no_grad():
        return {stage: float(torch.stack([b.reshape(()) for b in biases]).sum()) for stage, biases in stages.items()}


class CollapseWatch:
    """Records the live fraction of the classifier's input at each training forward pass.

    ``check()`` after a step returns a one-line reason once no unit has been live for ``patience``
    consecutive steps (0 turns the watch off), else ``""``. Models that declare no classifier are not
    watched. Call ``close()`` to remove the hook.
    """

    def __init__(self, model: nn.Module, patience: int) -> None:
        self.model, self.patience = model, patience
        self.dead_since: int | None = None
        self.last: Tensor | None = None
        classifier = find_classifier(model)
        self._hook = None
        if patience > 0 and classifier:
            self._hook = classifier[0].register_forward_pre_hook(self._record)

    def _record(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if module.training and args and isinstance(args[0], Tensor):
            self.last = live_fraction(args[0])

    @property
    def active(self) -> bool:
        return self._hook is not None

    def check(self, step: int) -> str:
        """After optimiser step ``step``: the reason the run has collapsed, or ``""``."""
        if self.last is None:
            return ""
        if float(self.last) > 0.0:
            self.dead_since = None
            return ""
        if self.dead_since is None:
            self.dead_since = step
        if step - self.dead_since + 1 < self.patience:
            return ""
        offsets = ", ".join(f"{k} {v:+.3g}" for k, v in stream_offsets(self.model).items())
        return (f"no unit of the classifier's input has varied across the batch since step {self.dead_since} "
                f"({self.patience} steps): the network is dead"
                + (f"; stream offsets per stage: {offsets}" if offsets else ""))

    def record(self) -> dict[str, float]:
        """The signatures now, for the epoch's history: ``live_fraction`` and ``stream_offset.<stage>``."""
        out = {} if self.last is None else {"live_fraction": float(self.last)}
        out.update({f"stream_offset.{k}": v for k, v in stream_offsets(self.model).items()})
        return out

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
