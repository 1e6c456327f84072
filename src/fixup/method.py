"""The initialisation methods, as one typed table: the only place that says what a method is.

A :class:`Method` is resolved once (by :func:`fixup.create_model`, or :func:`resolve_method`) and handed
to a model's constructor, which builds its scalars from it and finishes by initialising itself. The
studies, the laboratory and the training engine all name methods from :data:`METHODS`.

The methods (Zhang, Dauphin & Ma, ICLR 2019, sections 3-5 and appendix):

- ``norm="fixup"``: Fixup (rules 1-3 of section 3). ``fixup`` is our default parameterisation, which
  corrects the paper's in one place: the scalar bias that ends each branch sits on the residual stream,
  and in a stage every such bias receives the same gradient, so together they move (blocks per stage)
  times faster than one scalar: the aligned-updates failure that rule 2 prevents for the weights. Our
  default gives those *stream biases* a fixed budget: together they learn at one scalar's rate
  (:func:`fixup.param_groups`). It corrects a second place: without normalisation the stem alone sets
  the scale of the residual stream, so it is drawn from its fan-in (He's forward-preserving choice); a
  fan-out draw (torchvision's convention, and the one the other layers keep) shrinks the stream by
  sqrt(fan_in / fan_out), 1/4 for digits into 16 channels. ``fixup_paper`` is the authors'
  parameterisation (every scalar at the same rate, the stem from its fan-out); ``fixup_no_stream_bias``
  takes rule 3 literally (biases before each layer and activation, none added to the stream). The
  ablations of section 4.3 (table 3) change one thing of ``fixup``: ``fixup_no_depth_scale``,
  ``fixup_scale_x0.1`` / ``fixup_scale_x10``, ``fixup_zero_branch``, ``fixup_no_bias``, ``fixup_no_scale``.
- ``norm="none"``: no normalisation and no scalars, with ``he`` (He et al. 2015), ``xavier`` (Glorot &
  Bengio 2010), ``lsuv`` (Mishkin & Matas 2016; finished on a batch by :func:`fixup.init.data_init_`)
  or ``sqrt2`` (He, and each residual block's output ``x + F(x)`` times 1/sqrt(2): section 4.1's baseline).
- ``norm="batchnorm"`` / ``"groupnorm"``: the normalised baselines, He-initialised; ``norm="layernorm"``
  (the Transformer's baseline) with Xavier, as the authors' fairseq code (section 5).
- ``norm="none"`` with a gate: ``skipinit`` (De & Smith 2020) and ``rezero`` (Bachlechner et al. 2020), each
  residual branch times a learnable scalar that starts at 0. ``skipinit`` draws its weights as the authors'
  released SkipInit ResNet does (truncated normal, std 1/sqrt(fan_in); the classifier at 0); ``skipinit_he`` is
  the variant on the He baseline's draw, ReZero's network (docs/methods.md lists every difference from the
  authors' code).
- ``norm="none"``, the signal-propagation schemes: ``nf_resnet`` (Brock, De & Smith 2021: scaled weight
  standardisation and ``h + alpha * F(h / beta)`` blocks, each branch times a skip gain that starts at 0, AGC on
  every parameter but the classifier, gains and biases undecayed: the authors' released code, for the ResNets;
  ``nf_resnet_nozero`` is the block as the paper analyses it, without the zero-started gain) and ``t_fixup``
  (Huang et al. 2020: the Transformer without LayerNorm or warm-up, its value, output and MLP weights and
  embeddings scaled by depth).
- ``norm="dyt"``: ``dyt``, Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, CVPR 2025): every LayerNorm of the Transformer
  replaced, where it stood, by ``gamma * tanh(alpha * x) + beta`` (:class:`fixup.nn.DyT`), alpha one learnable scalar
  per layer from :data:`DYT_ALPHA`, gamma 1 and beta 0 per channel; otherwise the LayerNorm baseline (Xavier,
  the same recipe). :func:`fixup.adapt` puts one in place of each LayerNorm of a model written elsewhere.

Each row names its *initialiser*: the module of :mod:`fixup.init` that initialises a model for it
(``fixup``, ``baselines``, ``lsuv``, ``gates``, ``nf_resnet``, ``t_fixup``: the keys of ``fixup.init.INITIALISERS``).
Every fact of a method is a field of its row (the families it applies to, how :func:`fixup.adapt` applies it,
its recipe's clipping and warm-up), read where it is needed. To add a method, add a row here and, if no
initialiser fits, a module of :mod:`fixup.init` with an ``initialise_(model, method, generator=...)``, registered
in ``fixup.init.INITIALISERS``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["ADAPT_FORMS", "ADAPT_METHODS", "AGC_RULES", "CLIPPINGS", "DEFAULT_INIT", "DYT_ALPHA", "FAMILIES",
           "FAN_MODES", "GATE_DRAWS", "METHODS", "STREAM_BIAS", "Method", "as_method", "model_method",
           "resolve_method"]

SQRT_HALF = 1.0 / math.sqrt(2.0)  # the 1/sqrt(2) residual rescaling of the depth study (section 4.1)
# Dynamic Tanh's alpha0 (Zhu et al., CVPR 2025, "Initialization of alpha"): 0.5 for every non-LLM model they train,
# which they find insensitive to it; only their LLMs take other values, tuned per width (LLaMA 7B: 0.8 before
# attention, 0.2 elsewhere; their released LLaMA code).
DYT_ALPHA = 0.5
# Where the bias that ends each residual branch sits and how it learns:
#   "budget": on the stream; all stream biases together learn at one scalar's rate (our default);
#   "paper":  on the stream, at the scalar rate each (the authors' parameterisation);
#   "none":   absent: rule 3 taken literally, a bias before each layer and activation, none on the stream.
STREAM_BIAS = ("budget", "paper", "none")
# He's two fan conventions: fan_in keeps the forward signal's scale, fan_out the backward one's.
FAN_MODES = ("fan_in", "fan_out")
# The model families a method applies to, each with what it is. A model's constructor refuses a method of another
# family (fixup.models), as it refuses a norm it does not build (BatchNorm in the Transformer, LayerNorm in a ResNet).
FAMILIES = {
    "any": "any residual network the library builds",
    "resnet": "the convolutional ResNets (CIFAR, Wide and ImageNet ResNets)",
    "transformer": "the encoder-decoder Transformer",
}
# How fixup.adapt applies a method to a model written elsewhere:
#   "":      it does not (the method needs the library's own blocks, or is a baseline: train the model as written);
#   "fixup": every normalisation becomes a scalar bias (or goes), the Fixup rule (fixup.fixup_init_);
#   "gate":  every normalisation goes, each branch ends in a gate at 0, drawn by the method's initialiser;
#   "dyt":   every LayerNorm becomes a DyT where it stood (its affine kept), nothing else changes (Method.dyt_alpha);
#   "nf":    every normalisation goes, every convolution is weight-standardised, each activation scaled by its gamma
#            and each branch h + alpha * g * F(h / beta) on the recorded residual sums (fixup._adapt._nf);
#   "t_fixup": every LayerNorm goes, every weight layer Xavier, the embeddings N(0, d^-1/2), and each stack's value,
#            output and feed-forward weights and embeddings scaled by its depth (fixup._adapt._tfixup).
ADAPT_FORMS = ("", "fixup", "gate", "dyt", "nf", "t_fixup")
# Gradient clipping: the one vocabulary of the method table (Method.clip: "" when the method prescribes none), of
# the training config (TrainConfig.clip, which adds "auto": the method's own, else "norm") and of the recipe the
# engine applies (fixup.train.recipe). Each with what it is, as a recipe's note says it.
CLIPPINGS = {
    "norm": "global-norm clipping (torch.nn.utils.clip_grad_norm_, to grad_clip)",
    "agc": "adaptive gradient clipping (Brock et al. 2021b, section 4.1; fixup.adaptive_clip_grad_)",
    "none": "no clipping",
}
# Which tensors adaptive gradient clipping leaves out (fixup.clip.agc_exempt):
#   "classifier":   the classifier's weight, left unclipped; every other tensor clipped unit-wise (Brock et al.
#                   2021b, as their released NFNet code runs it);
#   "zero_started": the tensors Fixup starts at zero (each branch's last layer, the classifier) and every scalar,
#                   clipped together by their global norm (ours, for Fixup forms, whose zero-started layers could
#                   not move under AGC).
AGC_RULES = ("classifier", "zero_started")
# How a gated method draws its weights:
#   "standard":         the He baseline's draw (or the model's init_base), PyTorch's default for a linear classifier;
#   "truncated_fan_in": every weight layer from a normal truncated at 2 std, rescaled to std 1/sqrt(fan_in), the
#                       classifier at 0 (De & Smith's released SkipInit ResNet: haiku's default initialiser).
GATE_DRAWS = ("standard", "truncated_fan_in")


@dataclass(frozen=True)
class Method:
    """One ``(norm, init)`` combination: what it asks of the architecture and of the initialiser."""

    norm: str
    init: str
    description: str
    biases: bool = False  # branches carry Fixup's scalar biases (rule 3)
    scale: bool = False  # branches carry Fixup's scalar multiplier (rule 3)
    stream_bias: str = "none"  # the bias after a branch's last layer: one of STREAM_BIAS (Fixup forms)
    # The He fan of the weight layers outside every residual branch (the stem: what feeds the stream). Fixup
    # forms draw it from its fan-in, so that the stream starts at the input's scale (our correction; see
    # fixup.fixup_init_); "fan_out" is the other layers' convention, kept by fixup_paper and the baselines.
    stem_mode: str = "fan_out"
    output_scale: float = 1.0  # multiplier on each residual block's output x + F(x)
    depth_scaling: bool = True  # rule 2's factor L^(-1/(2m-2)) (Fixup forms only)
    rescale: float = 1.0  # rule 2's factor times this (Fixup forms only)
    zero_branch: bool = False  # every weight of every residual branch zero (ablation)
    zero_init_last_norm: bool = False  # each block's last norm gain 0 (Goyal et al. 2017; batchnorm/groupnorm)
    gate: bool = False  # each residual branch ends in a learnable scalar gate that starts at 0 (skipinit, rezero)
    # The initialiser of fixup.init that initialises a model for it: a key of fixup.init.INITIALISERS, the registry.
    initialiser: str = "baselines"
    nf: bool = False  # NF-ResNet blocks: weight-standardised convolutions, h + alpha * F(h / beta) (nf_resnet)
    family: str = "any"  # the model families it applies to (FAMILIES); others refuse it with a ValueError
    adapt: str = ""  # how fixup.adapt applies it to a model written elsewhere (ADAPT_FORMS); "" = it does not
    clip: str = ""  # the gradient clipping its recipe uses (a key of CLIPPINGS); "" = none prescribed
    # Whether its recipe may warm the learning rate up. T-Fixup's does not (False): its inverse square-root
    # schedule decays from the first step, with the warm-up's length as its period (fixup.train.recipe).
    warmup: bool = True
    agc_exempt: str = "zero_started"  # what AGC leaves out (AGC_RULES) under clip agc, its recipe's or explicit
    # Whether gains and biases (weight-standardised layers' gains, layer biases, gates) take weight decay; the
    # NF-ResNet and SkipInit authors' code exempts them (param_groups' "gains_biases" group).
    decay_gains: bool = True
    draw: str = "standard"  # how a gated method draws its weights (GATE_DRAWS)
    # The stochastic depth rate of its authors' recipe (the last of N blocks drops with drop_path (N - 1) / N:
    # fixup.models.drop_path_rates): 0.1 in De & Smith's SkipInit and Brock et al.'s NF-ResNet code. Off unless a run
    # asks for it (fixup train --drop-path -1), so that no committed result changes (fixup.train.recipe).
    drop_path: float = 0.0
    summary: str = ""  # the line its initialisation report opens with, in its paper's words (the gated methods)
    dyt_alpha: float = 0.0  # DyT's alpha0 where the method puts a DyT in each LayerNorm's place (norm "dyt"); else 0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {tuple(FAMILIES)}, got {self.family!r}")
        if self.adapt not in ADAPT_FORMS:
            raise ValueError(f"adapt must be one of {ADAPT_FORMS}, got {self.adapt!r}")
        if self.clip and self.clip not in CLIPPINGS:
            raise ValueError(f"clip must be one of {tuple(CLIPPINGS)} or '' (none prescribed), got {self.clip!r}")
        if self.agc_exempt not in AGC_RULES:
            raise ValueError(f"agc_exempt must be one of {AGC_RULES}, got {self.agc_exempt!r}")
        if self.draw not in GATE_DRAWS:
            raise ValueError(f"draw must be one of {GATE_DRAWS}, got {self.draw!r}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"drop_path must be a probability in [0, 1), got {self.drop_path!r}")
        if self.nf and self.norm != "none":
            raise ValueError(f"an NF-ResNet method has no normalisation (norm='none'), got norm={self.norm!r}")
        if self.gate and self.norm != "none":
            raise ValueError(f"a gated method has no normalisation (norm='none'), got norm={self.norm!r}")
        if self.stream_bias not in STREAM_BIAS:
            raise ValueError(f"stream_bias must be one of {STREAM_BIAS}, got {self.stream_bias!r}")
        if not (isinstance(self.rescale, (int, float)) and self.rescale > 0 and math.isfinite(self.rescale)):
            raise ValueError(f"rescale must be a positive finite number, got {self.rescale!r}")
        if self.stem_mode not in FAN_MODES:
            raise ValueError(f"stem_mode must be one of {FAN_MODES}, got {self.stem_mode!r}")
        if (self.norm == "dyt") != (self.dyt_alpha > 0) or not math.isfinite(self.dyt_alpha):
            raise ValueError(f"a DyT method (norm='dyt') needs dyt_alpha > 0 and no other has one, got norm="
                             f"{self.norm!r} with dyt_alpha={self.dyt_alpha!r}")
        if self.zero_init_last_norm and self.norm not in ("batchnorm", "groupnorm"):
            raise ValueError(f"zero_init_last_norm applies to norm='batchnorm' or 'groupnorm', not "
                             f"norm={self.norm!r}")

    @property
    def name(self) -> str:
        """The method's name in :data:`METHODS` (the init for Fixup forms and bare networks, else the norm)."""
        return self.init if self.norm in ("fixup", "none") else self.norm

    @property
    def fixup(self) -> bool:
        return self.norm == "fixup"

    @property
    def has_stream_bias(self) -> bool:
        """Whether each branch ends in a scalar bias added to the residual stream."""
        return self.fixup and self.biases and self.stream_bias != "none"

    @property
    def stream_budget(self) -> bool:
        """Whether the stream biases share one scalar's learning rate (see :func:`fixup.param_groups`)."""
        return self.has_stream_bias and self.stream_bias == "budget"

    @property
    def needs_data(self) -> bool:
        """Whether the method finishes only once it has seen a batch (:func:`fixup.init.data_init_`)."""
        return self.init == "lsuv"


