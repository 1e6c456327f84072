"""Train a translation model with the shared engine and score it: the function behind ``fixup translate``.

:func:`train_and_evaluate` trains through :func:`fixup.train.fit` (resumable, in ``out_dir``), then
decodes the test split with beam search (optionally from the average of the last saved checkpoints)
and scores it with sacrebleu, next to two reference points: copying the source, and, on the
generated task, a word-for-word dictionary translation.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import write_json, write_text
from .._signals import Interrupted
from ..data.synthetic_translation import make_lexicon, seen_word_oracle, word_for_word
from .averaging import average_checkpoints
from .evaluate import DecodeConfig, corpus_bleu, evaluate_bleu
from .task import TranslationTask

if TYPE_CHECKING:
    from ..train.config import TrainConfig

__all__ = ["baselines", "train_and_evaluate"]


def baselines(task: TranslationTask, split: str = "test") -> dict[str, float]:
    """BLEU of copying the source and, on the generated task, of a word-for-word dictionary, and the task's
    ceiling: the BLEU of a learner that translates every word of the training targets and no other
    (:func:`~fixup.data.synthetic_translation.seen_word_oracle`), with the share of reference words it misses."""
    refs, sources = task.data.references[split], task.data.sources[split]
    out = {"copy_bleu": corpus_bleu(sources, refs).bleu}
    if not task.config.data_dir:
        lex = make_lexicon(task.options.synthetic_config())
        out["word_for_word_bleu"] = corpus_bleu([word_for_word(s, lex) for s in sources], refs).bleu
        train = (task.data_dir / "train.tgt").read_text(encoding="utf-8").splitlines()
        oracle, unseen = seen_word_oracle(train, refs)
        out["ceiling_bleu"], out["unseen_target_words"] = corpus_bleu(oracle, refs).bleu, unseen
    return out


def train_and_evaluate(config: TrainConfig, out_dir: str | Path, decode: DecodeConfig | None = None, *,
                       average_last: int = 0, split: str = "test", progress: bool = True) -> dict[str, Any]:
    """Train (or resume) in ``out_dir``, then translate ``split`` and return BLEU with its context.

    ``average_last`` > 1 averages the model weights of the last that many checkpoints the engine kept
    (``config.keep_checkpoints``) before decoding, as the paper's fairseq recipes do.
    """
    from ..train import fit

    decode = decode or DecodeConfig()
    out_dir = Path(out_dir)
    task = TranslationTask(config, work_dir=out_dir)
    result = fit(config, out_dir=out_dir, task=task, progress=progress)
    if result.stopped_by:  # SIGINT/SIGTERM: stop here, with the checkpoint of the last step kept; no decoding
        raise Interrupted.from_name(result.stopped_by, kept=f"stopped after step {result.outcome.step}; checkpoint "
                                                            f"kept in {out_dir / 'checkpoint.pt'}")
    model = result.model
    averaged: list[str] = []
    if average_last > 1:
        kept = sorted(out_dir.glob("checkpoint_step*.pt"), key=lambda p: int(p.stem.removeprefix("checkpoint_step")))
        if len(kept) < average_last:
            raise ValueError(f"average_last={average_last} but {out_dir} holds {len(kept)} kept checkpoint(s); "
                             f"train with keep_checkpoints >= {average_last}")
        averaged = [str(p) for p in kept[-average_last:]]
        model.load_state_dict(average_checkpoints(averaged))
    device = next(model.parameters()).device
    bleu, hyps = evaluate_bleu(model, task.data, split, decode, device)
    write_text(out_dir / f"{split}.hyp", "".join(h + "\n" for h in hyps))
    summary = {"model": config.model, "norm": config.norm, "outcome": result.outcome.to_dict(),
               "updates": result.outcome.step, "split": split, "bleu": bleu.to_dict(), "decode": asdict(decode),
               "averaged_checkpoints": averaged, **baselines(task, split), "final": result.final,
               "history": result.history,
               "parameters": sum(p.numel() for p in model.parameters()), "task": task.describe()}
    write_json(out_dir / "translation.json", summary)
    return summary


def load_for_decoding(out_dir: str | Path) -> tuple[torch.nn.Module, TranslationTask]:
    """The model of a finished run folder and its task (data and vocabulary as saved with the run)."""
    from ..train.checkpoint import load_checkpoint
    from ..train.config import TrainConfig

    out_dir = Path(out_dir)
    state = load_checkpoint(out_dir / "checkpoint.pt", map_location="cpu")
    config = TrainConfig.from_dict(state["config"])
    task = TranslationTask(config, work_dir=out_dir)
    model = task.build_model(config)
    model.load_state_dict(state["model"])
    return model.eval(), task
