"""LSUV: layer-sequential unit-variance initialisation (Mishkin & Matas, "All you need is a good init", ICLR 2016).

Algorithm 1 of that paper: pre-initialise every convolution and linear layer with an orthonormal matrix
(Saxe et al. 2014); then, from the first layer to the last, run a batch forward, measure the variance of
the layer's output B_L and divide its weights by sqrt(Var(B_L)), until |Var(B_L) - 1| < Tol_var or
T_max passes were made. Fixup's depth study (section 4.1) uses it as a baseline. A model built for it is
drawn orthonormal by :func:`initialise_` and finished on its first training batch by :func:`data_init_`.

Layers are visited in the order the forward pass executes them (found with forward hooks, not from
module order). Because a layer's input depends only on layers executed before it, all of them are
calibrated in a *single* forward pass: each layer's hook rescales its weights, recomputes its output
and hands the rescaled output on. This is the same procedure as re-running the network up to each
layer, at the cost of one pass instead of one per layer, which matters at 10,000 layers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..branch import WEIGHT_LAYERS
from ..groups import unwrap
from ..method import Method
from ..report import InitReport, LSUVRecord, warn_report
from ._layers import named_weight_layers, record, reset_norms_and_scalars
from ._skeleton import plain_report
from .fans import groups_of, orthonormal_

__all__ = ["data_init_", "initialise_", "lsuv_", "orthonormal_init_"]


@torch.no_grad()
def lsuv_(model: nn.Module, batch: Tensor, *, tol: float = 0.1, max_iter: int = 10, orthonormal: bool = True,
          generator: torch.Generator | None = None) -> list[LSUVRecord]:
    """Apply LSUV to ``model`` in place on ``batch`` (model inputs); return one record per layer, in execution order.

    Args:
        model: the network; every ``nn.Linear`` / ``nn.Conv*`` it runs is calibrated.
        batch: a batch of inputs, as the model's forward takes them.
        tol: Tol_var of Algorithm 1: stop once ``|Var(output) - 1| < tol``.
        max_iter: T_max of Algorithm 1: at most this many rescalings per layer.
        orthonormal: draw orthonormal weights first (step 1). Pass ``False`` when the model already
            holds them (a model built with ``init="lsuv"`` does).
        generator: random generator for the orthonormal draw.

    The model runs in eval mode (dropout off) during calibration and is returned to its mode. A layer
    whose output variance is zero or not finite cannot be rescaled; its record says it did not converge.
    A layer executed twice in one forward pass is calibrated on its first call.
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive (the accepted distance of the output variance from 1), got {tol!r}")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"max_iter must be a positive whole number of rescalings, got {max_iter!r}")
    names = {mod: name for name, mod in model.named_modules() if isinstance(mod, WEIGHT_LAYERS)}
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.Linear or nn.Conv* layer for LSUV to calibrate")
    if orthonormal:
        for layer in names:
            orthonormal_(layer.weight, groups_of(layer), generator)
            if layer.bias is not None:
                layer.bias.zero_()
    records: list[LSUVRecord] = []
    done: set[nn.Module] = set()

    def calibrate(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        if module in done:
            return None
        done.add(module)
        var = before = float(output.float().var())
        steps = 0
        while abs(var - 1.0) >= tol and steps < max_iter and math.isfinite(var) and var > 0:
            module.weight.div_(math.sqrt(var))  # W_L = W_L / sqrt(Var(B_L))
            output = module.forward(*args)  # forward() bypasses the hooks
            var = float(output.float().var())
            steps += 1
        records.append(LSUVRecord(names[module], type(module).__name__, list(module.weight.shape), steps,
                                  before, var, abs(var - 1.0) < tol))
        return output

    handles = [layer.register_forward_hook(calibrate) for layer in names]
    was_training = model.training
    model.eval()
    try:
        model(batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return records


@torch.no_grad()
def orthonormal_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> InitReport:
    """Orthonormal weights (Saxe et al. 2014) for every weight layer, biases 0: LSUV's first step."""
    records = []
    for name, mod in named_weight_layers(model):
        groups = groups_of(mod)
        orthonormal_(mod.weight, groups, generator)
        if mod.bias is not None:
            mod.bias.zero_()
        rows, cols = mod.weight.shape[0] // groups, mod.weight[0].numel()
        records.append(record(name, mod, math.sqrt(1.0 / max(rows, cols))))  # orthonormal rows (or columns)
    scalars = reset_norms_and_scalars(model)
    return plain_report(model, "lsuv", "orthonormal (LSUV step 1); LSUV rescaling pending", records, scalars)


def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> InitReport:
    """The initialiser of ``lsuv``: orthonormal weights now, ``report.data_init_pending`` until :func:`data_init_`
    has run on a batch (``base`` is unused)."""
    report = orthonormal_init_(model, generator=generator)
    report.data_init_pending = True
    return report


def data_init_(model: nn.Module, batch: torch.Tensor | tuple | list, **lsuv_kwargs: float) -> list[LSUVRecord]:
    """The data-dependent step of the model's method, run once with the first training batch.

    For a model whose ``init_report`` has ``data_init_pending`` (built with ``init="lsuv"``) this runs
    :func:`lsuv_` on the batch's inputs (``batch`` may be an input tensor or an ``(inputs, targets)`` pair),
    fills the report's data-dependent section and returns the per-layer records; for every other model,
    or a second time, it does nothing and returns ``[]``. Call it before wrapping the model in
    DistributedDataParallel; under ``torch.distributed`` the rescaled weights are broadcast from rank 0 so
    that every process holds the same model.
    """
    target = unwrap(model)
    report = getattr(target, "init_report", None)
    if not (isinstance(report, InitReport) and report.data_init_pending):
        return []
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    records = lsuv_(target, inputs, orthonormal=False, **lsuv_kwargs)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        for _, layer in named_weight_layers(target):
            torch.distributed.broadcast(layer.weight.data, src=0)
    report.data_init_pending = False
    report.data_init = records
    report.scheme = f"orthonormal, then LSUV on a batch of {inputs.shape[0]}"
    layers = dict(named_weight_layers(target))
    for rec in report.other_layers:  # the weights' spread after rescaling
        if rec.name in layers and layers[rec.name].weight.numel() > 1:
            rec.std = float(layers[rec.name].weight.detach().std())
    missed = [f"LSUV: {r.name} did not reach unit output variance ({r.variance:.4g})"
              for r in records if not r.converged]
    report.warnings.extend(missed)
    warn_report(InitReport(method=report.method, warnings=missed))
    return records
