"""``fixup.adapt(model, x, method="dyt")``: Dynamic Tanh in place of every LayerNorm of a model written elsewhere.

Zhu, Chen, He, LeCun & Liu ("Transformers without Normalization", CVPR 2025) replace each normalisation layer of a
Transformer, where it stands, by :class:`fixup.nn.DyT` ``gamma * tanh(alpha * x) + beta``, and change nothing else.
The copy adapt returns has a DyT at each LayerNorm's path (``nn.LayerNorm``, its subclasses that normalise one
dimension, such as timm's channels-first ``LayerNorm2d``, and ``nn.RMSNorm``), alpha at the method's alpha0,
gamma and beta the norm's own affine where it has one (a freshly built model's ones and zeros), else 1 and 0.
Which dimension a subclass normalises is read from its output on the example input, never from its name.

alpha0 is one number for every norm, or ``"fitted"``: each DyT starts at the alpha that brings it closest to its
LayerNorm's output on the example input (:func:`fixup.nn.fit_dyt_alpha`, the fit ``fixup.convert`` makes for a
trained norm). A norm whose inputs are small (GPT-2's at its 0.02 draws: about 0.03 RMS) sends ``tanh(0.5 x)``, and
with it the signal, to about 1% of a LayerNorm's output; the fitted alpha gives it the LayerNorm's scale.

Their Limitations report that DyT does not replace BatchNorm (ResNet-50 and VGG19 on ImageNet lose accuracy), and so
did our measurement (:data:`BATCHNORM_MEASURED`): a model with BatchNorm and no LayerNorm is refused; one with both
has its LayerNorms replaced and keeps its BatchNorm, with a :class:`fixup.FixupWarning`.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..method import Method
from ..nn import DyT, fit_dyt_alpha
from ..report import FixupWarning
from . import _vocab as V
from ._graph import AdaptError
from ._options import DYT_FITTED
from ._report import closing_lines
from ._weights import WeightsLoaded, load_original

__all__ = ["BATCHNORM_MEASURED", "DyTAdaptReport", "DyTRecord", "adapt_dyt"]

# benchmarks/dyt_batchnorm.py (results/dyt_batchnorm.json): the library's CIFAR ResNet-20 on digits, the README's
# own-loop recipe, 300 steps, seeds 0 and 1; BatchNorm against DyT in each BatchNorm's place (alpha 0.5).
BATCHNORM_MEASURED = ("ResNet-20 on digits, 300 steps, n=2: 89.9 ± 3.7% test accuracy with DyT in each BatchNorm's "
                      "place against 98.2 ± 0.2% with BatchNorm")
_RMSNORM = getattr(nn, "RMSNorm", None)  # torch >= 2.4


@dataclass
class DyTRecord:
    """One norm replaced: its path, type, channels, the dimension they lie on, and where gamma/beta came from."""

    name: str
    type: str
    channels: int
    dim: int
    gamma: str  # "copied" (the norm's weight) or "ones" (it had none)
    beta: str  # "copied" (the norm's bias) or "zeros" (it had none)
    alpha: float = 0.0  # the DyT's starting alpha
    input_rms: float | None = None  # the RMS of the norm's input on the example input (None: not reached)


@dataclass
class DyTAdaptReport:
    """What ``fixup.adapt(..., method="dyt")`` did: every norm it replaced by a DyT, and what it left."""

    method: str
    alpha: float | str  # alpha0: one number for every norm, or "fitted" (each record holds its own)
    replaced: list[DyTRecord] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # normalisation layers left in place, each with its type
    warnings: list[str] = field(default_factory=list)
    weights_loaded: list[str] = field(default_factory=list)
    weights_dropped: list[str] = field(default_factory=list)
    private: str = ""  # whether the copy is ready for private training with Opacus, and what prepare would change

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        start = ("alpha fitted per norm to its LayerNorm's output on the example input"
                 if isinstance(self.alpha, str) else f"alpha from {self.alpha:g}")
        lines = [f"Adapt report: method {self.method}, {len(self.replaced)} norm(s) replaced by DyT (gamma * "
                 f"tanh(alpha x) + beta, {start}; Zhu et al. 2025), nothing else changed"]
        for r in self.replaced:
            extra = f", alpha {r.alpha:.3g}" if isinstance(self.alpha, str) else ""
            extra += "" if r.input_rms is None else f", its input's RMS {r.input_rms:.3g}"
            lines.append(f"  {r.name}: {r.type}({r.channels}) -> DyT over dim {r.dim}, gamma {r.gamma}, beta "
                         f"{r.beta}{extra}")
        if self.kept:
            lines.append(f"normalisation kept: {', '.join(self.kept)}")
        return "\n".join([*lines, *closing_lines(self)])


def _is_layernorm(mod: nn.Module) -> bool:
    return isinstance(mod, nn.LayerNorm) or (_RMSNORM is not None and isinstance(mod, _RMSNORM))


def _first_calls(model: nn.Module, args: tuple[Tensor, ...], mods: list[nn.Module]) -> dict[int, tuple[Tensor, Tensor]]:
    """Each module's input and output at its first call in one eval-mode forward on ``args``."""
    seen: dict[int, tuple[Tensor, Tensor]] = {}

    def hook(mod: nn.Module, inputs: tuple[Any, ...], out: Any) -> None:
        if id(mod) not in seen and inputs and isinstance(inputs[0], Tensor) and isinstance(out, Tensor):
            seen[id(mod)] = (inputs[0].detach(), out.detach())

    handles = [m.register_forward_hook(hook) for m in mods]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*args)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return seen


