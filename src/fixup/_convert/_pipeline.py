"""The conversion pipeline: record, fold, rewrite, check (the package docstring says what it makes)."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._adapt import ADAPT_METHODS, as_inputs, in_mode
from .._adapt import _vocab as V
from .._adapt._graph import analyse
from .._adapt._modules import FusedNormTail
from .._adapt._record import FUSED, flatten_tensors, record
from .._adapt._rewrite import Rewriter
from ..branch import Branch, find_branches
from ..method import METHODS
from ..nn import Gate
from . import _norms
from ._fold import affine_of, fold_into, frozen_affine, is_frozen_batchnorm, plan_batchnorm
from ._norms import PER_EXAMPLE_OPTIONS
from ._report import (
    ConvertError,
    ConvertReport,
    ConvertWarning,
    NormFate,
    SharedNormWarning,
    StatisticsWarning,
    TrainModeWarning,
)

__all__ = ["TOLERANCE", "convert"]

# A normalisation module by its class name (RMSNorm, T5LayerNorm, FrozenBatchNorm2d), not Normalize or ConvNormAct.
_NORM_NAME = re.compile(r"Norm(\d[dD])?$")
TOLERANCE = 1e-5  # an exact conversion's largest output change, x the output's RMS (float32 rounding: ~1e-7/layer)


def _set(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def _aliases(model: nn.Module) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        out.setdefault(id(m), []).append(name)
    return out


def _tied(model: nn.Module) -> set[str]:
    """Paths of modules one of whose own parameters another module holds too."""
    owners: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), []).append(name)
    return {n for names in owners.values() if len(set(names)) > 1 for n in names}


def _gather(model: nn.Module, batches: list[tuple[Tensor, ...]], targets: dict[str, nn.Module],
            keep: set[str]) -> tuple[dict[str, int], dict[str, list[Tensor]], dict[str, list[Tensor]]]:
    """Run ``model`` in eval mode on each batch; per target module, its input's dimensions and (for ``keep``) every
    input it received and every output it gave, call by call."""
    dims: dict[str, int] = {}
    seen: dict[str, list[Tensor]] = {p: [] for p in keep}
    gave: dict[str, list[Tensor]] = {p: [] for p in keep}

    def pre(path: str) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            if args and isinstance(args[0], Tensor):
                dims.setdefault(path, args[0].dim())
                if path in seen:
                    seen[path].append(args[0].detach().clone())
        return hook

    def post(path: str) -> Any:
        def hook(_m: nn.Module, _args: tuple[Any, ...], out: Any) -> None:
            if isinstance(out, Tensor):
                gave[path].append(out.detach().clone())
        return hook

    handles = [m.register_forward_pre_hook(pre(p)) for p, m in targets.items()]
    handles += [targets[p].register_forward_hook(post(p)) for p in keep]
    try:
        with torch.no_grad():
            for batch in batches:
                in_mode(model, False, lambda b=batch: model(*b))
    finally:
        for h in handles:
            h.remove()
    return dims, seen, gave


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
    if method not in ADAPT_METHODS:
        raise ValueError(f"method must be one of {ADAPT_METHODS}, got {method!r}")
    if per_example_norms not in PER_EXAMPLE_OPTIONS:
        raise ValueError(f"per_example_norms must be one of {PER_EXAMPLE_OPTIONS}, got {per_example_norms!r}")
    args = as_inputs(example_input)
    name = type(model).__name__
    warned: list[tuple[str, type[ConvertWarning]]] = []
    if model.training and not _replay:
        warned.append((f"{name} is in train mode; convert keeps its eval-mode function (BatchNorm's running "
                       "statistics), not train mode's batch statistics. Call model.eval() first to silence this",
                       TrainModeWarning))
    source = copy.deepcopy(model)
    modes = {m: m.training for m in source.modules()}
    swapped = V.slow_path_(source)
    rec = in_mode(source, False, lambda: record(source, args, leaf_modules))
    modules = dict(source.named_modules())
    nonlinear_before = rec.nonlinearities(modules)
    analysis = analyse(rec.graph, modules)
    aliases, tied = _aliases(source), _tied(source)

    # --- what each normalisation becomes ---
    refused: list[str] = []
    for n in rec.graph.nodes:
        if V.functional_norm(n):
            refused.append(f"{n.name}: a normalisation computed by a function ({V._name(n)}), which cannot be "
                           "replaced; use the module form (nn.LayerNorm, nn.BatchNorm2d, ...)")
    norm_nodes: dict[str, Any] = {}
    for n in rec.graph.nodes:
        if V.is_norm(n, modules):
            norm_nodes.setdefault(str(n.target), n)
    handled = {id(modules[p]) for p in norm_nodes}
    frozen = {p: m for p, m in modules.items() if rec.calls.get(p) and is_frozen_batchnorm(m)}
    for path, mod in modules.items():
        if rec.calls.get(path) and _NORM_NAME.search(type(mod).__name__) and path not in frozen and \
                not any(id(m) in handled for m in mod.modules()):
            refused.append(f"{path} ({type(mod).__name__}): a normalisation convert does not know; it would stay in "
                           "the model. Replace it with nn.LayerNorm/nn.GroupNorm or pass it in leaf_modules")
    batchnorms: dict[str, nn.Module] = {}
    per_example: dict[str, tuple[int, int]] = {}  # path -> (channels, their dimension)
    probe = Rewriter(source, rec.graph, analysis, rec.calls)  # its _fused_tail reads the recording as it stands
    tails = {p: probe._fused_tail(n, p, modules[p]) if n.meta.get(FUSED) else None for p, n in norm_nodes.items()}
    for path, n in norm_nodes.items():
        mod = modules[path]
        stats = isinstance(mod, nn.modules.batchnorm._BatchNorm) or \
            (isinstance(mod, nn.modules.instancenorm._InstanceNorm) and mod.track_running_stats)
        if stats:
            if getattr(mod, "running_mean", None) is None:
                refused.append(f"{path} ({type(mod).__name__}) has no running statistics (track_running_stats="
                               "False): even in eval mode it normalises by each batch's statistics, which no fixed "
                               "layer computes. Estimate them first: set track_running_stats=True, momentum=None, "
                               "register running_mean/running_var/num_batches_tracked, run your data through it "
                               "in train mode, then convert")
                continue
            batchnorms[path] = mod
        else:
            shape = _norms.layout(mod, n, path, tails[path])
            if isinstance(shape, str):
                refused.append(f"{path} ({type(mod).__name__}): {shape}")
            elif per_example_norms == "refuse":
                refused.append(f"{path} ({type(mod).__name__}) normalises each example by its own statistics, which "
                               "no fixed layer computes; pass per_example_norms='affine' (a per-channel affine "
                               "fitted on calibration data) or 'dyt' (Dynamic Tanh), and read the change each "
                               "causes in the report")
            else:
                per_example[path] = shape
    if refused:
        raise ConvertError(f"fixup.convert cannot keep the function of {name}:\n  - " + "\n  - ".join(refused))

    # --- record what the norms receive: dimensions (all), inputs (per-example norms, on calibration data) ---
    batches = [as_inputs(b) for b in calibration] if calibration is not None else [args]
    dims, _, _ = _gather(source, [args], {p: modules[p] for p in norm_nodes}, set())
    seen: dict[str, list[Tensor]] = {}
    wanted: dict[str, list[Tensor]] = {}  # the original norms' outputs: what each replacement is fitted to
    if per_example and not _replay:
        _, seen, wanted = _gather(source, batches, {p: modules[p] for p in per_example}, set(per_example))

    # --- replace ---
    fates: list[NormFate] = []
    stale: list[str] = []
    for path, n in norm_nodes.items():
        mod = modules[path]
        names = aliases[id(mod)]
        calls = rec.calls.get(path, 0)
        if len(names) > 1 or calls > 1:
            warned.append((f"{type(mod).__name__} {path} is called {calls} times" +
                           (f" and registered as {', '.join(names)}" if len(names) > 1 else "") +
                           "; it becomes one module that serves every call (its function is kept)", SharedNormWarning))
        tail = tails[path]
        if path in batchnorms:
            if bool((mod.running_mean == 0).all() and (mod.running_var == 1).all()):
                stale.append(path)
            plan = plan_batchnorm(n, modules, rec.calls, names, dims.get(path, 0), tied)
            if plan.into:
                fold_into(modules[plan.into], mod)
                new: nn.Module = nn.Identity() if tail is None else FusedNormTail(tail, type(mod).__name__)
                fates.append(NormFate(path, type(mod).__name__, "folded", plan.why, plan.into, True, 0.0, calls))
            else:
                new = affine_of(mod, tail)
                fates.append(NormFate(path, type(mod).__name__, "affine", plan.why, "", True, 0.0, calls))
        else:
            if _replay:
                new, change = _norms.unfitted(mod, per_example_norms, *per_example[path]), float("nan")
            else:
                if sequential:  # what it receives now that the norms before it are replaced
                    seen[path] = _gather(source, batches, {path: mod}, {path})[1][path]
                new, change = _norms.fit(mod, per_example_norms, seen[path], *per_example[path], wanted[path])
            what = "a per-channel affine fitted" if per_example_norms == "affine" else "Dynamic Tanh, alpha fitted"
            on = "the inputs of the model converted so far" if sequential else "the original model's inputs"
            fates.append(NormFate(path, type(mod).__name__, per_example_norms, f"{what} on calibration data "
                                  f"({len(seen.get(path, []))} calls; {on})", "", False, change, calls))
        for alias in names:
            _set(source, alias, new)
    for path, mod in frozen.items():  # computed op by op, so not a node of the recording: swapped whole
        for alias in aliases[id(mod)]:
            _set(source, alias, frozen_affine(mod))
        fates.append(NormFate(path, type(mod).__name__, "affine", "a frozen BatchNorm: its fixed affine, kept frozen "
                              "(requires_grad=False)", "", True, 0.0, rec.calls.get(path, 0)))
    if stale and not _replay:
        warned.append((f"{len(stale)} BatchNorm(s) ({', '.join(stale[:3])}) hold their initial running statistics "
                       "(mean 0, variance 1): the model looks untrained, or its statistics were not loaded",
                       StatisticsWarning))

    # --- the method's scalars at identity ---
    gated = METHODS[method].adapt == "gate"  # the method's form, as adapt applies it (Method.adapt)
    own_gates = {id(m) for m in source.modules() if isinstance(m, Gate)}  # the model's own keep their values
    rw = Rewriter(source, rec.graph, analysis, rec.calls)
    declared: dict[str, list[Branch]] = {}
    for r in analysis.residuals:
        container, branch = rw.branch(r, gated=gated)
        declared.setdefault(container, []).append(branch)
    classifier = rw.classifier(analysis.classifier, bias=not gated)
    rw.declare(declared, classifier)
    with torch.no_grad():
        for m in source.modules():
            if isinstance(m, Gate) and id(m) not in own_gates:
                m.scale.fill_(1.0)  # the identity value: the branch passes as trained (adapt's gates start at 0)
    notes = [*analysis.notes, *rw.notes, *(str(p) for p in analysis.problems)]
    if analysis.problems:
        notes.append("the residual sums above get no scalars; every normalisation was still converted")
    if not analysis.residuals:
        notes.append(f"no residual sum with a weight layer found in {name}: no scalars added, only normalisation "
                     "converted")
    if swapped:
        notes.append(f"PyTorch Transformer modules ({', '.join(swapped[:3])}) run their documented non-fast-path "
                     "computation (a subclass of the same module), as the fused fast path reads the norms")
    for m in source.modules():  # the modes it had; the modules convert put in, the root's
        m.train(modes.get(m, modes[source]))

    after = in_mode(source, False, lambda: record(source, args, leaf_modules))
    nonlinear_after = after.nonlinearities(dict(source.named_modules()))
    if len(nonlinear_after) < len(nonlinear_before):
        raise ConvertError(f"converting {name} would lose {len(nonlinear_before) - len(nonlinear_after)} of its "
                           f"{len(nonlinear_before)} non-linearities; it is not returned. Please report this model.")
    branch_names = [n for n, _ in find_branches(source)]
    report = ConvertReport(
        model=name, method=method, per_example_norms=per_example_norms, norms=fates, scalars_added=list(rw.added),
        branches=branch_names, classifier=[str(n.target) for n in analysis.classifier], tolerance=tolerance,
        warnings=[w for w, _ in warned], notes=notes,
        spec={"format": 1, "method": method, "per_example_norms": per_example_norms,
              "inputs": _spec_inputs(args), "leaf_modules": [t.__qualname__ for t in leaf_modules]})
    if not _replay:
        check = as_inputs(held_out) if held_out is not None else _held_out(args)
        report.held_out = ("the given held-out inputs" if held_out is not None else
                           "fresh inputs like the example (seed 1): " + ", ".join(
                               "x".join(map(str, t.shape)) + f" {str(t.dtype).removeprefix('torch.')}" for t in check))
        report.max_change, report.rms_change = compare(model, source, check)
        if all(f.exact for f in fates) and report.max_change > tolerance:
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
            why = (f"its weights are {str(dtype).removeprefix('torch.')}, and folding rounds each to that precision "
                   f"(about {torch.finfo(dtype).eps:.0e}): convert the float32 model and cast it after, or pass a "
                   "tolerance" if torch.finfo(dtype).bits < 32 else "Please report this model")
            raise ConvertError(f"the converted {name} differs from the original by {report.max_change:.3g} x the "
                               f"output's RMS on held-out inputs (tolerance {tolerance:g}), though every conversion "
                               f"was exact; it is not returned. {why}")
        for message, category in warned:
            warnings.warn(message, category, stacklevel=2)
    return source, report

