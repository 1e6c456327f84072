"""The conversion pipeline: record, replace the norms (:mod:`._replace`), add the scalars, check (the package
docstring says what it makes)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._adapt import ADAPT_METHODS, as_inputs, in_mode
from .._adapt._record import flatten_tensors, record
from .._adapt._rewrite import Rewriter
from ..branch import Branch, find_branches
from ..method import METHODS
from ..nn import Gate
from ._norms import PER_EXAMPLE_OPTIONS
from ._replace import Conversion, plan_norms, record_copy, replace_norms
from ._report import ConvertError, ConvertReport, ConvertWarning, NormFate, TrainModeWarning

# The methods of adapt whose scalars convert inserts at identity on each branch (Fixup's, or a gate); DyT changes the
# norms instead, which convert does by per_example_norms="dyt".
BRANCH_METHODS = tuple(m for m in ADAPT_METHODS if METHODS[m].adapt in ("fixup", "gate"))

__all__ = ["TOLERANCE", "convert"]

TOLERANCE = 1e-5  # an exact conversion's largest output change, x the output's RMS (float32 rounding: ~1e-7/layer)


def _held_out(args: tuple[Tensor, ...], seed: int = 1) -> tuple[Tensor, ...]:
    """Inputs like the example (same shapes and dtypes) drawn afresh: floats with its mean and std, integers
    (token ids) uniform over its range."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in args:
        if t.is_floating_point():
            mean, std = float(t.double().mean()), float(t.double().std()) if t.numel() > 1 else 1.0
            out.append((torch.randn(t.shape, generator=g, dtype=torch.float64) * (std or 1.0) + mean)
                       .to(t.dtype).to(t.device))
        else:
            lo, hi = int(t.min()), int(t.max())
            out.append(torch.randint(lo, hi + 1, t.shape, generator=g, dtype=t.dtype).to(t.device))
    return tuple(out)


def compare(original: nn.Module, converted: nn.Module, args: tuple[Tensor, ...]) -> tuple[float, float]:
    """(largest, RMS) absolute difference of the floating outputs in eval mode, each over the original output's
    RMS (the worst output where there are several)."""
    with torch.no_grad():
        a = [t for t in flatten_tensors(in_mode(original, False, lambda: original(*args))) if t.is_floating_point()]
        b = [t for t in flatten_tensors(in_mode(converted, False, lambda: converted(*args))) if t.is_floating_point()]
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ConvertError(f"the converted {type(converted).__name__} returns outputs of other shapes than the "
                           "original's; please report this model")
    worst, rms = 0.0, 0.0
    for x, y in zip(a, b):
        scale = float(x.double().pow(2).mean().sqrt()) or 1.0
        d = (y.double() - x.double()).abs()
        worst = max(worst, float(d.max()) / scale if d.numel() else 0.0)
        rms = max(rms, float(d.pow(2).mean().sqrt()) / scale if d.numel() else 0.0)
    return worst, rms


def _spec_inputs(args: tuple[Tensor, ...]) -> list[dict[str, Any]]:
    return [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in args]


def _check_options(method: str, per_example_norms: str) -> None:
    if method not in BRANCH_METHODS:
        dyt = ("; Dynamic Tanh in place of LayerNorm is per_example_norms='dyt' (alpha fitted to the trained layer)"
               if method in ADAPT_METHODS else "")
        raise ValueError(f"method must be one of {BRANCH_METHODS}, got {method!r}{dyt}")
    if per_example_norms not in PER_EXAMPLE_OPTIONS:
        raise ValueError(f"per_example_norms must be one of {PER_EXAMPLE_OPTIONS}, got {per_example_norms!r}")


