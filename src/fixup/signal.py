"""Signal propagation at initialisation: the residual stream's RMS, stage by stage.

Without normalisation nothing holds the stream's scale in place but the initialisation. Every weight layer
outside the residual branches (stem, projection shortcuts, downsampling layers, blocks without a skip) and
every non-ReLU activation or gate multiplies the stream by a constant factor, and the factors compound down
the network; the signal-propagation plots of Brock, De & Smith (2021, "Characterizing signal propagation to
close the performance gap in unnormalized ResNets", ICLR) show exactly this. :func:`stream_signal` measures
it on one batch. It sits below both its users: :func:`fixup.adapt` reports the stream of what it built, and the
laboratory (:func:`fixup.lab.signal.compare_signal`) puts a model beside its adapted copy.

*Blocks* are the modules that compute a residual sum (their ``residual_branches()``); a *stage* is a block's
parent module (``layer2.1`` -> ``layer2``), together with the sibling modules of the same type that hold no
residual block (the first, skip-less block of an EfficientNet stage sits in ``blocks.1`` beside
``blocks.2``; ``blocks.0`` holds none). A stage's RMS is that of its module's output; a block's, its own.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SIGNAL_BAND", "SignalRecord", "StreamSignal", "output_rms", "residual_blocks",
           "stage_names", "stream_signal"]

# The band the stream's RMS should stay in, as a multiple of the input's (issue 24's target).
SIGNAL_BAND = (0.5, 2.0)


@dataclass
class SignalRecord:
    """The stream's RMS at the output of one module (a stage or a block), and its ratio to the input's."""

    name: str
    rms: float
    ratio: float


@dataclass
class StreamSignal:
    """The stream at initialisation: the input's RMS, then each stage and each block in execution order."""

    input_rms: float
    stages: list[SignalRecord] = field(default_factory=list)
    blocks: list[SignalRecord] = field(default_factory=list)

    def outside(self, band: tuple[float, float] = SIGNAL_BAND) -> list[SignalRecord]:
        """The stages whose RMS leaves ``band`` times the input's."""
        lo, hi = band
        return [s for s in self.stages if not lo <= s.ratio <= hi]

    def to_dict(self) -> dict[str, Any]:
        return {"input_rms": self.input_rms, "stages": [vars(s) for s in self.stages],
                "blocks": [vars(b) for b in self.blocks]}


def output_rms(t: Any) -> float | None:
    """The RMS of a module's output (its first element if a tuple, ``last_hidden_state`` of a Hugging Face output),
    or ``None`` where it is not a floating-point tensor."""
    t = t[0] if isinstance(t, (tuple, list)) and t else t
    t = getattr(t, "last_hidden_state", t)  # a Hugging Face output object
    if not isinstance(t, Tensor) or not t.is_floating_point() or t.numel() == 0:
        return None
    return float(t.detach().float().pow(2).mean().sqrt())


def residual_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the modules that declare residual branches (the root excluded), in module order."""
    return [n for n, m in model.named_modules() if n and callable(getattr(m, "residual_branches", None))]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def stage_names(model: nn.Module, blocks: Sequence[str]) -> list[str]:
    """The stages of ``model`` given its residual blocks' names (see the module docstring): the blocks' parents,
    and, where those sit in a container (``nn.Sequential``, ``nn.ModuleList``), the container's other children of
    the same type."""
    modules = dict(model.named_modules())
    parents = {_parent(b) for b in blocks if b}
    stages = set(parents)
    for p in parents:
        grand = modules.get(_parent(p)) if p else None
        if p in modules and isinstance(grand, (nn.Sequential, nn.ModuleList)):
            prefix = f"{_parent(p)}." if _parent(p) else ""
            stages |= {prefix + n for n, child in grand.named_children() if type(child) is type(modules[p])}
    return [n for n in modules if n in stages and n]  # module order; the run below keeps those that execute


@torch.no_grad()
def stream_signal(model: nn.Module, example_input: Tensor | Sequence[Tensor], *, blocks: Sequence[str] | None = None,
                  train: bool = True) -> StreamSignal:
    """Measure the stream's RMS at every stage's and block's output on ``example_input``.

    Args:
        model: any module; its residual blocks are those declaring ``residual_branches()`` (the library's
            models and adapted ones) unless ``blocks`` names them.
        example_input: a batch (or a tuple of the forward's tensors). Token ids are not a scale: the ratios of
            such a model are taken to an input RMS of 1.
        blocks: qualified names of the modules that compute residual sums (pass an adapted model's to measure
            the original, normalised one at the same places).
        train: run in train mode (a normalised model's BatchNorm uses the batch's statistics, as in training).
            A train-mode run uses a deep copy, so the model's running statistics are untouched; in eval mode the
            model itself runs (nothing in it changes) and is returned to its modes.
    """
    names = list(blocks) if blocks is not None else residual_blocks(model)
    if not names:
        raise ValueError(f"{type(model).__name__} has no residual block to measure: pass blocks=[...] (module names "
                         "that compute a residual sum), or adapt it first with fixup.adapt(model, example_input)")
    args = (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)
    work = copy.deepcopy(model) if train else model
    modules = dict(work.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(f"blocks {missing[:3]} are not modules of {type(model).__name__}")
    stages = stage_names(work, names)
    seen: dict[str, float] = {}
    order: list[str] = []

    def hook(name: str) -> Any:
        def record(_m: nn.Module, _a: Any, out: Any) -> None:
            rms = output_rms(out)
            if rms is not None and name not in seen:
                seen[name] = rms
                order.append(name)
        return record

    # A stage module that is iterated rather than called (``for layer in self.layers``) runs no hook of its own:
    # its output is then its last child's that ran.
    children = {s: [f"{s}.{c}" for c, _ in modules[s].named_children()] for s in stages}
    watched = dict.fromkeys([*stages, *names, *(c for cs in children.values() for c in cs)])
    handles = [modules[n].register_forward_hook(hook(n)) for n in watched]
    modes = {m: m.training for m in work.modules()}
    try:
        work.train(train)
        work(*args)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.train(mode)
    rank = {n: i for i, n in enumerate(order)}
    for s in stages:
        ran = [c for c in children[s] if c in rank]
        if s not in seen and ran:
            last = max(ran, key=rank.__getitem__)
            seen[s] = seen[last]
            rank[s] = rank[last] + 0.5
    order = sorted(rank, key=rank.__getitem__)
    first = args[0]
    ref = output_rms(first) if first.is_floating_point() else 1.0
    ref = ref or 1.0
    stage_set, block_set = set(stages), set(names)
    return StreamSignal(
        input_rms=ref,
        stages=[SignalRecord(n, seen[n], seen[n] / ref) for n in order if n in stage_set],
        blocks=[SignalRecord(n, seen[n], seen[n] / ref) for n in order if n in block_set],
    )
