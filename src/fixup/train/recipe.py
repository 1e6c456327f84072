"""A method's own training recipe, applied by the engine where the config leaves the choice to the method.

A :class:`fixup.Method` row may prescribe part of how it is trained: ``Method.clip`` (NF-ResNets: adaptive
gradient clipping, Brock et al. 2021b, section 4.1), ``Method.warmup`` (T-Fixup trains without warm-up,
Huang et al. 2020, section 3) and ``Method.drop_path`` (the stochastic depth rate of SkipInit's and the NF-ResNets'
authors' code, 0.1). :func:`apply_recipe` turns a config into the one the engine runs: ``clip="auto"``
(the default) becomes the method's clipping, or the engine's global-norm clipping where the method prescribes
none; an explicit ``clip`` wins. Under ``dp`` the per-example clipping of private training replaces them all.
``drop_path=-1`` becomes the method's rate; the default, 0, stays off for every method, so that a run trains as
the committed results did unless it asks for the method's stochastic depth.
The :class:`Recipe` says what was applied and why; the run log (run.json) and the result (``TrainResult.recipe``)
carry it. :func:`recipe_defaults` gives a recipe's starting values (the translation recipes) what the method
changes in them, so that only options given explicitly override the method.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..method import CLIPPINGS, Method, resolve_method
from .config import TrainConfig

__all__ = ["FINETUNE_RECIPE", "Recipe", "apply_recipe", "config_method", "finetune_defaults", "recipe_defaults",
           "warmup_options"]

# Fine-tuning a model converted by fixup.convert (``--extra '{"converted": PATH}'``), as measured by
# benchmarks/transfer.py (docs/convert.md, "Fine-tuning"): SGD over fixup.param_groups (the scalars at a tenth of
# the rate) without weight decay, a cosine schedule to 0 without warm-up, the global gradient norm clipped at 1
# (without it the converted ResNet-20 diverged at batch 32, lr 0.3); the rate 0.1 (0.03 at batches of 4 or fewer
# and under dp, where the converted routes chose 3-10x lower rates than the normalised ones).
FINETUNE_RECIPE: dict[str, Any] = {"weight_decay": 0.0, "schedule": "cosine", "warmup_steps": 0, "clip": "norm",
                                   "grad_clip": 1.0}

@dataclass(frozen=True)
class Recipe:
    """What the engine applied of the method's recipe, and why (JSON-able with :meth:`to_dict`)."""

    method: str  # the method of fixup.METHODS the config resolves to
    clip: str  # the gradient clipping the engine applies: a key of fixup.method.CLIPPINGS (norm | agc | none)
    clip_from: str  # "method" (its recipe), "explicit" (the config's clip), "default" (the engine's, clip=auto) or
    # "dp" (private training: the per-example clipping replaces the engine's)
    warmup_steps: int  # the warm-up the run has
    warmup_from: str  # "method" (its recipe has none) or "explicit" (the config's warmup_steps)
    notes: tuple[str, ...]  # one sentence per choice: what was applied and why
    drop_path: float = 0.0  # the stochastic depth rate the run trains with (fixup.models.drop_path_rates)
    drop_path_from: str = "default"  # "method" (drop_path -1: its recipe), "explicit", or "default" (off)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def config_method(config: TrainConfig) -> Method:
    """The :class:`fixup.Method` a (validated) config trains with."""
    return resolve_method(config.norm or None, config.init or None)