def _dim(mod: nn.Module, call: tuple[Tensor, Tensor] | None) -> int | str:
    """The dimension of its input that norm ``mod`` normalises, or why it cannot be told. A plain ``nn.LayerNorm``
    (``nn.RMSNorm``) normalises the last; a subclass's is the dimension along which the plain computation
    reproduces its output on the example input (the last, or the channels of an image, dimension 1)."""
    shape = tuple(mod.normalized_shape)
    if len(shape) != 1:
        return (f"it normalises over {len(shape)} dimensions {list(shape)}; DyT's gamma and beta are per channel of "
                "one dimension")
    if type(mod) in (nn.LayerNorm, _RMSNORM):
        return -1
    if call is None:
        return (f"{type(mod).__name__} (a subclass with a forward of its own) is not called on the example input, "
                "so which dimension it normalises cannot be read; give an input that reaches it")
    x, y = call
    for dim in (-1, 1) if x.dim() > 2 else (-1,):
        if x.shape[dim] != shape[0]:
            continue
        moved = x.movedim(dim, -1)
        if isinstance(mod, nn.LayerNorm):
            ref = F.layer_norm(moved, shape, mod.weight, mod.bias, mod.eps)
        else:
            ref = F.rms_norm(moved, shape, mod.weight, mod.eps)
        ref = ref.movedim(-1, dim)
        if ref.shape == y.shape and torch.allclose(ref, y, rtol=1e-3, atol=1e-4):
            return dim
    return (f"{type(mod).__name__} (a subclass with a forward of its own) computes something other than a "
            "LayerNorm over its last dimension or its channels (dimension 1) on the example input; write it as a "
            "plain nn.LayerNorm")


def _replacement(mod: nn.Module, dim: int, alpha: float) -> tuple[DyT, str, str]:
    channels = int(mod.normalized_shape[0])
    new = DyT(channels, dim, alpha)
    weight, bias = getattr(mod, "weight", None), getattr(mod, "bias", None)
    with torch.no_grad():
        if isinstance(weight, Tensor):
            new.weight.copy_(weight)
        if isinstance(bias, Tensor):
            new.bias.copy_(bias)
    ref = weight if isinstance(weight, Tensor) else bias
    if isinstance(ref, Tensor):
        new = new.to(device=ref.device, dtype=ref.dtype)
    return new, "copied" if isinstance(weight, Tensor) else "ones", "copied" if isinstance(bias, Tensor) else "zeros"