def _fixup(init: str, description: str, **kw: object) -> Method:
    fields = {"biases": True, "scale": True, "stream_bias": "budget", "stem_mode": "fan_in", "initialiser": "fixup",
              **kw}
    return Method("fixup", init, description, **fields)  # type: ignore[arg-type]


_NORMED = "He-initialised convolutions, normalisation gain 1 and shift 0"
_SKIPINIT = "no normalisation; each residual branch times a scalar gain that starts at 0; no depth scaling"
_ALL: tuple[Method, ...] = (
    _fixup("fixup", "Fixup: rules 1-3 (section 3), the stream biases sharing one scalar's rate and the stem drawn "
           "from its fan-in (our corrections)", adapt="fixup"),
    _fixup("fixup_paper", "Fixup as the authors parameterise it: every scalar at the same rate, the stem drawn from "
           "its fan-out", stream_bias="paper", stem_mode="fan_out"),
    _fixup("fixup_no_stream_bias", "Fixup with rule 3 taken literally: no bias added to the residual stream",
           stream_bias="none"),
    _fixup("fixup_no_depth_scale", "Fixup without rule 2's depth factor (ablation)", depth_scaling=False),
    _fixup("fixup_scale_x0.1", "Fixup with rule 2's factor times 0.1 (ablation)", rescale=0.1),
    _fixup("fixup_scale_x10", "Fixup with rule 2's factor times 10 (ablation)", rescale=10.0),
    _fixup("fixup_zero_branch", "Fixup with every residual-branch weight zero (ablation)", zero_branch=True),
    _fixup("fixup_no_bias", "Fixup without the scalar biases (ablation)", biases=False),
    _fixup("fixup_no_scale", "Fixup without the scalar multiplier (ablation)", scale=False),
    # Without normalisation and without a gate, the baselines are built for the ResNets (the Transformer is built
    # without normalisation only for a gated method or T-Fixup).
    Method("none", "he", "no normalisation, He initialisation", family="resnet"),
    Method("none", "xavier", "no normalisation, Xavier (Glorot) initialisation", family="resnet"),
    Method("none", "lsuv", "no normalisation, LSUV (orthonormal, then unit output variance per layer)",
           initialiser="lsuv", family="resnet"),
    Method("none", "sqrt2", "no normalisation, He initialisation, block outputs times 1/sqrt(2)",
           output_scale=SQRT_HALF, family="resnet"),
    Method("batchnorm", "he", f"batchnorm, {_NORMED}"),
    Method("groupnorm", "he", f"groupnorm, {_NORMED}"),
    Method("layernorm", "xavier", "layernorm, Xavier-initialised linear layers"),
    # The gated methods start each branch's gate at 0. SkipInit draws as the authors' released ResNet does
    # (truncated normal from the fan-in, classifier at 0, gate and biases undecayed); skipinit_he and ReZero draw
    # every weight layer as the He baseline does, the stem from its fan-in as Fixup's (docs/methods.md).
    Method("none", "skipinit", "SkipInit (De & Smith 2020): no normalisation, each branch times a scalar gain that "
           "starts at 0, no depth scaling; weights truncated normal with std 1/sqrt(fan_in), the classifier at 0 "
           "(the authors' code)", stem_mode="fan_in", gate=True, initialiser="gates", draw="truncated_fan_in",
           decay_gains=False, adapt="gate", drop_path=0.1,
           summary=f"{_SKIPINIT}; the authors' draw (truncated normal from the fan-in, classifier at 0)"),
    Method("none", "skipinit_he", "SkipInit on the He baseline's draw (fan-out) with PyTorch's default classifier "
           "(variant; the same network as rezero)", stem_mode="fan_in", gate=True, initialiser="gates",
           summary=_SKIPINIT),
    Method("none", "rezero", "ReZero (Bachlechner et al. 2020): x + alpha * F(x) with alpha = 0 per branch, "
           "normalisation removed", stem_mode="fan_in", gate=True, initialiser="gates", adapt="gate",
           summary="x + alpha * F(x) with alpha = 0 per residual branch; normalisation removed"),
    # Brock, De & Smith (ICLR 2021), as the authors' released code builds and trains it; adaptive gradient
    # clipping is from their follow-up (Brock et al. 2021b), which trains NF-ResNets with it (docs/methods.md).
    Method("none", "nf_resnet", "NF-ResNet (Brock et al. 2021): scaled weight standardisation, blocks h + alpha * "
           "g * F(h / beta) with beta the analytic std of h, alpha 0.2 and a skip gain g that starts at 0, no "
           "normalisation; AGC on every parameter but the classifier, gains and biases undecayed (the authors' code)",
           initialiser="nf_resnet", nf=True, gate=True, family="resnet", clip="agc", agc_exempt="classifier",
           decay_gains=False, drop_path=0.1, adapt="nf"),
    Method("none", "nf_resnet_nozero", "NF-ResNet without the zero-started skip gain: the block h + alpha * "
           "F(h / beta) as the paper analyses it (variant); otherwise nf_resnet's recipe",
           initialiser="nf_resnet", nf=True, family="resnet", clip="agc", agc_exempt="classifier", decay_gains=False,
           drop_path=0.1, adapt="nf"),
    Method("none", "t_fixup", "T-Fixup (Huang et al. 2020): Xavier, no LayerNorm, no warm-up; value, output and MLP "
           "weights and the embeddings scaled by the encoder's 0.67 N^(-1/4) and the decoder's (9N)^(-1/4)",
           initialiser="t_fixup", family="transformer", warmup=False, adapt="t_fixup"),
    # Zhu et al. (CVPR 2025): DyT where each LayerNorm was, trained as the LayerNorm model (their code changes only
    # the layer); the Transformer's linear layers as the LayerNorm baseline's (fairseq's Xavier). Their Limitations
    # report that DyT does not replace BatchNorm: adapt refuses a model with BatchNorm (docs/methods.md).
    Method("dyt", "xavier", "Dynamic Tanh (Zhu et al. 2025): every LayerNorm replaced where it stood by gamma * "
           f"tanh(alpha x) + beta, alpha a learnable scalar from {DYT_ALPHA:g}, gamma 1, beta 0; Xavier-initialised "
           "linear layers, the LayerNorm baseline's recipe", family="transformer", adapt="dyt", dyt_alpha=DYT_ALPHA),
)
# Every method by name: "fixup" and its variants, "he" (alias "none"), "xavier", "lsuv", "sqrt2",
# "batchnorm", "groupnorm", "layernorm", "skipinit", "skipinit_he", "rezero", "nf_resnet", "nf_resnet_nozero",
# "t_fixup", "dyt".
METHODS: dict[str, Method] = {m.name: m for m in _ALL}
# The methods fixup.adapt applies (Method.adapt): Fixup, those whose only structural change is a gate per branch, the
# NF-ResNets on the recorded residual sums, DyT in place of each LayerNorm, and T-Fixup on a Transformer's stacks.
ADAPT_METHODS = tuple(name for name, m in METHODS.items() if m.adapt)
DEFAULT_INIT = {"fixup": "fixup", "none": "he", "batchnorm": "he", "groupnorm": "he", "layernorm": "xavier",
                "dyt": "xavier"}
