"""``fixup translate``: train a Transformer on parallel text with the shared engine and report test BLEU.

Every ``fixup train`` option is accepted (``--norm layernorm``, ``--max-updates``, ``--lr``,
``--warmup-steps``, ``--dropout``, ``--label-smoothing``, ``--grad-clip``, ...), starting from the
paper's translation recipe instead of the image defaults; ``--data-dir`` names a folder of
``{train,valid,test}.{src,tgt}`` files (``--src-suffix de --tgt-suffix en`` for other names), without
it the generated task is used. Decoding: ``--beam``, ``--lenpen``, ``--average-last``.

Defaults differ from ``fixup train`` (whose defaults the option list below shows): they come from
``--recipe``: ``tiny`` (default; transformer_tiny on a CPU: Adam (0.9, 0.98) with decoupled weight decay
1e-4 (adamw, as fairseq's Adam), lr 3e-3, inverse_sqrt after 100 warm-up steps, 600 updates of 2048 tokens,
label smoothing 0.1, dropout 0.1, Fixup's scalars at the full rate) or ``iwslt`` (the paper's:
transformer_iwslt_de_en, lr 5e-4, 4000 warm-up steps, 200000 updates, dropout 0.3).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]

# Shortcuts for the most used TranslationOptions (everything else goes through --extra JSON).
_OPTION_FLAGS = {"max_tokens": int, "vocab_size": int, "src_suffix": str, "tgt_suffix": str,
                 "synthetic_train": int, "synthetic_seed": int, "synthetic_task": str, "bleu_limit": int}


def _config(args: argparse.Namespace):
    import dataclasses

    from ..train.config import TrainConfig
    from .task import translation_config

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    changes: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names}
    for key in ("betas", "milestones"):
        if key in changes:
            changes[key] = tuple(changes[key])
    extra = dict(changes.pop("extra", {}))
    for key in _OPTION_FLAGS:
        if getattr(args, f"tr_{key}", None) is not None:
            extra[key] = getattr(args, f"tr_{key}")
    if args.pre_norm:
        extra["pre_norm"] = True
    if args.joint_vocab:
        extra["joint_vocab"] = True
    if args.share_embeddings:
        extra["share_embeddings"] = extra["joint_vocab"] = True
    return translation_config(args.recipe, **changes, extra=extra)


def _translate(args: argparse.Namespace) -> int:
    from .._checks import check_numbers
    from .._devices import resolve_device
    from .._io import write_json
    from .evaluate import DecodeConfig
    from .run import train_and_evaluate

    check_numbers(args, positive=("beam",), nonneg=("average_last", "lenpen"))
    for key in ("max_tokens", "vocab_size", "synthetic_train", "bleu_limit", "synthetic_seed"):
        value, least = getattr(args, f"tr_{key}"), 1 if key in ("max_tokens", "vocab_size", "synthetic_train") else 0
        if value is not None and value < least:
            raise ValueError(f"--{key.replace('_', '-')} must be >= {least}, got {value}")
    config = _config(args)
    resolve_device(config.device)  # before the vocabulary and the generated data are written
    out_dir = args.out_dir or f"runs/translate-{config.model}-{config.norm}"
    decode = DecodeConfig(beam=args.beam, length_penalty=args.lenpen)
    summary = train_and_evaluate(config, out_dir, decode, average_last=args.average_last,
                                 progress=not args.no_progress)
    bleu, outcome = summary["bleu"], summary["outcome"]
    print(f"{config.model} norm={config.norm}: {outcome['status']} after {summary['updates']} updates")
    print(f"{summary['split']} BLEU {bleu['bleu']:.2f} (beam {args.beam}, lenpen {args.lenpen:g}"
          + (f", average of {len(summary['averaged_checkpoints'])} checkpoints" if summary["averaged_checkpoints"]
             else "") + f"; {bleu['signature']})")
    base = f"copy-the-source BLEU {summary['copy_bleu']:.2f}"
    if "word_for_word_bleu" in summary:
        base += f", word-for-word dictionary BLEU {summary['word_for_word_bleu']:.2f}"
    if "ceiling_bleu" in summary:
        base += (f"; the task's ceiling {summary['ceiling_bleu']:.2f} (every word seen in training translated, "
                 f"{100 * summary['unseen_target_words']:.1f}% of the reference's words never seen)")
    print(base)
    print(f"run folder: {out_dir} (hypotheses in {summary['split']}.hyp, summary in translation.json)")
    if args.json:
        write_json(args.json, summary)
    return 0 if outcome["status"] == "completed" else 3


def register(sub: argparse._SubParsersAction) -> None:
    from ..train.cli import add_config_options, field_comments
    from .task import TranslationOptions, translation_config

    p = sub.add_parser("translate", help="train a Transformer on parallel text and report BLEU (docs/translation.md)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=None, help="run folder (vocabulary, data, checkpoints, hypotheses); resumed "
                                                   "when it holds a checkpoint (default runs/translate-MODEL-NORM)")
    p.add_argument("--recipe", default="tiny", choices=("tiny", "iwslt"),
                   help="starting point of the training options (see above)")
    p.add_argument("--beam", type=int, default=4, help="beam size for the test translation (1 = greedy)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty: score / length ** lenpen")
    p.add_argument("--average-last", type=int, default=0, metavar="N",
                   help="decode with the average of the last N kept checkpoints (needs --keep-checkpoints N)")
    p.add_argument("--pre-norm", action="store_true",
                   help="LayerNorm (or DyT) before each branch (--norm layernorm or --init dyt)")
    p.add_argument("--joint-vocab", action="store_true", help="one sentencepiece vocabulary for both languages")
    p.add_argument("--share-embeddings", action="store_true", help="one embedding table (implies --joint-vocab)")
    recipe = translation_config("tiny")
    options = TranslationOptions.from_extra(dict(recipe.extra))
    comments = field_comments(TranslationOptions)
    group = p.add_argument_group("translation options", "shortcuts for TranslationOptions fields (the others go "
                                                        "in --extra JSON); defaults of the tiny recipe")
    for key, tp in _OPTION_FLAGS.items():
        group.add_argument("--" + key.replace("_", "-"), dest=f"tr_{key}", type=tp, default=None,
                           metavar=tp.__name__.upper(),
                           help=f"{comments[key]} (default: {getattr(options, key)!r})".replace("%", "%%"))
    p.add_argument("--json", default=None, metavar="PATH", help="also write the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_options(p, defaults=recipe, skip=("images", "privacy"))
    p.set_defaults(func=_translate)
