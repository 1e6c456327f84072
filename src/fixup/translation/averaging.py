"""Checkpoint averaging: the element-wise mean of the last N checkpoints' parameters.

The paper's translation models come from fairseq, whose IWSLT/WMT recipes evaluate the average of
the last checkpoints (``scripts/average_checkpoints.py``). Floating-point entries are averaged;
integer buffers are taken from the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["average_checkpoints", "average_state_dicts", "model_state"]


def model_state(checkpoint: Mapping) -> Mapping[str, Tensor]:
    """The model's state dict inside a checkpoint: its ``"model"`` entry, or the mapping itself."""
    state = checkpoint.get("model", checkpoint)
    if isinstance(state, Mapping) and state is checkpoint:  # a bare state dict: leave out fixup's own entries
        state = {k: v for k, v in state.items() if k not in ("format", "sha256")}
    if not isinstance(state, Mapping) or not state or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError("checkpoint holds no model state dict (a mapping of tensors, itself or under "
                         "'model')")
    return state


def average_state_dicts(states: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The mean of several state dicts of one model."""
    if not states:
        raise ValueError("nothing to average: give at least one state dict")
    keys = list(states[-1])
    for i, state in enumerate(states):
        if list(state) != keys:
            missing = sorted(set(keys) ^ set(state))[:5]
            raise ValueError(f"state dict {i} does not have the same entries as the last one (differ: "
                             f"{missing}); average checkpoints of the same model only")
    out: dict[str, Tensor] = {}
    for key in keys:
        last = states[-1][key]
        if last.is_floating_point():
            out[key] = (torch.stack([s[key].double() for s in states]).mean(0)).to(last.dtype)
        else:
            out[key] = last.clone()
    return out


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Tensor]:
    """Load the checkpoint files ``paths`` (on the CPU) and average their model states.

    Each file is read with ``torch.load(weights_only=True)`` (tensors and plain containers only: a file
    carrying pickled code is refused, never run) and checked against its digest when it has one.
    """
    from ..train.checkpoint import read_state

    states = [model_state(read_state(p, map_location="cpu")) for p in paths]
    return average_state_dicts(states)
