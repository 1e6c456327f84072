"""The typed training configuration: one dataclass in sections, one comment per field, units where they apply.

The sections (network, data, images, optimisation, regularisation, privacy, run) are dataclasses of their own;
:class:`TrainConfig` combines them, so code reads ``config.lr`` while config.json groups the
fields by section and image-only options stay apart from the rest (``fixup translate`` leaves them
out). Every field becomes a ``fixup train`` option (``lr`` -> ``--lr``, ``scalar_lr_mult`` ->
``--scalar-lr-mult``); :meth:`TrainConfig.from_dict` rejects unknown keys, and
:meth:`TrainConfig.validate` rejects values outside what the engine implements, naming them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._devices import check_device_name
from ..method import CLIPPINGS, resolve_method

__all__ = ["ACCOUNTANTS", "CLIPS", "OPTIMIZERS", "PRECISIONS", "RESUMABLE_CHANGES", "SCHEDULES", "SECTIONS",
           "DataOptions", "ImageOptions", "ModelOptions", "OptimisationOptions", "PrivacyOptions",
           "RegularisationOptions", "RunOptions", "TrainConfig", "flatten", "section_fields"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine", "inverse_sqrt")
PRECISIONS = ("fp32", "bf16", "fp16")
# Gradient clipping: the vocabulary of fixup.method.CLIPPINGS (norm | agc | none), and "auto": the method's own.
CLIPS = ("auto", *CLIPPINGS)
ACCOUNTANTS = ("rdp", "prv")  # Opacus's privacy accountants: Renyi DP (Mironov 2017), PRV (Gopi et al. 2021)

# Fields that may differ between a checkpoint and the run resuming it: they change how a run is
# watched or fed, never what it computes (dp_physical_batch regroups the sum of the clipped
# per-example gradients: float rounding only).
RESUMABLE_CHANGES = frozenset({"num_workers", "resume", "tensorboard", "checkpoint", "data_dir", "keep_checkpoints",
                               "dp_physical_batch"})


def check_types(config: Any) -> None:
    """Refuse field values whose type is not the field's (e.g. a hand-edited config.json with "lr": "0.1")."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, tp = getattr(config, f.name), hints[f.name]
        origin = typing.get_origin(tp) or tp
        if origin is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif origin is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif origin is tuple:
            ok = isinstance(value, tuple) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value)
        else:
            ok = isinstance(value, origin)
        if not ok:
            raise ValueError(f"{f.name} must be of type {getattr(tp, '__name__', tp)}, got {value!r}")


def flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict by section (``{"optimisation": {"lr": 0.1}}``) or flat (``{"lr": 0.1}``) as one flat dict.

    Unknown sections, fields in the wrong section and unknown fields are errors that list the valid ones.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a training config is a JSON object of sections or options, got {type(data).__name__}")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ValueError(f"config section {key!r} must be an object of options, got {value!r}")
            check_keys(SECTIONS[key], value, "option", f" in section {key!r}")
            flat.update(value)
        else:
            flat[key] = value
    check_keys(TrainConfig, flat, "training option")
    return flat