def _paths(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, child) for every registration of every module (a module registered twice: each)."""
    return [(parent, attr, child) for parent in model.modules() for attr, child in parent.named_children()]


def _fitted_alpha(mod: nn.Module, dim: int, call: tuple[Tensor, Tensor] | None, rms: float | None) -> float | str:
    """The alpha of the DyT closest to norm ``mod`` on its first call (its input's RMS ``rms``), or why it cannot be
    fitted."""
    if call is None or rms is None:
        return ("it is not called on the example input, so its alpha cannot be fitted; give an input that reaches "
                "it, or a number as alpha0")
    if not (math.isfinite(rms) and rms > 0):
        return f"its input on the example input has RMS {rms:g}, which fits no alpha; give a number as alpha0"
    x, y = (t.double().movedim(dim, -1).reshape(-1, t.shape[dim]) for t in call)
    weight, bias = getattr(mod, "weight", None), getattr(mod, "bias", None)
    gamma = weight.detach().double() if isinstance(weight, Tensor) else torch.ones(x.shape[1], dtype=torch.float64)
    beta = bias.detach().double() if isinstance(bias, Tensor) else torch.zeros(x.shape[1], dtype=torch.float64)
    return fit_dyt_alpha(x, y, gamma, beta)


def _input_rms(call: tuple[Tensor, Tensor] | None) -> float | None:
    return None if call is None else float(call[0].double().pow(2).mean().sqrt())


# alpha0 times a norm's input RMS below this: tanh(alpha x) passes at most about a tenth of a LayerNorm's unit scale.
SMALL_SIGNAL = 0.1


def _small_inputs(records: list[DyTRecord]) -> list[str]:
    """A warning where alpha0 times a norm's input RMS on the example input is below :data:`SMALL_SIGNAL`."""
    small = [r for r in records if r.input_rms is not None and r.alpha * r.input_rms < SMALL_SIGNAL]
    if not small:
        return []
    low = min(small, key=lambda r: r.input_rms or 0.0)
    return [f"{len(small)} of {len(records)} norms see inputs so small that alpha0 {low.alpha:g} times their RMS is "
            f"below {SMALL_SIGNAL:g} (smallest: {low.name}, RMS {low.input_rms:.3g}): there tanh(alpha x) passes "
            f"about {low.alpha * low.input_rms:.2g} of the unit scale a LayerNorm gives, and the signal fades (GPT-2's "
            "copy task stayed at chance so, docs/methods.md); pass alpha0='fitted' to start each alpha where the DyT "
            "matches its LayerNorm on the example input"]


def adapt_dyt(model: nn.Module, args: tuple[Tensor, ...], method: Method, *, strict: bool = True,
              state_dict: Mapping[str, Tensor] | None = None, fitted: bool = False) -> tuple[nn.Module, DyTAdaptReport]:
    """A copy of ``model`` with a DyT in place of every LayerNorm (and ``nn.RMSNorm``), and its report; see the
    module's docstring. ``strict``: a norm that cannot be replaced is an :class:`AdaptError` (else a warning, and
    the norm stays). ``fitted``: each DyT's alpha fitted to its norm's output on ``args`` (else
    ``method.dyt_alpha``)."""
    name = type(model).__name__
    source = copy.deepcopy(model)
    swapped = V.slow_path_(source)  # PyTorch's fused Transformer path reads the norms' eps and weight directly
    names = {id(m): n for n, m in source.named_modules()}
    norms = [m for m in source.modules() if _is_layernorm(m)]
    batchnorms = [f"{names[id(m)]} ({type(m).__name__})" for m in source.modules()
                  if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batchnorms and not norms:
        raise AdaptError(f"adapt(method='dyt') replaces LayerNorms, and {name} has none, only BatchNorm "
                         f"({', '.join(batchnorms[:3])}{', ...' if len(batchnorms) > 3 else ''}). DyT does not replace "
                         f"BatchNorm: its authors report a loss of accuracy (Zhu et al. 2025, Limitations), and so did "
                         f"ours ({BATCHNORM_MEASURED}). Use method='fixup', 'skipinit' or 'rezero', which remove "
                         "BatchNorm")
    if not norms:
        raise AdaptError(f"adapt(method='dyt') replaces LayerNorms (and nn.RMSNorm), and {name} has none; DyT is "
                         "a Transformer's norm. For a residual network without them use method='fixup', 'skipinit' "
                         "or 'rezero'")
    calls = _first_calls(source, args, norms)
    report = DyTAdaptReport(method.name, DYT_FITTED if fitted else method.dyt_alpha)
    new: dict[int, DyT] = {}
    problems: list[str] = []
    for mod in norms:
        dim = _dim(mod, calls.get(id(mod)))
        if isinstance(dim, str):
            problems.append(f"{names[id(mod)]} ({type(mod).__name__}): {dim}")
            continue
        alpha, rms = method.dyt_alpha, _input_rms(calls.get(id(mod)))
        if fitted:
            fit = _fitted_alpha(mod, dim, calls.get(id(mod)), rms)
            if isinstance(fit, str):
                problems.append(f"{names[id(mod)]} ({type(mod).__name__}): {fit}")
                continue
            alpha = fit
        new[id(mod)], gamma, beta = _replacement(mod, dim, alpha)
        report.replaced.append(DyTRecord(names[id(mod)], type(mod).__name__, int(mod.normalized_shape[0]), dim,
                                         gamma, beta, alpha, rms))
    if problems and strict:
        raise AdaptError(f"adapt(method='dyt') cannot replace every LayerNorm of {name}:\n  - "
                         + "\n  - ".join(problems)
                         + "\nChange the model, or pass strict=False to replace the others and keep these")
    for parent, attr, child in _paths(source):
        if id(child) in new:
            setattr(parent, attr, new[id(child)])
    report.warnings += [f"{p}; it stays a norm" for p in problems]
    if not fitted:
        report.warnings += _small_inputs(report.replaced)
    if swapped:
        report.warnings.append(f"PyTorch Transformer modules ({', '.join(swapped[:3])}) run their documented "
                               "non-fast-path computation (a subclass of the same module), as the fused fast path "
                               "reads the norms")
    others = [m for m in source.modules() if _is_layernorm(m) or isinstance(m, (
        nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm))]
    kept_names = {id(m): n for n, m in source.named_modules()}
    report.kept = [f"{kept_names[id(m)]} ({type(m).__name__})" for m in others]
    if batchnorms:
        report.warnings.append(f"BatchNorm kept ({', '.join(batchnorms[:3])}{', ...' if len(batchnorms) > 3 else ''}): "
                               "DyT does not replace BatchNorm (Zhu et al. 2025, Limitations; measured here: "
                               f"{BATCHNORM_MEASURED}); use method='fixup' to remove it")
    if state_dict is not None:
        loaded: WeightsLoaded = load_original(source, state_dict)
        report.weights_loaded, report.weights_dropped = loaded.loaded, loaded.dropped
    with torch.no_grad():  # the copy runs where the model ran
        was_training = source.training
        source.eval()
        try:
            source(*args)
        finally:
            source.train(was_training)
    for message in report.warnings:
        warnings.warn(message, FixupWarning, stacklevel=4)  # the caller of fixup.adapt
    return source, report
