"""Which of ``fixup.adapt``'s options apply under which method: each one applies, or is refused before the model runs
with a ValueError naming the option, the method and what would work. No option is dropped silently.

The initialiser's options go where the method's initialiser takes them: Fixup's rule (:func:`fixup.fixup_init_`)
takes every one of its own; a gated method drawn from a standard base (ReZero: He) takes the base and the He fans
(``mode`` in the branches and shortcuts, ``stem_mode`` elsewhere); a gated method with its authors' own draw
(SkipInit: a truncated normal of std 1/sqrt(fan_in)) takes none of them. What each method is comes from its row of
:data:`fixup.METHODS` (``Method.adapt``, ``Method.draw``), never from its name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

from ..init.fans import BASE_INITS, FAN_MODES
from ..method import ADAPT_METHODS, Method, as_method
from ._trunk import TRUNK_RULES

__all__ = ["DYT_FITTED", "INIT_OPTIONS", "Chosen", "adapted_method", "check_options"]

# The fixup_init_ keywords adapt passes on (its own strict, generator and method are adapt's), with what each sets.
INIT_OPTIONS = {
    "mode": "the He fan of the branch layers and shortcut projections",
    "base": "the standard initialisation the draws start from",
    "stem_mode": "the He fan of the weight layers outside the branches",
    "depth_scaling": "whether Fixup's rule 2 multiplies the branch layers by L^(-1/(2m-2))",
    "rescale": "a factor on Fixup's rule 2",
    "expect_biases": "whether a branch without Fixup's scalar biases (rule 3) is a warning",
    "expect_scale": "whether a branch without Fixup's scalar multiplier (rule 3) is a warning",
}
# alpha0="fitted": each DyT's alpha fitted to its LayerNorm's output on the example input (method="dyt" only).
DYT_FITTED = "fitted"
# What a gated method drawn from a standard base (Method.draw == "standard") takes of them.
_STANDARD_DRAW = ("mode", "base", "stem_mode")


@dataclass(frozen=True)
class Chosen:
    """The method adapt applies (with the options that are fields of it) and the keywords for its initialiser."""

    method: Method
    init_kwargs: dict[str, Any]


def adapted_method(method: str) -> Method:
    """The method of :data:`fixup.METHODS` named ``method``, if adapt applies it (``Method.adapt``); else a
    ValueError saying why not and what does instead."""
    head = f"fixup.adapt applies the methods {ADAPT_METHODS}, got method={method!r}"
    try:
        m = as_method(method)
    except ValueError as err:
        raise ValueError(f"{head}: {err}") from None
    if m.adapt:
        return m
    if m.family == "transformer":
        why = ("it scales each stack of the library's encoder-decoder Transformer by that stack's depth: "
               f"fixup.create_model('transformer_tiny', method={m.name!r}); for another Transformer adapt with "
               "method='fixup' or 'rezero'")
    elif m.fixup:
        why = (f"adapt applies Fixup's default form; {m.name!r} is for the library's models "
               f"(fixup.create_model(name, method={m.name!r}))")
    else:
        why = ("a baseline needs no adapting: train the model as written (its own normalisation), or build a "
               f"library model with fixup.create_model(name, method={m.name!r})")
    raise ValueError(f"{head}: {why}")


def check_options(method: str, trunk: str, gate_biases: bool, mode: str | None, options: dict[str, Any]) -> Chosen:
    """The method adapt applies and its initialiser's keywords, after checking every option against it (a
    ValueError naming the option, the method and the fix). ``mode`` is ``None`` where it was not given."""
    if trunk not in TRUNK_RULES:
        raise ValueError(f"trunk must be one of {TRUNK_RULES}, got {trunk!r}")
    chosen = adapted_method(method)
    given = {k: v for k, v in {**options, "mode": mode}.items() if v is not None}  # None: not given
    alpha0 = given.pop("alpha0", None)
    for key in given:
        _check_known(key)
    if alpha0 is not None:
        return _check_dyt_alpha(chosen, alpha0, trunk, gate_biases, given)
    for key in ("mode", "stem_mode"):
        if key in given and given[key] not in FAN_MODES:
            raise ValueError(f"{key} must be one of {FAN_MODES}, got {given[key]!r}")
    if "base" in given and given["base"] not in BASE_INITS:
        raise ValueError(f"base must be one of {BASE_INITS}, got {given['base']!r}")
    if chosen.adapt in _FIXED:
        return _check_fixed(chosen, trunk, gate_biases, given)
    gated = chosen.adapt == "gate"
    if not gated and gate_biases:
        raise ValueError(f"gate_biases=True applies to the gated methods (method='skipinit' or 'rezero'); Fixup "
                         f"always has its scalar biases (rule 3): leave gate_biases out for method={chosen.name!r}")
    if not gated:
        return Chosen(chosen, {"mode": "fan_out", **given})
    takes = _STANDARD_DRAW if chosen.draw == "standard" else ()
    for key in given:
        if key not in takes:
            raise ValueError(_refusal(key, chosen))
    stem_mode = given.pop("stem_mode", None)
    if stem_mode is not None:  # a field of the method: the gated initialiser reads it from there
        chosen = dataclasses.replace(chosen, stem_mode=stem_mode)
    return Chosen(chosen, given)


def takes_trunk(method: str) -> bool:
    """Whether adapt's ``trunk`` rule applies under ``method`` (Fixup and the gated methods; not DyT, the NF form or
    T-Fixup, which set no trunk layer by a rule of their own)."""
    return adapted_method(method).adapt not in _FIXED


# What the methods that take none of the initialiser's options do instead (Method.adapt -> the sentence).
_FIXED = {
    "dyt": "puts a DyT in place of each LayerNorm and changes nothing else (no weight drawn, no branch or trunk)",
    "nf": ("standardises every convolution, so the standardisation, not the draw, sets each layer's scale (raw "
           "weights N(0, 1/fan_in) as the library's NF-ResNet), and scales each branch by alpha and 1/beta instead "
           "of any depth rule; the trunk is standardised too"),
    "t_fixup": ("draws every weight by T-Fixup's own rule (Xavier, the embeddings N(0, d^-1/2), each stack's depth "
                "factor of Huang et al. 2020, section 3.3): no He fan, base, Fixup option or trunk rule applies"),
}


def _check_fixed(chosen: Method, trunk: str, gate_biases: bool, given: dict[str, Any]) -> Chosen:
    """DyT changes nothing but the LayerNorms: it draws no weight, declares no branch and no trunk. The NF-ResNet
    form fixes every convolution's scale by standardisation: no fan, base, depth rule or trunk rule applies. T-Fixup
    draws every weight by its own rule."""
    head = f"method={chosen.name!r} {_FIXED[chosen.adapt]}"
    if given:
        key = next(iter(given))
        own = " (its one option is alpha0=, DyT's starting alpha)" if chosen.adapt == "dyt" else ""
        raise ValueError(f"{key}= sets {INIT_OPTIONS[key]}, which does not apply: {head}{own}. Leave {key} out, or "
                         "use method='fixup'")
    if trunk != TRUNK_RULES[0]:
        raise ValueError(f"trunk={trunk!r} sets the rule for the weight layers outside the branches, which does not "
                         f"apply: {head}. Leave trunk out")
    if gate_biases:
        raise ValueError(f"gate_biases=True applies to the gated methods (method='skipinit' or 'rezero'): {head}. "
                         "Leave gate_biases out")
    return Chosen(chosen, {})


def _check_dyt_alpha(chosen: Method, alpha0: Any, trunk: str, gate_biases: bool, given: dict[str, Any]) -> Chosen:
    """``alpha0``: DyT's starting alpha, a positive number (the method's field ``dyt_alpha``) or ``"fitted"``."""
    if chosen.adapt != "dyt":
        raise ValueError(f"alpha0= sets the starting alpha of the DyT that method='dyt' puts in each LayerNorm's "
                         f"place; method={chosen.name!r} puts none. Leave alpha0 out, or use method='dyt'")
    number = isinstance(alpha0, (int, float)) and not isinstance(alpha0, bool)
    if alpha0 != DYT_FITTED and not (number and math.isfinite(alpha0) and alpha0 > 0):
        raise ValueError(f"alpha0 must be a positive finite number (the DyT authors' default is 0.5) or "
                         f"{DYT_FITTED!r} (each DyT's alpha fitted to its LayerNorm's output on the example "
                         f"input), got {alpha0!r}")
    base = _check_fixed(chosen, trunk, gate_biases, given)
    if alpha0 == DYT_FITTED:
        return Chosen(base.method, {"alpha0": DYT_FITTED})
    return Chosen(dataclasses.replace(base.method, dyt_alpha=float(alpha0)), {})


def _check_known(key: str) -> None:
    if key in INIT_OPTIONS:
        return
    if key == "stream_bias":
        raise ValueError("stream_bias= does not apply to fixup.adapt: where an adapted model's stream biases learn "
                         "is fixup.param_groups' choice (its stream_budget=True, the default, gives them one "
                         "scalar's rate together; stream_budget=False the scalars' rate each, as the paper); leave "
                         "stream_bias out")
    close = difflib.get_close_matches(key, [*INIT_OPTIONS, "alpha0", "strict", "untie_weights", "state_dict",
                                            "generator", "trunk", "method", "gate_biases", "leaf_modules", "private"],
                                      n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"fixup.adapt has no option {key!r}{hint}; the initialiser's options it passes on are "
                     f"{', '.join(INIT_OPTIONS)} (see help(fixup.adapt))")


def _refusal(key: str, m: Method) -> str:
    """Why option ``key`` does not apply under the gated method ``m``, and what would work."""
    head = f"{key}= sets {INIT_OPTIONS[key]}, which method={m.name!r} does not take"
    if key in _STANDARD_DRAW:  # m draws by its authors' rule, not from a standard base
        return (f"{head}: it draws every weight from a normal truncated at 2 std with std 1/sqrt(fan_in), as its "
                f"authors' code. Leave {key} out, or use method='rezero' (drawn by base=, mode= and stem_mode=) or "
                "method='fixup'")
    if key in ("depth_scaling", "rescale"):
        why = "it scales no weight by depth: its gate at 0 starts each block as its shortcut instead"
    else:
        why = "it gives each branch a gate, not Fixup's scalars"
    return f"{head}: {key} is an option of Fixup's rule, and {why}. Leave {key} out, or use method='fixup'"