_ALIASES = {"none": "he", "bn": "batchnorm", "gn": "groupnorm", "ln": "layernorm"}


def _combinations() -> str:
    by_norm: dict[str, list[str]] = {}
    for m in _ALL:
        by_norm.setdefault(m.norm, []).append(repr(m.init))
    return "; ".join(f"norm={norm!r} with init in ({', '.join(inits)})" for norm, inits in by_norm.items())


def resolve_method(norm: str | None = "fixup", init: str | None = None, *,
                   zero_init_last_norm: bool = False) -> Method:
    """The :class:`Method` for ``norm`` and ``init`` (``None`` or ``""``: the norm's default); a ValueError if none.

    ``norm=None`` with an ``init`` that names a method of :data:`METHODS` (``"skipinit"``, ``"he"``) is that
    method; ``norm=None`` otherwise means ``"fixup"``. A norm given with a method name of another normalisation
    (``norm="batchnorm", init="rezero"``) is a contradiction: the error names the method's own norm.
    """
    if norm is None and init and _ALIASES.get(init, init) in METHODS:
        method = METHODS[_ALIASES.get(init, init)]
        return dataclasses.replace(method, zero_init_last_norm=True) if zero_init_last_norm else method
    norm = norm or "fixup"
    if norm not in DEFAULT_INIT:
        raise ValueError(f"unknown norm={norm!r}; the combinations that exist are: {_combinations()}")
    key = init or DEFAULT_INIT[norm]
    method = next((m for m in _ALL if m.norm == norm and m.init == key), None)
    named = METHODS.get(_ALIASES.get(key, key))
    if method is None and named is not None and named.norm == norm:  # init names the method itself ("batchnorm")
        method = named
    if method is None and named is not None:  # a method name with another normalisation: a real contradiction
        raise ValueError(f"init={init!r} is the method {named.name!r}, which has norm={named.norm!r}, not "
                         f"norm={norm!r}; leave the norm out (the method name alone "
                         f"selects it: `fixup train --init {named.name}`) or give norm={named.norm!r}")
    if method is None:
        raise ValueError(f"init={init!r} does not combine with norm={norm!r}; the combinations that exist are: "
                         f"{_combinations()}")
    return dataclasses.replace(method, zero_init_last_norm=True) if zero_init_last_norm else method


def as_method(method: Method | str) -> Method:
    """``method`` itself, or the method of that name in :data:`METHODS` (aliases: none, bn, gn, ln)."""
    if isinstance(method, Method):
        return method
    name = _ALIASES.get(method, method)
    if name not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose among {', '.join(METHODS)}")
    return METHODS[name]


def model_method(model: object) -> Method | None:
    """The method ``model`` was built for (``model.method``, the library's models) or adapted to by
    :func:`fixup.adapt` (``model.adapted_method``, set where the adapted form has a recipe of its own: the
    NF-ResNets', SkipInit's undecayed gates and biases), else ``None``. What the recipe's readers (AGC's rule,
    the optimiser groups) ask of a model."""
    for attr in ("method", "adapted_method"):
        found = getattr(model, attr, None)
        if isinstance(found, Method):
            return found
    return None