def check_keys(cls: type, data: Mapping[str, Any], what: str, where: str = "") -> None:
    """Refuse keys of ``data`` that are not fields of the dataclass ``cls``, listing the valid ones.

    ``what`` is the singular noun of a key ("training option"); ``where`` says where the keys came from.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        noun = what if len(unknown) == 1 else f"{what}s"
        raise ValueError(f"unknown {noun} {', '.join(unknown)}{where}; valid ones are {', '.join(sorted(names))}")


@dataclass
class ModelOptions:
    """What is trained: the task and the model built for it."""

    task: str = "images"  # task kind: "images" (classification); others add themselves to fixup.train.task.TASKS
    model: str = "resnet_cifar"  # registered model name (fixup.list_models())
    adapt: str = ""  # module:factory of a user's model: fixup.adapt-ed under norm fixup, else as built ("" = model)
    adapt_options: dict[str, Any] = field(default_factory=dict)  # fixup.adapt's options for --adapt: {"rescale": 2}
    depth: int = 0  # layers, for models that take a depth (0 = the builder's default)
    width: int = 0  # base width in channels, for models that take one (0 = the builder's default)
    norm: str = ""  # fixup | batchnorm | groupnorm | layernorm | dyt | none ("" = the method init names, else fixup)
    init: str = ""  # a method of fixup.METHODS (rezero, nf_resnet, ...) or an init of the norm ("" = its default)


@dataclass
class DataOptions:
    """Where examples come from and how many go into a step (every task)."""

    data_dir: str = ""  # local archive/folder of the data set (not needed for digits or the generated translation task)
    batch_size: int = 128  # examples per optimiser step, summed over all processes
    eval_batch_size: int = 500  # examples per evaluation batch, per process
    drop_last: bool = False  # drop each epoch's final incomplete training batch


@dataclass
class ImageOptions:
    """Image classification only: the data set, how images reach the model, image augmentation."""

    dataset: str = "digits"  # digits | cifar10 | cifar100 | svhn | folder
    image_size: int = 0  # pixels per side fed to the model (0 = as stored; folders: their images' size)
    resize: str = "interpolate"  # how images reach image_size: interpolate | pad
    channels: int = 0  # input channels fed to the model (0 = as stored; 1 <-> 3 converts)
    split_seed: int = 0  # seed of digits' fixed stratified train/test split
    test_fraction: float = 0.2  # fraction of digits held out for testing
    crop_padding: int = -1  # random-crop padding in pixels (-1 = 4 for CIFAR and folders, 0 for SVHN and digits)
    hflip: str = "auto"  # random horizontal flips: on | off | auto (on for CIFAR and folders)
    cutout: int = 0  # side of the Cutout square in pixels, 0 = off (DeVries & Taylor 2017 use 16 on CIFAR-10)
    mixup_alpha: float = 0.0  # Mixup's Beta(alpha, alpha), 0 = off (Fixup paper, section 4.2: 0.7 for Fixup)
    # Stochastic depth and the dropout before the classifier, the ResNets' (SkipInit's authors train with both;
    # docs/methods.md). Block i of N drops its residual branch per example with drop_path * i / N
    # (fixup.models.drop_path_rates); -1 takes the method's recipe (Method.drop_path: 0.1 for skipinit and the
    # NF-ResNets, else 0), resolved by fixup.train.recipe. Both off by default: the committed results train without.
    drop_path: float = 0.0  # stochastic depth: block i of N drops with drop_path*i/N (-1 = the method's, 0 = off)
    head_dropout: float = 0.0  # dropout on the pooled features before the classifier (ResNets), 0 = off
    num_workers: int = 0  # DataLoader worker processes decoding image folders (in-memory sets need none)


@dataclass
class OptimisationOptions:
    """The optimiser, its parameter groups and the learning-rate schedule."""

    optimizer: str = "sgd"  # sgd | adam | adamw
    lr: float = 0.1  # peak learning rate (per lr_reference_batch examples when that is set)
    lr_reference_batch: int = 0  # if > 0, the lr used is lr * batch_size / lr_reference_batch
    momentum: float = 0.9  # SGD momentum
    nesterov: bool = False  # Nesterov momentum (SGD)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam/AdamW moment decay rates
    eps: float = 1e-8  # Adam/AdamW denominator epsilon
    weight_decay: float = 5e-4  # L2 penalty (SGD, Adam) or decoupled decay (AdamW) of the weights group
    scalar_lr_mult: float = 0.1  # lr multiplier of Fixup's scalars (the authors' code: 0.1); see fixup.param_groups
    scalar_weight_decay: float = -1.0  # weight decay of the scalar group (-1 = same as weight_decay)
    gate_lr_mult: float = 1.0  # lr multiplier of SkipInit's/ReZero's gates (both papers: 1); see fixup.param_groups
    # Global-norm clipping at 1.0 by default: without normalisation a run at lr 0.1 can blow up after its loss has
    # fallen (docs/training.md, "Gradient clipping"); the studies and the translation recipes set grad_clip 0, the
    # protocol of their figures. agc: Brock et al. 2021, section 4.1 (fixup.adaptive_clip_grad_). auto: the
    # method's own recipe (Method.clip: agc for nf_resnet), else norm; fixup.train.recipe resolves it.
    clip: str = "auto"  # gradient clipping: auto (the method's) | norm (global, to grad_clip) | agc (unit-wise) | none
    grad_clip: float = 1.0  # clip the global gradient norm to this, 0 = off (agc: a Fixup model's zero-started)
    agc_clipping: float = 0.01  # clip agc: lambda, the largest ratio of a unit's gradient norm to its weight norm
    schedule: str = "step"  # constant | step | cosine | inverse_sqrt
    milestones: tuple[float, ...] = (0.5, 0.75)  # step schedule: fractions of training where lr is multiplied by gamma
    gamma: float = 0.1  # step schedule: the factor at each milestone
    warmup_steps: int = 0  # linear warm-up over this many optimiser steps (inverse_sqrt: its warm-up)
    # T-Fixup's `inverse_sqrt_nowarmup`, its IWSLT recipe at P = 4,000; 0 with a warm-up (Vaswani's form)
    decay_period: int = 0  # inverse_sqrt without warm-up: lr * sqrt(P / (P + step)) from the first step, P this
    epochs: int = 30  # passes over the training set
    max_updates: int = 0  # stop after this many optimiser steps, if earlier than epochs (0 = epochs decide)
    ema_decay: float = 0.0  # evaluate a moving average of the weights with this decay, with warm-up (0 = off)


@dataclass
class RegularisationOptions:
    """Regularisers every task has (the image-only ones, Mixup and Cutout, are in ImageOptions)."""

    dropout: float = 0.0  # dropout probability, passed to the model builder when > 0
    label_smoothing: float = 0.0  # probability mass spread uniformly over the classes


@dataclass
class PrivacyOptions:
    """Differentially private training (DP-SGD, Abadi et al. 2016) through Opacus: fixup.train.private."""

    dp: bool = False  # train with DP-SGD: Poisson-sampled batches, per-example clipping, Gaussian noise (needs opacus)
    target_epsilon: float = 0.0  # the epsilon spent by the end of training; the noise is solved from it (0 = unset)
    noise_multiplier: float = 0.0  # the noise's std per unit of max_grad_norm, used when target_epsilon is 0
    delta: float = 1e-5  # the delta of (epsilon, delta)-DP; keep it below 1 / training examples
    max_grad_norm: float = 1.0  # clip each example's gradient to this L2 norm (replaces the engine's clip under dp)
    accountant: str = "rdp"  # rdp (Renyi DP) | prv (privacy loss random variables, tighter, slower)
    dp_physical_batch: int = 0  # process each Poisson batch in chunks of at most this many examples (0 = whole)


@dataclass
class RunOptions:
    """How the run is carried out and kept: numerics, seed, device, checkpoints, logs, task-specific extras."""

    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast with a gradient scaler)
    max_loss: float = 0.0  # a training loss above this counts as divergence (0 = only non-finite losses)
    collapse_patience: int = 20  # steps with no live classifier input unit before the run ends collapsed (0 = off)
    seed: int = 0  # seed of initialisation, data order, augmentation and dropout
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda | cuda:N
    checkpoint_segments: int = 0  # activation checkpointing: recompute residual stages in this many segments (0 = off)
    sync_bn: bool = False  # convert BatchNorm to SyncBatchNorm under torchrun (BatchNorm baseline only)
    eval_every: int = 1  # evaluate on the test set every this many epochs (and after the last)
    checkpoint: bool = True  # write out_dir/checkpoint.pt after every epoch and on SIGINT/SIGTERM
    keep_checkpoints: int = 0  # also keep the model weights of the last N epochs (checkpoint_step{S}.pt), to average
    resume: bool = True  # continue from out_dir/checkpoint.pt when it exists
    tensorboard: bool = False  # also log scalars for TensorBoard in out_dir/tensorboard (needs tensorboard)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # task-specific options as a JSON object


# The sections, in the order config.json and `fixup train --help` show them.
SECTIONS: dict[str, type] = {"network": ModelOptions, "data": DataOptions, "images": ImageOptions,
                             "optimisation": OptimisationOptions, "regularisation": RegularisationOptions,
                             "privacy": PrivacyOptions, "run": RunOptions}


def section_fields(section: str) -> tuple[str, ...]:
    """The field names of one section of :data:`SECTIONS`."""
    return tuple(f.name for f in dataclasses.fields(SECTIONS[section]))


@dataclass
class TrainConfig(RunOptions, PrivacyOptions, RegularisationOptions, OptimisationOptions, ImageOptions, DataOptions,
                  ModelOptions):
    """Everything that decides what a training run computes (defaults: Fixup ResNet-20 on digits).

    The fields come in sections (:data:`SECTIONS`: network, data, images, optimisation, regularisation,
    privacy, run), each its own dataclass; a config reads flat (``config.lr``) and is written by section
    (:meth:`to_dict`, config.json). :meth:`from_dict` reads both layouts, so older flat files still load.
    """

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build a config from a dict, by section (config.json) or flat (older files); an unknown key is an error."""
        kwargs = flatten(data)
        for key in ("betas", "milestones"):
            if isinstance(kwargs.get(key), (list, tuple)):
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs).validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values by section (tuples become lists): ``{"model": {...}, "data": {...}, ...}``."""
        flat = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        return {name: {k: flat[k] for k in section_fields(name)} for name in SECTIONS}

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> TrainConfig:
        """Check every value the engine interprets; return ``self`` so calls can be chained.

        An empty ``norm`` is filled (here and on construction) from ``init`` (``init="rezero"`` -> ``norm="none"``;
        neither -> ``"fixup"``), so the rest of the code reads a concrete norm; a norm that contradicts the method
        ``init`` names (``norm="batchnorm", init="rezero"``) is an error that names the method's own norm.
        """
        check_types(self)
        self._resolve_method()
        floats = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), float)]
        for name in [*floats, "betas", "milestones"]:
            values = getattr(self, name)
            if not all(math.isfinite(v) for v in (values if isinstance(values, tuple) else (values,))):
                raise ValueError(f"{name} must be a finite number, got {values}")
        choices = {"clip": CLIPS, "optimizer": OPTIMIZERS, "schedule": SCHEDULES, "precision": PRECISIONS,
                   "hflip": ("on", "off", "auto"), "resize": ("interpolate", "pad"), "accountant": ACCOUNTANTS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported; choose one of {', '.join(allowed)}")
        positive = ("batch_size", "eval_batch_size", "epochs", "eval_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        nonneg = ("lr", "weight_decay", "grad_clip", "warmup_steps", "max_updates", "max_loss", "mixup_alpha",
                  "cutout", "num_workers", "lr_reference_batch", "momentum", "dropout", "depth", "width",
                  "keep_checkpoints", "checkpoint_segments", "collapse_patience")
        for name in nonneg:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("seed", "split_seed"):
            if not 0 <= getattr(self, name) < 2**32:
                raise ValueError(f"{name} must be a whole number in [0, 2**32), got {getattr(self, name)}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1) (0 = off; 0.9-0.99 for a few hundred steps, 0.999 for "
                             f"many thousand), got {self.ema_decay}")
        if self.gamma <= 0:
            raise ValueError(f"gamma must be > 0 (the step schedule multiplies the lr by it), got {self.gamma}")
        if self.agc_clipping <= 0:
            raise ValueError(f"agc_clipping must be > 0 (AGC's lambda; Brock et al. use 0.01-0.16), got "
                             f"{self.agc_clipping}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0 (Adam's denominator epsilon), got {self.eps}")
        if self.scalar_lr_mult < 0:
            raise ValueError(f"scalar_lr_mult must be >= 0, got {self.scalar_lr_mult}")
        if self.gate_lr_mult < 0:
            raise ValueError(f"gate_lr_mult must be >= 0, got {self.gate_lr_mult}")
        if self.scalar_weight_decay < 0 and self.scalar_weight_decay != -1:
            raise ValueError(f"scalar_weight_decay must be >= 0, or -1 for the same as weight_decay; got "
                             f"{self.scalar_weight_decay}")
        self._validate_regularisers()
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {self.test_fraction}")
        if self.image_size < 0:
            raise ValueError(f"image_size must be >= 0 pixels (0 = as stored), got {self.image_size}")
        if self.channels not in (0, 1, 3):
            raise ValueError(f"channels must be 0 (as stored), 1 or 3, got {self.channels}")
        if self.crop_padding < -1:
            raise ValueError(f"crop_padding must be >= 0 pixels, or -1 for the data set's default; got "
                             f"{self.crop_padding}")
        check_device_name(self.device)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing}")
        if self.nesterov and (self.optimizer != "sgd" or self.momentum <= 0):
            raise ValueError("nesterov=True needs optimizer='sgd' with momentum > 0")
        if any(not 0.0 < m < 1.0 for m in self.milestones) or list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"milestones must be increasing fractions of training in (0, 1), got {self.milestones}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.decay_period < 0:
            raise ValueError(f"decay_period must be >= 0 (inverse_sqrt without warm-up: lr * sqrt(P / (P + step))), "
                             f"got {self.decay_period}")
        if self.schedule == "inverse_sqrt" and (self.warmup_steps > 0) == (self.decay_period > 0):
            raise ValueError("schedule='inverse_sqrt' needs exactly one of warmup_steps > 0 (a linear warm-up to the "
                             "peak, then sqrt(warmup / step): Vaswani et al. (2017), section 5.3, e.g. "
                             "--warmup-steps 4000) or decay_period > 0 (no warm-up, sqrt(P / (P + step)) from the "
                             f"first step: T-Fixup's), got warmup_steps={self.warmup_steps}, "
                             f"decay_period={self.decay_period}")
        self._validate_privacy()
        return self

    def _validate_regularisers(self) -> None:
        """Dropout, stochastic depth and dropout before the classifier: probabilities, and only where they exist."""
        if self.dropout >= 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.drop_path != -1 and not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"drop_path must lie in [0, 1) (the last of N blocks drops with drop_path (N - 1) / N), "
                             f"or be -1 for the method's recipe (skipinit: 0.1); got {self.drop_path}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(f"head_dropout must lie in [0, 1), got {self.head_dropout}")
        if self.adapt and (self.drop_path or self.head_dropout):
            raise ValueError(f"drop_path={self.drop_path:g} and head_dropout={self.head_dropout:g} are built into the "
                             f"library's ResNets, not into --adapt {self.adapt}'s model; set both to 0, or train a "
                             "registered ResNet (--model resnet_cifar)")
        self._validate_adapt_options()  # options of what is built into --adapt's model, as the two above

    def _validate_adapt_options(self) -> None:
        """``adapt_options`` only where the engine adapts ``--adapt``'s model, each one an option of ``fixup.adapt``
        that applies under the method (the engine sets the method from ``init``/``norm``, the example input and,
        under dp, privacy itself)."""
        if not self.adapt_options:
            return
        from .._adapt._options import check_options

        method = resolve_method(self.norm or None, self.init or None)
        if not self.adapt or not (self.init or method.adapt):
            raise ValueError(f"adapt_options={self.adapt_options!r} apply to a model the engine adapts: give --adapt "
                             "module:factory with norm fixup or an --init that fixup.adapt applies (skipinit, rezero, "
                             "...); a registered model takes its options from --norm/--init")
        engine_set = sorted(set(self.adapt_options) & {"method", "private", "state_dict", "generator",
                                                       "leaf_modules", "example_input", "model"})
        if engine_set:
            raise ValueError(f"adapt_options {', '.join(engine_set)}: set by the engine, not an option here (the "
                             "method comes from --init/--norm; privacy from --dp)")
        options = dict(self.adapt_options)
        trunk, gate_biases, mode = options.pop("trunk", "lsuv"), options.pop("gate_biases", False), options.pop(
            "mode", None)
        for key in ("strict", "untie_weights"):
            if not isinstance(options.pop(key, True), bool):
                raise ValueError(f"adapt_options {key} must be true or false, got {self.adapt_options[key]!r}")
        try:
            check_options(method.name, trunk, gate_biases, mode, options)
        except ValueError as err:
            raise ValueError(f"adapt_options: {err}") from None

    def _validate_privacy(self) -> None:
        """The privacy options: a budget or a noise, and nothing that mixes examples or leaves them unaccounted."""
        given = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(PrivacyOptions)
                 if f.name != "dp" and getattr(self, f.name) != f.default]
        if not self.dp:
            if given:
                raise ValueError(f"{', '.join(given)} set without dp; add --dp (dp=True) to train privately, or drop "
                                 "the privacy options")
            return
        if self.target_epsilon < 0 or self.noise_multiplier < 0:
            raise ValueError(f"target_epsilon and noise_multiplier must be >= 0, got {self.target_epsilon} and "
                             f"{self.noise_multiplier}")
        if (self.target_epsilon > 0) == (self.noise_multiplier > 0):
            raise ValueError("dp=True needs exactly one of target_epsilon (e.g. --target-epsilon 8: the noise is "
                             "solved from it) or noise_multiplier (e.g. --noise-multiplier 1.0: epsilon follows); "
                             f"got target_epsilon={self.target_epsilon}, noise_multiplier={self.noise_multiplier}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must lie strictly between 0 and 1 (e.g. 1e-5), got {self.delta}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 (each example's gradient is clipped to it), got "
                             f"{self.max_grad_norm}")
        if self.dp_physical_batch < 0:
            raise ValueError(f"dp_physical_batch must be >= 0 (0 processes each Poisson batch whole; N, e.g. "
                             f"--dp-physical-batch 32, in chunks of at most N examples), got {self.dp_physical_batch}")
        refused = (
            (self.norm == "batchnorm",
             "norm='batchnorm' cannot train privately: BatchNorm mixes the examples of a batch, so per-example "
             "gradients are undefined. Train without it: --norm fixup (the default), --init skipinit, --init rezero, "
             "--init nf_resnet, or --norm groupnorm / layernorm"),
            (self.sync_bn, "sync_bn=True converts BatchNorm, which dp refuses; drop --sync-bn"),
            (resolve_method(self.norm or None, self.init or None).needs_data,
             f"init={self.init!r} initialises from a batch of training images, which the privacy accounting does not "
             "cover; choose a data-independent method (fixup, skipinit, rezero, nf_resnet)"),
            (self.mixup_alpha > 0,
             f"mixup_alpha={self.mixup_alpha} mixes the examples of a batch, so an example's gradient depends on "
             "others and clipping it bounds nothing; set --mixup-alpha 0 under dp"),
            (self.clip not in ("auto", "none"),  # a clipping of the engine's, which dp's replaces
             f"clip={self.clip!r}: under dp each example's gradient is clipped to max_grad_norm, which replaces the "
             "engine's clipping; leave --clip auto (or none) and set --max-grad-norm"),
            (self.precision != "fp32",
             f"precision={self.precision!r} is not supported under dp (fp16's loss scaling would scale what the "
             "per-example clipping bounds; bf16 is untested with Opacus); use --precision fp32"),
            (self.checkpoint_segments > 0,
             "checkpoint_segments recomputes forwards during backward, which runs Opacus's per-example hooks twice; "
             "set --checkpoint-segments 0 under dp"),
            (self.task != "images", f"task={self.task!r}: private training is implemented for image classification "
                                    "only"),
        )
        for bad, reason in refused:
            if bad:
                raise ValueError(reason)

    def __post_init__(self) -> None:
        with contextlib.suppress(ValueError, TypeError):  # an init that names no method: validate() says so
            self._resolve_method()

    def _resolve_method(self) -> None:
        """Fill an empty ``norm`` from the method ``init`` names; a contradiction is a ValueError naming the fix."""
        method = resolve_method(self.norm or None, self.init or None)
        if not self.norm:
            self.norm, self.init = method.norm, method.init if self.init else ""

    @property
    def effective_lr(self) -> float:
        """The peak learning rate after scaling with the batch size (when lr_reference_batch is set)."""
        if self.lr_reference_batch:
            return self.lr * self.batch_size / self.lr_reference_batch
        return self.lr