def apply_recipe(config: TrainConfig) -> tuple[TrainConfig, Recipe]:
    """The config the engine runs (``clip`` made concrete) and the :class:`Recipe` saying what was applied and why."""
    method = config_method(config)
    name = method.name
    if config.dp:  # validate() refused an explicit norm/agc clip under dp
        clip, clip_from = "none", "dp"
        replaced = f"{name}'s recipe ({method.clip})" if method.clip else "the engine's global-norm clipping"
        clip_note = (f"clip=none: under dp each example's gradient is clipped to max_grad_norm "
                     f"{config.max_grad_norm:g} before the noise is added (Opacus), in place of {replaced}")
    elif config.clip == "auto" and method.clip:
        clip, clip_from = method.clip, "method"
        clip_note = f"clip={clip}: {name}'s recipe, {CLIPPINGS[clip]} (clip=auto)"
    elif config.clip == "auto":
        clip, clip_from = "norm", "default"
        clip_note = (f"clip=norm at {config.grad_clip:g}: the engine's default; {name}'s recipe prescribes no clipping"
                     + (" (grad_clip 0: off)" if not config.grad_clip else ""))
    else:
        clip, clip_from = config.clip, "explicit"
        clip_note = f"clip={clip}: set explicitly" + (
            f", in place of {name}'s recipe ({method.clip})" if method.clip and method.clip != clip else "")
    if method.warmup:
        warm_from, warm_note = "explicit", "the warm-up as configured (warmup_steps)"
    elif config.warmup_steps:
        warm_from = "explicit"
        warm_note = f"the warm-up set explicitly (warmup_steps), although {name}'s recipe has no warm-up"
    else:
        warm_from, warm_note = "method", f"no warm-up: {name}'s recipe" + (
            f" (the inverse square-root decay from the first step, period {config.decay_period})"
            if config.schedule == "inverse_sqrt" else "")
    drop_path, drop_from, drop_notes = _drop_path(config, method)
    recipe = Recipe(name, clip, clip_from, config.warmup_steps, warm_from, (clip_note, warm_note, *drop_notes),
                    drop_path, drop_from)
    return config.replace(clip=clip, drop_path=drop_path), recipe


def _drop_path(config: TrainConfig, method: Method) -> tuple[float, str, tuple[str, ...]]:
    """The stochastic depth rate the run trains with, where it comes from, and a note where it is on."""
    if config.drop_path == -1:
        rate = method.drop_path
        note = (f"drop_path={rate:g}: {method.name}'s recipe (drop_path -1), its authors' rate; block i of N drops its "
                f"branch with {rate:g} i / N" if rate else
                f"drop_path=0: {method.name}'s recipe has no stochastic depth (drop_path -1)")
        return rate, "method", (note,)
    if config.drop_path:
        return config.drop_path, "explicit", (f"drop_path={config.drop_path:g}: set explicitly; block i of N drops its "
                                              f"branch with {config.drop_path:g} i / N",)
    return 0.0, "default", ()


def recipe_defaults(base: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A task recipe's starting values ``base`` as the method of ``base`` + ``given`` would have them.

    ``given`` are the options set explicitly; they keep their values (the caller merges them over the result).
    For a method whose recipe has no warm-up (``t_fixup``), the base's warm-up goes, and an ``inverse_sqrt``
    schedule decays from the first step as ``sqrt(P / (P + step))`` with the base's warm-up length as its period
    P (``decay_period``): T-Fixup's schedule (its authors' IWSLT recipe: P = 4,000, the base recipe's warm-up).
    """
    out = dict(base)
    if "norm" not in given and "init" in given:  # a method name given alone selects its own normalisation
        try:
            resolve_method(out.get("norm") or None, given["init"] or None)
        except ValueError:
            out.pop("norm", None)
    merged = {**out, **given}
    method = resolve_method(merged.get("norm") or None, merged.get("init") or None)
    if not method.warmup and "warmup_steps" not in given:
        schedule = given.get("schedule", out.get("schedule"))
        period = warmup_options(method, out.pop("warmup_steps", 0))
        if schedule == "inverse_sqrt" and "decay_period" not in given and not out.get("decay_period"):
            out.update(period)
        out["warmup_steps"] = 0
    return out


def warmup_options(method: Method, warmup_steps: int) -> dict[str, int]:
    """The schedule options of a recipe whose warm-up is ``warmup_steps`` long, as ``method`` trains with it:
    ``{"warmup_steps": warmup_steps}``, or for a method whose recipe has no warm-up (``Method.warmup`` False:
    T-Fixup) ``{"decay_period": warmup_steps}``: the inverse square-root decay from the first step, with the
    warm-up's length as its period (T-Fixup's authors' IWSLT recipe: P = 4,000, the base recipe's warm-up)."""
    return {"warmup_steps" if method.warmup else "decay_period": warmup_steps}


def finetune_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """The options of :data:`FINETUNE_RECIPE` (and its rate) that ``given``, the options set explicitly, leaves
    open: what a run fine-tuning a converted model takes from the recipe. Under dp the per-example clipping
    replaces the global one, so ``clip`` is left to it."""
    dp = bool(given.get("dp", False))
    out = {k: v for k, v in FINETUNE_RECIPE.items() if k not in given and not (dp and k in ("clip", "grad_clip"))}
    if "lr" not in given:
        out["lr"] = 0.03 if dp or given.get("batch_size", TrainConfig.batch_size) <= 4 else 0.1
    return out