def _add_scalars(job: Conversion, method: str, name: str) -> tuple[list[str], list[str]]:
    """Declare the branches and add the method's scalars at their identity values; returns (the scalars added,
    notes for the report)."""
    gated = METHODS[method].adapt == "gate"  # the method's form, as adapt applies it (Method.adapt)
    own_gates = {id(m) for m in job.model.modules() if isinstance(m, Gate)}  # the model's own keep their values
    rw = Rewriter(job.model, job.rec.graph, job.analysis, job.rec.calls)
    declared: dict[str, list[Branch]] = {}
    for r in job.analysis.residuals:
        container, branch = rw.branch(r, gated=gated)
        declared.setdefault(container, []).append(branch)
    classifier = rw.classifier(job.analysis.classifier, bias=not gated)
    rw.declare(declared, classifier)
    with torch.no_grad():
        for m in job.model.modules():
            if isinstance(m, Gate) and id(m) not in own_gates:
                m.scale.fill_(1.0)  # the identity value: the branch passes as trained (adapt's gates start at 0)
    notes = [*job.analysis.notes, *rw.notes, *(str(p) for p in job.analysis.problems)]
    if job.analysis.problems:
        notes.append("the residual sums above get no scalars; every normalisation was still converted")
    if not job.analysis.residuals:
        notes.append(f"no residual sum with a weight layer found in {name}: no scalars added, only normalisation "
                     "converted")
    if job.swapped:
        notes.append(f"PyTorch Transformer modules ({', '.join(job.swapped[:3])}) run their documented non-fast-path "
                     "computation (a subclass of the same module), as the fused fast path reads the norms")
    return list(rw.added), notes


def _restore_modes(job: Conversion) -> None:
    for m in job.model.modules():  # the modes it had; the modules convert put in, the root's
        m.train(job.modes.get(m, job.modes[job.model]))


def _check_nonlinearities(job: Conversion, args: tuple[Tensor, ...], leaf_modules: tuple[type[nn.Module], ...],
                          name: str) -> None:
    source = job.model
    after = in_mode(source, False, lambda: record(source, args, leaf_modules))
    kept = after.nonlinearities(dict(source.named_modules()))
    if len(kept) < len(job.nonlinearities):
        raise ConvertError(f"converting {name} would lose {len(job.nonlinearities) - len(kept)} of its "
                           f"{len(job.nonlinearities)} non-linearities; it is not returned. Please report this model.")


def _check_held_out(model: nn.Module, converted: nn.Module, report: ConvertReport, args: tuple[Tensor, ...],
                    held_out: Tensor | Sequence[Tensor] | None, fates: list[NormFate], tolerance: float,
                    name: str) -> None:
    """Measure the change of the outputs on held-out inputs into ``report``; raise where every conversion was
    exact and the change exceeds ``tolerance``."""
    check = as_inputs(held_out) if held_out is not None else _held_out(args)
    report.held_out = ("the given held-out inputs" if held_out is not None else
                       "fresh inputs like the example (seed 1): " + ", ".join(
                           "x".join(map(str, t.shape)) + f" {str(t.dtype).removeprefix('torch.')}" for t in check))
    report.max_change, report.rms_change = compare(model, converted, check)
    if all(f.exact for f in fates) and report.max_change > tolerance:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        why = (f"its weights are {str(dtype).removeprefix('torch.')}, and folding rounds each to that precision "
               f"(about {torch.finfo(dtype).eps:.0e}): convert the float32 model and cast it after, or pass a "
               "tolerance" if torch.finfo(dtype).bits < 32 else "Please report this model")
        raise ConvertError(f"the converted {name} differs from the original by {report.max_change:.3g} x the "
                           f"output's RMS on held-out inputs (tolerance {tolerance:g}), though every conversion "
                           f"was exact; it is not returned. {why}")


