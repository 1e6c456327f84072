"""Each normalisation of a recorded copy planned (exact, fitted or refused) and replaced, in execution order."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .._adapt import _vocab as V
from .._adapt import in_mode
from .._adapt._graph import Analysis, analyse
from .._adapt._modules import FusedNormTail
from .._adapt._record import FUSED, Recording, record
from .._adapt._rewrite import Rewriter
from . import _norms
from ._fold import affine_of, fold_into, frozen_affine, is_frozen_batchnorm, plan_batchnorm
from ._report import ConvertError, ConvertWarning, NormFate, SharedNormWarning, StatisticsWarning

__all__ = ["Conversion", "NormPlan", "plan_norms", "record_copy", "replace_norms"]

# A normalisation module by its class name (RMSNorm, T5LayerNorm, FrozenBatchNorm2d), not Normalize or ConvNormAct.
_NORM_NAME = re.compile(r"Norm(\d[dD])?$")


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


@dataclass
class Conversion:
    """The deep copy being converted, its recording on the example input, and what the steps read from it."""

    model: nn.Module  # converted in place
    modes: dict[nn.Module, bool]  # each module's train/eval mode before conversion
    swapped: list[str]  # PyTorch Transformer modules moved to their non-fast path (they read the norms)
    rec: Recording
    modules: dict[str, nn.Module]
    nonlinearities: list[str]  # before conversion: none may be lost
    analysis: Analysis
    aliases: dict[int, list[str]]  # id(module) -> every path it is registered at
    tied: set[str]


@dataclass
class NormPlan:
    """What each normalisation becomes."""

    nodes: dict[str, Any]  # path -> its first node in the recording
    tails: dict[str, Any]  # path -> the fused tail computed after it (None: none)
    batchnorms: dict[str, nn.Module]  # folded or turned into an affine, exactly
    per_example: dict[str, tuple[int, int]]  # path -> (channels, their dimension): fitted replacements
    frozen: dict[str, nn.Module]  # frozen BatchNorms, computed op by op: swapped whole


def record_copy(model: nn.Module, args: tuple[Tensor, ...],
                leaf_modules: tuple[type[nn.Module], ...]) -> Conversion:
    """A deep copy of ``model`` (on the non-fast path where PyTorch's Transformer modules read the norms),
    recorded on ``args`` in eval mode and analysed."""
    source = copy.deepcopy(model)
    modes = {m: m.training for m in source.modules()}
    swapped = V.slow_path_(source)
    rec = in_mode(source, False, lambda: record(source, args, leaf_modules))
    modules = dict(source.named_modules())
    nonlinearities = rec.nonlinearities(modules)
    return Conversion(source, modes, swapped, rec, modules, nonlinearities, analyse(rec.graph, modules),
                      _aliases(source), _tied(source))


def _unknown_norms(job: Conversion, nodes: dict[str, Any], frozen: dict[str, nn.Module]) -> list[str]:
    """Why convert refuses the normalisations it cannot replace at all: computed by a function, or of a type it does
    not know."""
    refused = [f"{n.name}: a normalisation computed by a function ({V._name(n)}), which cannot be replaced; use the "
               "module form (nn.LayerNorm, nn.BatchNorm2d, ...)" for n in job.rec.graph.nodes if V.functional_norm(n)]
    handled = {id(job.modules[p]) for p in nodes}
    for path, mod in job.modules.items():
        if job.rec.calls.get(path) and _NORM_NAME.search(type(mod).__name__) and path not in frozen and \
                not any(id(m) in handled for m in mod.modules()):
            refused.append(f"{path} ({type(mod).__name__}): a normalisation convert does not know; it would stay in "
                           "the model. Replace it with nn.LayerNorm/nn.GroupNorm or pass it in leaf_modules")
    return refused


def _has_running_statistics(mod: nn.Module) -> bool:
    return isinstance(mod, nn.modules.batchnorm._BatchNorm) or \
        (isinstance(mod, nn.modules.instancenorm._InstanceNorm) and mod.track_running_stats)


def plan_norms(job: Conversion, per_example_norms: str, name: str) -> NormPlan:
    """Sort every normalisation into exact (running statistics) and fitted (per-example); raise a
    :class:`ConvertError` listing every one that cannot be kept."""
    nodes: dict[str, Any] = {}
    for n in job.rec.graph.nodes:
        if V.is_norm(n, job.modules):
            nodes.setdefault(str(n.target), n)
    frozen = {p: m for p, m in job.modules.items() if job.rec.calls.get(p) and is_frozen_batchnorm(m)}
    refused = _unknown_norms(job, nodes, frozen)
    probe = Rewriter(job.model, job.rec.graph, job.analysis, job.rec.calls)  # its _fused_tail reads the recording
    tails = {p: probe._fused_tail(n, p, job.modules[p]) if n.meta.get(FUSED) else None for p, n in nodes.items()}
    plan = NormPlan(nodes, tails, {}, {}, frozen)
    for path, n in nodes.items():
        mod = job.modules[path]
        if _has_running_statistics(mod):
            if getattr(mod, "running_mean", None) is None:
                refused.append(f"{path} ({type(mod).__name__}) has no running statistics (track_running_stats="
                               "False): even in eval mode it normalises by each batch's statistics, which no fixed "
                               "layer computes. Estimate them first: set track_running_stats=True, momentum=None, "
                               "register running_mean/running_var/num_batches_tracked, run your data through it "
                               "in train mode, then convert")
                continue
            plan.batchnorms[path] = mod
            continue
        shape = _norms.layout(mod, n, path, tails[path])
        if isinstance(shape, str):
            refused.append(f"{path} ({type(mod).__name__}): {shape}")
        elif per_example_norms == "refuse":
            refused.append(f"{path} ({type(mod).__name__}) normalises each example by its own statistics, which "
                           "no fixed layer computes; pass per_example_norms='affine' (a per-channel affine "
                           "fitted on calibration data) or 'dyt' (Dynamic Tanh), and read the change each "
                           "causes in the report")
        else:
            plan.per_example[path] = shape
    if refused:
        raise ConvertError(f"fixup.convert cannot keep the function of {name}:\n  - " + "\n  - ".join(refused))
    return plan


def _exact_replacement(job: Conversion, plan: NormPlan, path: str, dims: dict[str, int]) -> tuple[nn.Module, NormFate]:
    """A BatchNorm (or InstanceNorm with running statistics) folded into the layer before it, or its affine."""
    mod, calls = job.modules[path], job.rec.calls.get(path, 0)
    tail = plan.tails[path]
    fold = plan_batchnorm(plan.nodes[path], job.modules, job.rec.calls, job.aliases[id(mod)], dims.get(path, 0),
                         job.tied)
    if fold.into:
        fold_into(job.modules[fold.into], mod)
        new: nn.Module = nn.Identity() if tail is None else FusedNormTail(tail, type(mod).__name__)
        return new, NormFate(path, type(mod).__name__, "folded", fold.why, fold.into, True, 0.0, calls)
    return affine_of(mod, tail), NormFate(path, type(mod).__name__, "affine", fold.why, "", True, 0.0, calls)


def _fitted_replacement(job: Conversion, plan: NormPlan, path: str, per_example_norms: str, sequential: bool,
                        batches: list[tuple[Tensor, ...]], seen: dict[str, list[Tensor]],
                        wanted: dict[str, list[Tensor]], replay: bool) -> tuple[nn.Module, NormFate]:
    """A per-example norm replaced by an affine or Dynamic Tanh fitted to its outputs (unfitted when replaying a
    saved conversion, whose weights are loaded after)."""
    mod = job.modules[path]
    if replay:
        new, change = _norms.unfitted(mod, per_example_norms, *plan.per_example[path]), float("nan")
    else:
        if sequential:  # what it receives now that the norms before it are replaced
            seen[path] = _gather(job.model, batches, {path: mod}, {path})[1][path]
        new, change = _norms.fit(mod, per_example_norms, seen[path], *plan.per_example[path], wanted[path])
    what = "a per-channel affine fitted" if per_example_norms == "affine" else "Dynamic Tanh, alpha fitted"
    on = "the inputs of the model converted so far" if sequential else "the original model's inputs"
    return new, NormFate(path, type(mod).__name__, per_example_norms, f"{what} on calibration data "
                         f"({len(seen.get(path, []))} calls; {on})", "", False, change, job.rec.calls.get(path, 0))


def _shared_warning(job: Conversion, path: str) -> tuple[str, type[ConvertWarning]] | None:
    mod, calls = job.modules[path], job.rec.calls.get(path, 0)
    names = job.aliases[id(mod)]
    if len(names) == 1 and calls <= 1:
        return None
    return (f"{type(mod).__name__} {path} is called {calls} times" +
            (f" and registered as {', '.join(names)}" if len(names) > 1 else "") +
            "; it becomes one module that serves every call (its function is kept)", SharedNormWarning)


def replace_norms(job: Conversion, plan: NormPlan, args: tuple[Tensor, ...], batches: list[tuple[Tensor, ...]],
                   per_example_norms: str, sequential: bool, replay: bool,
                   warned: list[tuple[str, type[ConvertWarning]]]) -> list[NormFate]:
    """Replace every normalisation in the copy, in execution order; returns what became of each and adds to
    ``warned`` the norms that serve several calls and the BatchNorms that look untrained."""
    # what the norms receive: dimensions (all), inputs (per-example norms, on calibration data)
    dims, _, _ = _gather(job.model, [args], {p: job.modules[p] for p in plan.nodes}, set())
    seen: dict[str, list[Tensor]] = {}
    wanted: dict[str, list[Tensor]] = {}  # the original norms' outputs: what each replacement is fitted to
    if plan.per_example and not replay:
        _, seen, wanted = _gather(job.model, batches, {p: job.modules[p] for p in plan.per_example},
                                  set(plan.per_example))
    fates: list[NormFate] = []
    stale: list[str] = []
    for path in plan.nodes:
        mod = job.modules[path]
        shared = _shared_warning(job, path)
        if shared is not None:
            warned.append(shared)
        if path in plan.batchnorms:
            if bool((mod.running_mean == 0).all() and (mod.running_var == 1).all()):
                stale.append(path)
            new, fate = _exact_replacement(job, plan, path, dims)
        else:
            new, fate = _fitted_replacement(job, plan, path, per_example_norms, sequential, batches, seen, wanted,
                                            replay)
        fates.append(fate)
        for alias in job.aliases[id(mod)]:
            _set(job.model, alias, new)
    for path, mod in plan.frozen.items():  # computed op by op, so not a node of the recording: swapped whole
        for alias in job.aliases[id(mod)]:
            _set(job.model, alias, frozen_affine(mod))
        fates.append(NormFate(path, type(mod).__name__, "affine", "a frozen BatchNorm: its fixed affine, kept frozen "
                              "(requires_grad=False)", "", True, 0.0, job.rec.calls.get(path, 0)))
    if stale and not replay:
        warned.append((f"{len(stale)} BatchNorm(s) ({', '.join(stale[:3])}) hold their initial running statistics "
                       "(mean 0, variance 1): the model looks untrained, or its statistics were not loaded",
                       StatisticsWarning))
    return fates
