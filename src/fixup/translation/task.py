"""The translation task for the training engine (:func:`fixup.train.fit`): data, model and loss.

The engine owns the loop, the optimiser (Adam with betas (0.9, 0.98) for translation), the inverse
square-root schedule with warm-up, gradient clipping, weight decay, checkpoints and resume; this task
owns the parallel text, the Transformer and the label-smoothed cross-entropy. Options that only
translation needs live in ``config.extra`` (see :class:`TranslationOptions`); an unknown key is an
error. Without ``data_dir`` the generated task (:mod:`fixup.data.synthetic_translation`) is written to
``work_dir/data`` and read back from there like any other data folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.synthetic_translation import (
    SYNTHETIC_TASKS,
    SyntheticTranslationConfig,
    synthetic_task,
    write_synthetic_task,
)
from ..data.text import PAD, ParallelData, collate, copy_vocabulary, load_parallel_data, token_batches
from ..models import create_model
from ..train.config import check_keys
from .evaluate import DecodeConfig, corpus_bleu, translate_pairs

if TYPE_CHECKING:
    from ..train.config import TrainConfig
    from ..train.task import Shard

__all__ = ["RECIPES", "TranslationOptions", "TranslationTask", "translation_config"]

# Starting points of `translation_config`. "iwslt": the paper's recipe (fairseq IWSLT'14 De-En, Fixup
# section 5): Adam (0.9, 0.98), inverse square-root schedule after 4000 warm-up steps, peak rate 5e-4,
# label smoothing 0.1, weight decay 1e-4, dropout 0.3 (the paper picks 0.3-0.6), 200,000 updates.
# fairseq's Adam decays decoupled from the gradient (Loshchilov & Hutter's AdamW) and decays every parameter,
# Fixup's scalars included: "adamw" here, the scalars' decay the weights' (fixup.param_groups' default).
# The scalars learn at the full rate, as in the authors' fairseq recipe: 0.1x (the authors' image scripts, and
# fixup.param_groups' default) measured no better on the tiny recipe, n=5 a side (docs/translation.md).
# "tiny": the same optimiser, scaled to transformer_tiny on the generated task on a 2-core CPU
# (measured in docs/translation.md): 600 updates of at most 2048 tokens, 100 warm-up steps, rate 3e-3.
SCALAR_LR_MULT = 1.0
_COMMON = {"task": "translation", "norm": "fixup", "optimizer": "adamw", "betas": (0.9, 0.98),
           "schedule": "inverse_sqrt", "label_smoothing": 0.1, "weight_decay": 1e-4, "epochs": 100000,
           "grad_clip": 0.0, "scalar_lr_mult": SCALAR_LR_MULT}
RECIPES: dict[str, dict[str, Any]] = {
    "iwslt": {**_COMMON, "model": "transformer_iwslt_de_en", "lr": 5e-4, "warmup_steps": 4000, "dropout": 0.3,
              "max_updates": 200000},
    "tiny": {**_COMMON, "model": "transformer_tiny", "lr": 3e-3, "warmup_steps": 100, "dropout": 0.1,
             "max_updates": 600, "extra": {"max_tokens": 2048}},
}


@dataclass
class TranslationOptions:
    """Translation-only options, read from ``TrainConfig.extra``."""

    work_dir: str = "runs/translation"  # where the vocabulary (and the generated data) are written
    src_suffix: str = "src"  # file suffix of the source side ({split}.{src_suffix})
    tgt_suffix: str = "tgt"  # file suffix of the target side ({split}.{tgt_suffix})
    vocab_size: int = 1000  # sentencepiece vocabulary size per language (or joint)
    joint_vocab: bool = False  # one vocabulary for both languages (needed for share_embeddings)
    spm_model: str = "bpe"  # sentencepiece model type: bpe | unigram | word | char
    max_tokens: int = 4096  # padded tokens per training batch and per process (fairseq's --max-tokens)
    max_len: int = 128  # training pairs longer than this many subword tokens are dropped
    share_embeddings: bool = False  # one embedding table for both languages (requires joint_vocab)
    pre_norm: bool = False  # LayerNorm (or DyT) before each branch (norm "layernorm" or "dyt")
    attention_dropout: float = 0.0  # dropout on the attention weights
    activation_dropout: float = 0.0  # dropout after the feed-forward activation
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # other TransformerConfig overrides
    bleu_limit: int = 500  # valid sentences translated (greedy) for valid_bleu at each evaluation; 0 = off
    # updates per engine epoch, so that the engine evaluates (valid NLL, valid_bleu) and checkpoints every this many
    # updates: learning curves; 0 = one pass over the training data. The batches come in the same order either way.
    eval_updates: int = 0
    synthetic_seed: int = 0  # the generated task's seed (when data_dir is empty)
    synthetic_train: int = 30000  # its training pairs
    synthetic_eval: int = 1000  # its valid and its test pairs (each)
    # the generated task's target word order: "verb-final" main clauses and adjectives "before" the noun make a
    # shifted task with the same vocabularies and source sentences (fixup.data.synthetic_translation)
    synthetic_main_order: str = "verb-second"
    synthetic_adjective_order: str = "after"
    # the sentencepiece models of another run (its OUT/vocab folder), copied into this run's instead of learning
    # new ones: fine-tuning a trained model needs the vocabulary it was trained with
    vocab_dir: str = ""
    # a model written by fixup.save_converted (a LayerNorm Transformer of the same configuration, converted without
    # normalisation), fine-tuned from its weights instead of a new model; --norm and --init stay at their defaults
    converted: str = ""
    synthetic_task: str = "quick"  # which generated task: quick, or hard (docs/translation.md, "The hard task")

    def __post_init__(self) -> None:
        if self.synthetic_task not in SYNTHETIC_TASKS:
            raise ValueError(f"synthetic_task must be one of {', '.join(SYNTHETIC_TASKS)}, got "
                             f"{self.synthetic_task!r}")

    def synthetic_config(self) -> SyntheticTranslationConfig:
        """The generated task these options name."""
        return synthetic_task(self.synthetic_task, seed=self.synthetic_seed, train=self.synthetic_train,
                              valid=self.synthetic_eval, test=self.synthetic_eval, main_order=self.synthetic_main_order,
                              adjective_order=self.synthetic_adjective_order)

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> TranslationOptions:
        check_keys(cls, extra, "translation option", " in --extra")
        return cls(**extra)


def translation_config(recipe: str = "iwslt", **changes: Any) -> TrainConfig:
    """A :class:`TrainConfig` from one of :data:`RECIPES` (the paper's ``"iwslt"`` by default);
    ``changes`` override any field (``extra`` is merged key by key)."""
    from ..train.config import TrainConfig
    from ..train.recipe import recipe_defaults

    if recipe not in RECIPES:
        raise ValueError(f"unknown translation recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    base = recipe_defaults(RECIPES[recipe], changes)  # the method's recipe (t_fixup: no warm-up) unless given
    extra = {**base.pop("extra", {}), **changes.pop("extra", {})}
    return TrainConfig(**{**base, **changes, "extra": extra}).validate()


class TranslationTask:
    """Parallel text + Transformer + label-smoothed cross-entropy, for :func:`fixup.train.fit`."""

    def __init__(self, config: TrainConfig, work_dir: str | Path | None = None) -> None:
        self.config = config
        self.options = TranslationOptions.from_extra(dict(config.extra))
        self.work_dir = Path(work_dir if work_dir is not None else self.options.work_dir)
        o = self.options
        if config.data_dir:
            self.data_dir = Path(config.data_dir)
        else:
            self.data_dir = write_synthetic_task(self.work_dir / "data", o.synthetic_config())
        if o.vocab_dir:
            copy_vocabulary(o.vocab_dir, self.work_dir / "vocab", o.joint_vocab)
        self.data: ParallelData = load_parallel_data(
            self.data_dir, self.work_dir / "vocab", src_suffix=o.src_suffix, tgt_suffix=o.tgt_suffix,
            vocab_size=o.vocab_size, joint_vocab=o.joint_vocab, model_type=o.spm_model, max_len=o.max_len)
        self._train_count = len(token_batches(self.data.pairs["train"], o.max_tokens))
        if o.eval_updates < 0:
            raise ValueError(f"eval_updates must be >= 0 (0: evaluate after each pass over the data), got "
                             f"{o.eval_updates}")

    # -- the Task protocol --------------------------------------------------------------------------
    def build_model(self, config: TrainConfig) -> nn.Module:
        if self.options.converted:
            return self._converted_model(config)
        return self._registered_model(config, config.norm)

    def _registered_model(self, config: TrainConfig, norm: str) -> nn.Module:
        o = self.options
        kwargs: dict[str, Any] = {"norm": norm, "src_vocab": len(self.data.src_vocab),
                                  "tgt_vocab": len(self.data.tgt_vocab), "pad_id": PAD, "dropout": config.dropout,
                                  "share_embeddings": o.share_embeddings, "pre_norm": o.pre_norm,
                                  "attention_dropout": o.attention_dropout,
                                  "activation_dropout": o.activation_dropout, **o.model}
        if config.init:
            kwargs["init"] = config.init
        if config.depth:
            kwargs["encoder_layers"] = kwargs["decoder_layers"] = config.depth
        if config.width:
            kwargs["d_model"] = config.width
        return create_model(config.model, **kwargs)

    def _converted_model(self, config: TrainConfig) -> nn.Module:
        """The converted model saved at ``options.converted``, to fine-tune as saved: :func:`fixup.load_converted`
        replays the conversion on the registered ``--model`` built with LayerNorm (``pre_norm`` and the model
        overrides as for training it) and loads the file's weights (``weights_only=True``); nothing is
        re-initialised, so the first step starts from the converted, trained function."""
        from .._convert import load_converted

        path = self.options.converted
        if config.norm not in ("fixup", "none") or config.init:
            raise ValueError(f'extra "converted" fine-tunes a converted model as saved, without normalisation; '
                             f"norm={config.norm!r}, init={config.init!r} would build another model: leave --norm "
                             "and --init at their defaults (or --norm none)")
        if not Path(path).is_file():
            raise ValueError(f'extra "converted": no file {path} (write one with fixup.save_converted)')
        model, _ = load_converted(path, self._registered_model(config, "layernorm"))
        return model.train()  # convert takes an eval-mode model and its copy keeps that mode

    def steps_per_epoch(self, shard: Shard) -> int:
        return self.options.eval_updates or self._steps_per_pass(shard)

    def _steps_per_pass(self, shard: Shard) -> int:
        return self._train_count // shard.world_size

    def _shard(self, batches: list[list[int]], shard: Shard) -> list[list[int]]:
        per = len(batches) // shard.world_size
        return batches[shard.rank::shard.world_size][:per]

    def _pass(self, index: int, shard: Shard) -> list[list[int]]:
        """This process's batches (pair indices) of pass ``index`` over the training data, shuffled by (seed, pass)."""
        from ..train.task import seeded_generator

        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=seeded_generator(self.config.seed, index)))
        return self._shard(token_batches(self.data.pairs["train"], self.options.max_tokens, shuffle=True, seed=seed),
                           shard)

    def _epoch_batches(self, epoch: int, shard: Shard) -> Iterator[list[int]]:
        k = self.options.eval_updates
        if not k:
            yield from self._pass(epoch, shard)
            return
        per, cached = self._steps_per_pass(shard), (-1, [])
        for position in range(epoch * k, (epoch + 1) * k):  # the same sequence of passes, cut every k updates
            index, i = divmod(position, per)
            if cached[0] != index:
                cached = (index, self._pass(index, shard))
            yield cached[1][i]

    def train_batches(self, epoch: int, shard: Shard) -> Iterator[dict[str, Tensor]]:
        pairs = self.data.pairs["train"]
        for index in self._epoch_batches(epoch, shard):
            b = collate(pairs, index)
            yield {"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out}

    def _sums(self, model: nn.Module, batch: dict[str, Tensor], smoothing: float) -> tuple[Tensor, dict]:
        logits = model(batch["src"], batch["tgt_in"]).float()
        flat, target = logits.view(-1, logits.shape[-1]), batch["tgt_out"].reshape(-1)
        loss = F.cross_entropy(flat, target, ignore_index=PAD, label_smoothing=smoothing, reduction="sum")
        with torch.no_grad():
            real = target.ne(PAD)
            nll = F.cross_entropy(flat, target, ignore_index=PAD, reduction="sum")
            correct = (flat.argmax(-1).eq(target) & real).sum()
        return loss, {"loss": loss.detach(), "nll": nll, "acc": correct.float(), "n": real.sum().float()}

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Label-smoothed cross-entropy per target token (Szegedy et al. 2016; 0.1 in the paper's recipe)."""
        loss, stats = self._sums(model, batch, self.config.label_smoothing)
        return loss / stats["n"].clamp(min=1), stats

    def evaluate(self, model: nn.Module, shard: Shard) -> dict[str, Tensor]:
        """Sums over the valid split (the engine reports them as ``test_*``: loss, nll, token accuracy)."""
        pairs = self.data.pairs["valid"]
        device = next(model.parameters()).device
        total: dict[str, Tensor] = {}
        for index in token_batches(pairs, self.options.max_tokens)[shard.rank::shard.world_size]:
            b = collate(pairs, index).to(device)
            _, stats = self._sums(model, {"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out},
                                  self.config.label_smoothing)
            total = {k: total.get(k, 0) + v for k, v in stats.items()}
        return total

    def report(self, model: nn.Module) -> dict[str, float]:
        """Greedy BLEU on the first ``bleu_limit`` valid sentences (a cheap progress signal)."""
        if not self.options.bleu_limit:
            return {}
        n = self.options.bleu_limit
        device = next(model.parameters()).device
        hyps = translate_pairs(model, self.data.pairs["valid"][:n], self.data.tgt_vocab, DecodeConfig(beam=1),
                               device)
        return {"valid_bleu": corpus_bleu(hyps, self.data.references["valid"][:n]).bleu}

    def first_batch(self) -> tuple[Tensor, Tensor]:
        b = collate(self.data.pairs["train"], token_batches(self.data.pairs["train"], self.options.max_tokens)[0])
        return b.src, b.tgt_in

    def describe(self) -> dict[str, Any]:
        d = self.data
        return {"task": "translation", "data_dir": str(self.data_dir), "work_dir": str(self.work_dir),
                "pairs": {k: len(v) for k, v in d.pairs.items()}, "filtered_train_pairs": d.filtered,
                "src_vocab": len(d.src_vocab), "tgt_vocab": len(d.tgt_vocab), "joint_vocab": d.joint,
                "train_batches": self._train_count, "options": dataclasses.asdict(self.options)}