def convert(
    model: nn.Module,
    example_input: Tensor | Sequence[Tensor],
    *,
    method: str = "fixup",
    per_example_norms: str = "refuse",
    calibration: Sequence[Tensor | Sequence[Tensor]] | None = None,
    held_out: Tensor | Sequence[Tensor] | None = None,
    sequential: bool = True,
    tolerance: float = TOLERANCE,
    leaf_modules: tuple[type[nn.Module], ...] = (),
    _replay: bool = False,
) -> tuple[nn.Module, ConvertReport]:
    """Return a copy of trained ``model`` (same class) without normalisation that computes the same function,
    with Fixup's scalars (or gates) at their identity values, and the :class:`ConvertReport`.

    Args:
        model: a trained ``nn.Module``; not modified. Its eval-mode function is kept (BatchNorm's running
            statistics); a model in train mode is a :class:`TrainModeWarning` (the copy keeps its modes).
        example_input: a tensor or a tuple of the forward's positional tensors, to record the computation.
        method: ``"fixup"`` (a Scale at 1 and Biases at 0 per branch), or ``"skipinit"``/``"rezero"`` (a Gate
            at 1 per branch; no biases).
        per_example_norms: what becomes of LayerNorm/GroupNorm (and InstanceNorm without running statistics):
            ``"refuse"`` (default: a :class:`ConvertError` that names them and the options), ``"affine"`` (a
            per-channel affine fitted on calibration data) or ``"dyt"`` (Dynamic Tanh, alpha fitted). Their
            change is measured and reported; the model then no longer computes exactly the same function.
        calibration: batches of inputs (each a tensor or a tuple of the forward's positional tensors, not
            ``(input, label)`` pairs) the per-example norms are fitted on;
            ``None`` fits on ``example_input`` alone. Pass real data: the fit is only as good as it.
        sequential: fit each per-example norm, in execution order, on what it receives in the model converted so
            far, to the original norm's outputs, so that it makes up for the change of the norms before it;
            ``False``: each on the original model's inputs, alone.
        held_out: inputs for the final check (default: drawn afresh like ``example_input``, another seed).
        tolerance: an exact conversion (BatchNorm only) whose outputs move by more than this, times the output's
            RMS, is a :class:`ConvertError` (float32 rounding is about 1e-7 per layer).
        leaf_modules: module types to record whole, as for :func:`fixup.adapt`.

    Raises:
        ConvertError: a BatchNorm without running statistics, a per-example norm with ``per_example_norms=
            "refuse"`` or one no option applies to, a normalisation computed by a function or of an unknown type,
            an exact conversion whose outputs differ.
    """
    _check_options(method, per_example_norms)
    args = as_inputs(example_input)
    name = type(model).__name__
    warned: list[tuple[str, type[ConvertWarning]]] = []
    if model.training and not _replay:
        warned.append((f"{name} is in train mode; convert keeps its eval-mode function (BatchNorm's running "
                       "statistics), not train mode's batch statistics. Call model.eval() first to silence this",
                       TrainModeWarning))
    job = record_copy(model, args, leaf_modules)
    plan = plan_norms(job, per_example_norms, name)
    batches = [as_inputs(b) for b in calibration] if calibration is not None else [args]
    fates = replace_norms(job, plan, args, batches, per_example_norms, sequential, _replay, warned)
    added, notes = _add_scalars(job, method, name)
    _restore_modes(job)
    _check_nonlinearities(job, args, leaf_modules, name)
    report = ConvertReport(
        model=name, method=method, per_example_norms=per_example_norms, norms=fates, scalars_added=added,
        branches=[n for n, _ in find_branches(job.model)], classifier=[str(n.target) for n in job.analysis.classifier],
        tolerance=tolerance, warnings=[w for w, _ in warned], notes=notes,
        spec={"format": 1, "method": method, "per_example_norms": per_example_norms,
              "inputs": _spec_inputs(args), "leaf_modules": [t.__qualname__ for t in leaf_modules]})
    if not _replay:
        _check_held_out(model, job.model, report, args, held_out, fates, tolerance, name)
        for message, category in warned:
            warnings.warn(message, category, stacklevel=2)
    return job.model, report
