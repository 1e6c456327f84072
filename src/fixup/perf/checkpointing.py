"""Activation checkpointing by segments of residual blocks, for very deep networks.

A training step keeps every block's activations for the backward pass, so memory grows with depth:
a 10,000-layer CIFAR ResNet at batch 8 keeps gigabytes. With checkpointing, the blocks of each stage
(an ``nn.Sequential`` of residual blocks) are cut into contiguous segments; only each segment's input
is kept, and a segment's inside is recomputed during backward, one segment at a time. Memory falls
from O(blocks) to O(segments + blocks / segments) activations (smallest near segments = sqrt(blocks)),
for about one extra forward pass of compute.

``enable_checkpointing(model, segments)`` is what ``fixup.train`` calls for its ``checkpoint_segments``
setting. The model computes the same function and gradients. Models whose normalisation keeps running
statistics (BatchNorm) update them twice per step under checkpointing (once more in the recompute), so
use it with Fixup or norm-free models, or accept that shift in the running averages.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..branch import ResidualBlock

__all__ = ["CheckpointedSequential", "checkpointed_stages", "disable_checkpointing", "enable_checkpointing"]


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` of blocks run as ``segments`` checkpointed segments when gradients are on.

    Its children keep their names (``0``, ``1``, ...), so state dicts are the same as the plain stage's.
    Without gradients (evaluation, ``torch.no_grad``) it runs as a plain ``nn.Sequential``.
    """

    def __init__(self, segments: int, *blocks: nn.Module) -> None:
        super().__init__(*blocks)
        if segments < 1:
            raise ValueError(f"segments must be at least 1, got {segments}")
        self.segments = min(int(segments), max(1, len(blocks)))

    def _bounds(self) -> Iterator[tuple[int, int]]:
        n, k = len(self), self.segments
        for i in range(k):
            yield i * n // k, (i + 1) * n // k

    def _run(self, start: int, stop: int, x: Tensor) -> Tensor:
        for i in range(start, stop):
            x = self[i](x)
        return x

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            return super().forward(x)
        for start, stop in self._bounds():
            x = checkpoint(self._run, start, stop, x, use_reentrant=False)
        return x


def _is_stage(module: nn.Module) -> bool:
    return (isinstance(module, nn.Sequential) and len(module) > 0
            and all(isinstance(block, ResidualBlock) for block in module))


def checkpointed_stages(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    """The stages of ``model`` that checkpointing applies to: ``nn.Sequential`` s of residual blocks."""
    return [(name, mod) for name, mod in model.named_modules() if _is_stage(mod)]


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def enable_checkpointing(model: nn.Module, segments: int) -> nn.Module:
    """Checkpoint ``model``'s residual stages in about ``segments`` segments in all; returns ``model``.

    Segments are shared among the stages in proportion to their numbers of blocks (at least one each,
    at most one per block). ``segments`` near the square root of the number of blocks keeps the least
    memory; more segments recompute less per backward step but keep more segment inputs. Calling it
    again re-segments. A model with no ``nn.Sequential`` of residual blocks (blocks that declare
    ``residual_branches()``) is an error, as is a root module that is itself such a stage.
    """
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be a whole number >= 1 (about sqrt(number of blocks) uses the least "
                         f"memory), got {segments!r}; to turn checkpointing off call disable_checkpointing(model)")
    stages = checkpointed_stages(model)
    if not stages:
        raise ValueError(f"{type(model).__name__} has no nn.Sequential of residual blocks to checkpoint; "
                         "checkpointing works on models whose stages are nn.Sequential containers of blocks "
                         "that declare residual_branches() (fixup.branch)")
    if any(name == "" for name, _ in stages):
        raise ValueError("the model is itself a stage (an nn.Sequential of blocks); wrap it in a module first")
    total = sum(len(stage) for _, stage in stages)
    for name, stage in stages:
        share = max(1, round(segments * len(stage) / total))
        _replace(model, name, CheckpointedSequential(share, *stage))
    return model


def disable_checkpointing(model: nn.Module) -> nn.Module:
    """Turn checkpointed stages back into plain ``nn.Sequential`` s (same children); returns ``model``."""
    for name, stage in [(n, m) for n, m in model.named_modules() if isinstance(m, CheckpointedSequential)]:
        _replace(model, name, nn.Sequential(*stage))
    return model
